"""Issue 43, item 6: ``nous-sched serve-mcp --http`` under 16 concurrent SDK clients, and a resumed run's result.

Two experiments against a real ``serve-mcp`` subprocess on loopback:

* ``load``: ``--clients`` MCP SDK ``Client`` objects at once (each its own
  connection, the default stateless protocol), each calling ``run_code`` in a
  loop for ``--seconds``; a tenth of the calls (seeded) are hostile programs
  that spin to the server's deadline (``--timeout``). Counted: honest calls
  answered with 42, honest calls refused for the per-client cap (the issue's
  failure), honest calls that ended otherwise (by their error's kind, and
  why), hostile calls and how they ended.
* ``delivery``: ``serve-mcp --approval-store`` with a tool that needs
  approval; the client cannot answer elicitation, gets the suspension, an
  operator approves with ``nous-sched approvals approve`` (another process),
  and the client polls ``run_result``: whether the resumed run's result
  reaches the client that started it, and how often the approved call ran.

    PYTHONPATH=$PWD python benchmarks/bench_serve_mcp_load.py [--seconds 120] [--clients 16]

Needs the mcp extra.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HONEST = {"code": "return 6 * 7;", "description": "the answer"}
HOSTILE = {"code": "while (true) {}", "description": "spins to its deadline"}
TOOLS_MODULE = """
import os
from nous_sched import Tool

def _buy(args):
    with open(os.environ["BOUGHT_FILE"], "a") as f:
        f.write(args["item"] + "\\n")
    return {"bought": args["item"]}

TOOLS = [
    Tool("quote", lambda args: {"price": 7}, description="A price.", parameters={"type": "object"}),
    Tool("buy", _buy, description="Buy an item.", parameters={"type": "object"}, requires_approval=True),
]
"""


@contextlib.contextmanager
def serve_mcp(folder: str, *extra: str) -> Iterator[str]:
    """``nous-sched serve-mcp --http 127.0.0.1:0`` with the tools above and ``extra``; yields its URL."""
    module = os.path.join(folder, "bench_tools.py")
    with open(module, "w", encoding="utf-8") as f:
        f.write(TOOLS_MODULE)
    env = dict(os.environ, BOUGHT_FILE=os.path.join(folder, "bought.txt"))
    argv = [sys.executable, "-m", "nous_sched", "serve-mcp", "--tools", module, "--http", "127.0.0.1:0", *extra]
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert process.stderr is not None
    try:
        line = process.stderr.readline()  # printed once the socket listens
        if " at http://" not in line:
            raise RuntimeError(line + process.stderr.read()[-2000:])
        threading.Thread(target=process.stderr.read, daemon=True).start()  # never let its pipe fill
        yield line.split(" at ", 1)[1].split(";", 1)[0]
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def load(seconds: float, clients: int = 16, timeout: float = 5.0, seed: int = 6) -> dict[str, Any]:
    """``clients`` SDK clients calling ``run_code`` for ``seconds``, a tenth of the calls hostile."""
    import anyio
    from mcp import Client

    counts: collections.Counter[str] = collections.Counter()
    why: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(url: str, i: int, until: list[float]) -> None:
        rng = random.Random(seed * 1000 + i)

        async def go() -> None:
            async with Client(url) as mcp:
                while time.monotonic() < until[0]:
                    hostile = rng.random() < 0.1
                    result = await mcp.call_tool("run_code", HOSTILE if hostile else HONEST)
                    content = result.structured_content or {}
                    with lock:
                        if hostile:
                            kind = (content.get("error") or {}).get("kind") or ("refused" if result.is_error else "?")
                            counts[f"hostile_{kind}"] += 1
                        elif not result.is_error and content.get("result") == 42:
                            counts["honest_answered"] += 1
                        else:
                            text = result.content[0].text if result.content else json.dumps(content)
                            kind = (content.get("error") or {}).get("kind")
                            if "max_runs_per_session" in text:
                                counts["honest_refused_for_the_cap"] += 1
                            else:
                                counts[f"honest_{kind or 'refused'}"] += 1
                            why[(content.get("error") or {}).get("message", text)[:100]] += 1

        start.wait(120)
        anyio.run(go)

    with tempfile.TemporaryDirectory(prefix="bench-serve-mcp-") as folder:
        with serve_mcp(folder, "--timeout", str(timeout)) as url:
            until = [time.monotonic() + 3600.0]
            threads = [
                threading.Thread(target=client, args=(url, i, until), name=f"bench-client-{i}") for i in range(clients)
            ]
            for t in threads:
                t.start()
            until[0] = time.monotonic() + seconds
            for t in threads:
                t.join(seconds + 10 * timeout + 120)
    return {"clients": clients, "seconds": seconds, **counts, "honest_failed_as": dict(why)}


def delivery() -> dict[str, Any]:
    """One suspended run approved by an operator; whether ``run_result`` gives its client the resumed result."""
    import anyio
    from mcp import Client

    program = "const q = await tools.quote({}); return await tools.buy({item: 'pen', price: q.price});"
    with tempfile.TemporaryDirectory(prefix="bench-serve-mcp-") as folder:
        store = os.path.join(folder, "approvals.db")
        with serve_mcp(folder, "--approval-store", store) as url:

            async def go() -> dict[str, Any]:
                async with Client(url) as mcp:
                    names = [t.name for t in (await mcp.list_tools()).tools]
                    if "run_result" not in names:
                        return {"delivered": False, "why": f"no run_result tool (tools: {names})"}
                    first = await mcp.call_tool("run_code", {"code": program, "description": "buy a pen"})
                    suspended = (first.structured_content or {}).get("suspended") or {}
                    token, claim = suspended.get("token"), suspended.get("claim")
                    if not token:
                        return {"delivered": False, "why": "not suspended"}
                    operator = await anyio.to_thread.run_sync(
                        lambda: subprocess.run(
                            [sys.executable, "-m", "nous_sched", "approvals", "approve", token, "1", "--store", store],
                            capture_output=True,
                            text=True,
                            timeout=120,
                            check=False,
                        )
                    )
                    if operator.returncode != 0:
                        return {"delivered": False, "why": operator.stderr[-300:]}
                    done = await mcp.call_tool("run_result", {"token": token, "claim": claim})
                    return {"delivered": (done.structured_content or {}).get("result") == {"bought": "pen"}}

            out = anyio.run(go)
        bought = os.path.join(folder, "bought.txt")
        with contextlib.suppress(FileNotFoundError), open(bought, encoding="utf-8") as f:
            out["approved_call_ran"] = len(f.read().split())
        out.setdefault("approved_call_ran", 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=5.0, help="serve-mcp's --timeout: the hostile runs' length")
    args = parser.parse_args()
    print(f"load: {json.dumps(load(args.seconds, args.clients, args.timeout), sort_keys=True)}", flush=True)
    print(f"delivery: {json.dumps(delivery(), sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
