from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "webapp.metrics"
    label = "metrics"
    verbose_name = "Metrics"

    def ready(self) -> None:
        from webapp.gateway.lifecycle import observe
        from webapp.metrics.observer import GatewayMetrics

        observe(GatewayMetrics())
