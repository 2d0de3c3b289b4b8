from django.urls import path

from visualizer import views

urlpatterns = [
    path("", views.chat, name="chat"),
    path("conversations/", views.conversation_list, name="conversation-list"),
    path("conversations/<int:pk>/", views.conversation_detail, name="conversation-detail"),
    path("conversations/<int:pk>/current", views.conversation_current, name="conversation-current"),
    path("conversations/<int:pk>/messages/<int:message_id>/", views.conversation_message, name="conversation-message"),
    path("watch/", views.watch, name="watch"),
    path("compare/", views.compare, name="compare"),
]
