"""The MCP server ``bench_mcp.py`` calls: one read-only tool that answers at once.

Run over stdio (``python _mcp_echo.py``) or built in-process (:func:`build`).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations


def build() -> MCPServer:
    server = MCPServer("echo", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(i: int) -> dict:
        """Returns its argument."""
        return {"i": i}

    return server


if __name__ == "__main__":
    build().run("stdio")
