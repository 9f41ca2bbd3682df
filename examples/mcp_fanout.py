"""Code Mode over an MCP server: fan out over a read-only tool, then make one write.

Needs the ``mcp`` extra. Run it from the repository root with::

    python examples/mcp_fanout.py

Starts ``mcp_server.py`` as a subprocess (stdio), marks it trusted so its
annotations count: ``stock`` is read-only, so the five lookups run side by
side; ``reorder`` is destructive, so it asks for approval and runs alone,
after every lookup has committed. The trail printed at the end shows that
barrier: five ``parallel`` rows overlapping, then one ``exclusive`` row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nous_sched import ApprovalRequest, RunResult, run_code
from nous_sched.cli import format_trail
from nous_sched.mcp import ServerSpec, connect

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]

PROGRAM = """
const skus = ["A-100", "B-200", "C-300", "D-400", "E-500"];
const levels = await Promise.all(skus.map((sku) => tools.stock({ sku })));
const low = levels.filter((level) => level.on_hand < level.reorder_at);
console.log(`${low.length} of ${skus.length} SKUs are below their reorder point`);
const order = await tools.reorder({
  lines: low.map((level) => ({ sku: level.sku, quantity: 2 * level.reorder_at - level.on_hand })),
});
return { low: low.map((level) => level.sku), order };
"""


def approve(request: ApprovalRequest) -> bool:
    """A stand-in for asking a person: show the exact call, and approve it."""
    print(f"approval asked: {request.tool}({json.dumps(request.arguments)}) -> approved")
    return True


def run(server: object = None) -> RunResult:
    """Run the program against the inventory server (``server``: any ServerSpec target; a subprocess by default)."""
    with connect(ServerSpec(server or SERVER, name="inventory", trusted=True)) as conn:
        return run_code(PROGRAM, conn.tools(), description="Reorder what runs low", approval_handler=approve)


def main() -> int:
    result = run()
    print(json.dumps(result.to_dict(), indent=2))
    print()
    for line in format_trail(result.trail):
        print(line)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
