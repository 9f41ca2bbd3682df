"""The app of docs/django.rst: a run_code view, its tools, and a live page with approvals."""
