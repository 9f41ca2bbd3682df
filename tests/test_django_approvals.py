"""The Django example (examples/django_approvals/): request 1 suspends (202), request 2
approves in another process, request 3 resumes and gets the result."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("django")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "django_approvals")

PROGRAM = """
const order = await tools.lookup_order({id: "A-1"});
const refund = await tools.refund({id: order.id, amount: order.total / 2});
console.log("refunded", refund.refunded);
return refund;
"""


def test_suspend_approve_in_another_process_then_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("NOUS_APPROVAL_STORE", str(tmp_path / "approvals.db"))
    monkeypatch.setenv("NOUS_REFUND_LEDGER", str(tmp_path / "refunds.jsonl"))
    monkeypatch.syspath_prepend(EXAMPLE)
    import app  # noqa: F401  (configures Django for this process)
    from django.test import Client

    client = Client()
    first = client.post(
        "/runs", json.dumps({"code": PROGRAM, "description": "refund half"}), content_type="application/json"
    )
    assert first.status_code == 202
    (pending,) = first.json()["suspended"]["pending"]
    assert pending["tool"] == "refund" and pending["arguments"] == {"id": "A-1", "amount": 20}
    token = first.json()["suspended"]["token"]
    assert not (tmp_path / "refunds.jsonl").exists()

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    second = subprocess.run(
        [sys.executable, os.path.join(EXAMPLE, "approve.py"), token, str(pending["seq"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {"status": 200, "body": {"decided": 1, "approved": True}}

    third = client.post(f"/runs/{token}/resume")
    assert third.status_code == 200
    assert third.json() == {"logs": ["refunded 20"], "result": {"refunded": 20, "order": "A-1"}}
    assert (tmp_path / "refunds.jsonl").read_text().splitlines() == ['{"id": "A-1", "amount": 20}']
    again = client.post(f"/runs/{token}/resume")
    assert again.status_code == 409 and "already used" in again.json()["error"]
