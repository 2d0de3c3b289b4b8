from django.urls import path

from visualizer.consumers import PipelineConsumer, WatchConsumer

websocket_urlpatterns = [
    path("ws/pipeline/", PipelineConsumer.as_asgi()),
    path("ws/watch/", WatchConsumer.as_asgi()),
]
