"""A real MCP server with file tools and no annotations at all, as many servers are (SDK ``MCPServer``).

``python files.py ROOT [--tag T]`` serves stdio; every path is relative to ROOT. By MCP's defaults each
tool is destructive and not read-only; nothing here says otherwise.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer


def build(root: str) -> MCPServer:
    server = MCPServer("files", log_level="WARNING")
    base = Path(root)

    def inside(path: str) -> Path:
        target = (base / path).resolve()
        if base.resolve() not in (target, *target.parents):
            raise ValueError(f"{path} is outside the root")
        return target

    @server.tool()
    def read_file(path: str) -> str:
        """Read a text file."""
        return inside(path).read_text()

    @server.tool()
    def write_file(path: str, content: str) -> str:
        """Write a text file, replacing it."""
        inside(path).write_text(content)
        return f"wrote {len(content)} characters to {path}"

    @server.tool()
    def move_file(source: str, destination: str) -> str:
        """Move a file."""
        os.replace(inside(source), inside(destination))
        return f"moved {source} to {destination}"

    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--tag", default="")
    build(parser.parse_args().root).run("stdio")
