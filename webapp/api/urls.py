from django.urls import path

from webapp.api import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("messages", views.messages, name="messages"),
    path("messages/count_tokens", views.count_tokens, name="messages-count-tokens"),
    path("responses", views.responses, name="responses"),
    path("responses/<str:response_id>", views.stored_response, name="response"),
    path("models", views.models, name="models"),
    path("models/<path:model_id>", views.model, name="model"),
    path("tokenize", views.tokenize, name="tokenize"),
    path("detokenize", views.detokenize, name="detokenize"),
    path("openapi.json", views.openapi, name="openapi"),
]
