from django.apps import AppConfig


class VisualizerConfig(AppConfig):
    name = "visualizer"
    verbose_name = "Pipeline visualizer"

    def ready(self) -> None:
        from webapp.gateway.lifecycle import observe
        from webapp.gateway.watch import WatchObserver

        observe(WatchObserver())  # the staff watch page shows every gateway turn
