from django.urls import path

from webapp.benchmark import views

urlpatterns = [
    path("", views.page, name="bench"),
    path("results/", views.result_list, name="bench-results"),
    path("results/new", views.save, name="bench-save"),
    path("state", views.scheduler_state, name="bench-state"),
    path("openapi.json", views.openapi, name="bench-openapi"),
    path("compare", views.compare, name="bench-compare"),
    path("r/<str:slug>/", views.permalink, name="bench-result"),
    path("r/<str:slug>.json", views.export_json, name="bench-json"),
    path("r/<str:slug>.csv", views.export_csv, name="bench-csv"),
]
