from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "webapp.keys"
    label = "keys"
    verbose_name = "API keys"
