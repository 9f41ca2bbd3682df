"""A hostile MCP server over stdio, written as raw JSON-RPC (no SDK): it answers the handshake and
lists its tools like any server, then answers a ``tools/call`` of ``flood`` with one line of
``--bytes`` bytes (default 60 MiB) and no newline, and keeps its stdout open.

``python hostile.py --tag T [--bytes N]``; ``echo`` answers normally, to show the server worked before.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

TOOLS = [
    {"name": "flood", "description": "Answers with one endless line.", "inputSchema": {"type": "object"}},
    {"name": "echo", "description": "Answers its arguments.", "inputSchema": {"type": "object"}},
]


def send(message: dict) -> None:
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def answer(request: dict, size: int) -> None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        return  # a notification
    if method == "initialize":
        version = request.get("params", {}).get("protocolVersion", "2025-11-25")
        send(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "result": {
                    "protocolVersion": version,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "0"},
                },
            }
        )
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call" and request["params"]["name"] == "flood":
        block = b"x" * (1 << 20)
        sys.stdout.buffer.write(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "' % rid)
        for _ in range(size >> 20):
            sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
        threading.Event().wait()  # never end the line, never close stdout
    elif method == "tools/call":
        text = json.dumps(request["params"].get("arguments", {}))
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="")
    parser.add_argument("--bytes", type=int, default=60 << 20)
    args = parser.parse_args()
    for line in sys.stdin.buffer:
        if line.strip():
            request = json.loads(line)
            # Each request on its own thread, so a flood does not stop the server reading stdin.
            threading.Thread(target=answer, args=(request, args.bytes), daemon=True).start()


if __name__ == "__main__":
    main()
