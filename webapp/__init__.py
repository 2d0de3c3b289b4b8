"""The Django project: settings, ASGI routing and the gateway in front of the engine."""
