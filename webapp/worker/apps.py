from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "webapp.worker"
    label = "worker"
    verbose_name = "Inference worker"
