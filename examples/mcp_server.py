"""A small inventory MCP server, written with the MCP SDK, for ``mcp_fanout.py``.

Two tools: ``stock`` reads one SKU's level (annotated read-only) and
``reorder`` places a purchase order (annotated destructive). It speaks MCP on
stdin and stdout: let ``mcp_fanout.py`` start it, or run it from the
repository root with::

    python examples/mcp_server.py
"""

from __future__ import annotations

import itertools

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel

LEVELS = {"A-100": (4, 10), "B-200": (25, 10), "C-300": (0, 5), "D-400": (12, 12), "E-500": (7, 20)}
LATENCY = 0.05  # seconds: a warehouse system is not instant, which lets the fan-out show in the trail


class Level(BaseModel):
    sku: str
    on_hand: int
    reorder_at: int


class Line(BaseModel):
    sku: str
    quantity: int


class Order(BaseModel):
    order_id: str
    lines: list[Line]


def build() -> MCPServer:
    server = MCPServer("inventory", instructions="Stock levels and purchase orders.", log_level="WARNING")
    orders = itertools.count(1001)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def stock(sku: str) -> Level:
        """The stock level of one SKU and the level at which it should be reordered."""
        await anyio.sleep(LATENCY)
        if sku not in LEVELS:
            raise ToolError(f"unknown SKU {sku!r}")
        on_hand, reorder_at = LEVELS[sku]
        return Level(sku=sku, on_hand=on_hand, reorder_at=reorder_at)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def reorder(lines: list[Line]) -> Order:
        """Place one purchase order for the given SKUs and quantities."""
        await anyio.sleep(LATENCY)
        return Order(order_id=f"PO-{next(orders)}", lines=lines)

    return server


if __name__ == "__main__":
    build().run("stdio")
