"""The official MCP conformance suite's server scenarios against ``nous-sched serve-mcp`` over HTTP.

``scripts/conformance`` runs them (``.ci/system-deps`` installs the pinned
suite and its Node); see the README's serve-mcp section for which apply.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "conformance"
APPLICABLE = [
    "server-initialize",
    "ping",
    "tools-list",
    "logging-set-level",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
]
SUMMARY = re.compile(r"^(\S+): Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings$", re.M)


def run(*scenarios):
    done = subprocess.run([str(SCRIPT), *scenarios], capture_output=True, text=True, timeout=600)
    return done, {m[1]: (int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in SUMMARY.finditer(done.stdout)}


def test_every_applicable_scenario_passes_with_no_warnings():
    done, results = run(*APPLICABLE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(results) == sorted(APPLICABLE)
    for scenario, (passed, total, failed, warnings) in results.items():
        assert (passed, failed, warnings) == (total, 0, 0), (scenario, done.stdout)


def test_sse_polling_fails_only_for_want_of_its_test_tool():
    # server-sse-polling calls a `test_reconnection` tool serve-mcp does not have, on a
    # request it labels protocol 2025-03-26 (the SDK primes only 2025-11-25 clients).
    done, results = run("server-sse-polling")
    assert results["server-sse-polling"][2] == 1, done.stdout
    failures = [line for line in done.stdout.splitlines() if "FAILURE" in line]
    assert len(failures) == 1 and "Received tool response on POST stream" in failures[0], done.stdout
    assert "Tool call failed" in done.stdout
