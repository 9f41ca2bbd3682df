"""Request 2 of the example, served by a process of its own: an operator approves call SEQ of TOKEN.

Run it from the repository root, with the server's ``NOUS_APPROVAL_STORE``::

    NOUS_APPROVAL_STORE=/tmp/approvals.db python examples/django_approvals/approve.py TOKEN SEQ
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import app  # noqa: E402,F401  (configures Django)
import django  # noqa: E402
from django.test import Client  # noqa: E402

django.setup()  # no-op when app configured Django; needed when DJANGO_SETTINGS_MODULE=app is set

if __name__ == "__main__":
    token, seq = sys.argv[1], sys.argv[2]
    response = Client().post(
        f"/approvals/{token}/{seq}",
        json.dumps({"approved": True, "reason": "checked"}),
        content_type="application/json",
    )
    sys.stdout.write(json.dumps({"status": response.status_code, "body": response.json()}) + "\n")
