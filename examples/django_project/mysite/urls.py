"""The site's URLs: the app's."""

from django.urls import include, path

urlpatterns = [path("", include("myapp.urls"))]
