"""Request 2 of the example, served by a process of its own: an operator approves call SEQ of TOKEN.

python approve.py TOKEN SEQ
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import app  # noqa: E402,F401  (configures Django)
from django.test import Client  # noqa: E402

if __name__ == "__main__":
    token, seq = sys.argv[1], sys.argv[2]
    response = Client().post(
        f"/approvals/{token}/{seq}",
        json.dumps({"approved": True, "reason": "checked"}),
        content_type="application/json",
    )
    sys.stdout.write(json.dumps({"status": response.status_code, "body": response.json()}) + "\n")
