"""ASGI entry point, in the Channels tutorial's order: Django first, then the protocol router. Sockets pass the
allowed-hosts check, then a same-origin check on scheme, host and port (`webapp.origin`). API requests that carry a
key skip the page's middleware (`webapp.keyed_api`)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from visualizer.routing import websocket_urlpatterns  # noqa: E402
from webapp.keyed_api import KeyedApiHandler, KeyedApiRouter  # noqa: E402
from webapp.origin import SameOriginValidator  # noqa: E402
from webapp.worker.inprocess import StartWorkerMiddleware  # noqa: E402

application = StartWorkerMiddleware(
    ProtocolTypeRouter(
        {
            "http": KeyedApiRouter(KeyedApiHandler(), ASGIStaticFilesHandler(django_asgi_app)),
            "websocket": AllowedHostsOriginValidator(
                SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
            ),
        }
    )
)
