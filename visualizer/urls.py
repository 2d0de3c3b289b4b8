from django.urls import path

from visualizer import views

urlpatterns = [
    path("", views.chat, name="chat"),
    path("conversations/", views.conversation_list, name="conversation-list"),
    path("conversations/<int:pk>/", views.conversation_detail, name="conversation-detail"),
    path("watch/", views.watch, name="watch"),
]
