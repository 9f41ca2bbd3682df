"""``examples/mcp_fanout.py``: it runs, fans out over the read-only tool, and the write waits at the barrier."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"nous_sched_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the server's annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_reads_fan_out_and_the_write_waits_for_them(capsys):
    example, server = load("mcp_fanout"), load("mcp_server")
    result = example.run(server.build())
    assert result.ok, result.error
    assert result.logs == ("3 of 5 SKUs are below their reorder point",)
    assert result.result["low"] == ["A-100", "C-300", "E-500"]
    assert result.result["order"]["lines"] == [
        {"sku": "A-100", "quantity": 16},
        {"sku": "C-300", "quantity": 10},
        {"sku": "E-500", "quantity": 33},
    ]
    reads, (write,) = result.trail[:5], result.trail[5:]
    assert [(r.tool, r.mode) for r in reads] == [("stock", "parallel")] * 5
    assert (write.tool, write.mode) == ("reorder", "exclusive")
    assert write.started >= max(r.committed for r in reads)  # the barrier
    assert "approval asked: reorder(" in capsys.readouterr().out


def test_the_example_runs_as_a_script():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "mcp_fanout.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:3] for line in done.stdout.splitlines()]
    rows = [row for row in rows if len(row) == 3 and row[1] in ("stock", "reorder")]
    assert rows == [[str(i), "stock", "parallel"] for i in range(5)] + [["5", "reorder", "exclusive"]]
    assert '"order_id": "PO-1001"' in done.stdout
