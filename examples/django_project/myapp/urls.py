# myapp/urls.py
from django.urls import path

from . import live, views

urlpatterns = [
    path("run", views.run),
    path("", live.form),
    path("runs", live.start),
    path("runs/<str:run_id>", live.page),
    path("runs/<str:run_id>/events", live.events),
    path("runs/<str:run_id>/agui", live.agui_events),
    path("runs/<str:run_id>/decisions", live.decide),
]
