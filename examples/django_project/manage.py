#!/usr/bin/env python
"""The project of docs/django.rst, complete: every file the guide shows, as it shows it.

Needs Django (the ``web`` extra). Run it from the repository root with::

    cd examples/django_project && python manage.py migrate && python manage.py runserver --noreload 127.0.0.1:8000

then open http://127.0.0.1:8000/ and press Run: the run's page shows its
calls as they happen, and Approve / Deny for the call that waits for a
person. ``POST /run`` runs a program and answers with its result. The
database is ``db.sqlite3`` here (``MYSITE_DB`` names another file).
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
