from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "webapp.usage"
    label = "usage"
    verbose_name = "Usage"
