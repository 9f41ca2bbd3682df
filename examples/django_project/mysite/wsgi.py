"""For a WSGI server: ``gunicorn -k gthread --threads 16 mysite.wsgi`` (in this folder)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = get_wsgi_application()
