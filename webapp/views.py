"""Pages of the site. The chat page and the pipeline arrive with the visualizer; this is the front door."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")
