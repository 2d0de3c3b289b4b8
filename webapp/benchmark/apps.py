from django.apps import AppConfig


class BenchmarkConfig(AppConfig):
    name = "webapp.benchmark"
    label = "benchmark"
    verbose_name = "Latency benchmark"
