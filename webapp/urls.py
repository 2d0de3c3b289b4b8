from django.contrib import admin
from django.urls import include, path

from webapp import views

urlpatterns = [
    path("health", views.health, name="health"),
    path("admin/", admin.site.urls),
    path("v1/", include("webapp.api.urls")),
    path("", include("visualizer.urls")),
]
