from django.apps import AppConfig


class VisualizerConfig(AppConfig):
    name = "visualizer"
    verbose_name = "Pipeline visualizer"

    def ready(self) -> None:
        from visualizer.watch import WatchObserver
        from webapp.gateway.lifecycle import observe

        observe(WatchObserver())  # the staff watch page shows every gateway turn
