from django.contrib import admin
from django.urls import include, path

from webapp import views
from webapp.metrics.views import metrics_view

urlpatterns = [
    path("health", views.health, name="health"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("v1/", include("webapp.api.urls")),
    path("bench/", include("webapp.benchmark.urls")),
    path("", include("visualizer.urls")),
]

handler404 = "webapp.views.not_found"
handler500 = "webapp.views.server_error"
