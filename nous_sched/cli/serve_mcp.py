"""``nous-sched serve-mcp``: serve one ``run_code`` tool over MCP (the command-line side).

Usage::

    nous-sched serve-mcp [--tools MODULE] [--server NAME=TARGET ...] [--mcp-config FILE]
                         [--trust NAME ...] [--policy FILE] [--approve TOOL ...]
                         [--deny TOOL ...] [--require-approval TOOL ...]
                         [--audit-log FILE] [--http [HOST:]PORT] [--auth-token-file FILE]
                         [--timeout S] [--cpu-time S] [--max-parallel N] [--max-runs-per-session N]

Programs call the tools of ``MODULE`` (as ``nous-sched run`` takes it) and of
the upstream MCP servers: ``--server NAME=TARGET`` (``TARGET`` is an
``http(s)://`` URL or a command line) and the ``mcpServers`` of
``--mcp-config``. Upstream servers are untrusted unless named by ``--trust``
or marked ``"trusted": true`` in the config; an untrusted server's tools all
need approval (fail safe), and a start-up line on standard error lists every
tool that needs approval and why. Serves stdio by default,
Streamable HTTP with ``--http`` (loopback unless a host is given; port 0
picks a free one, and the URL is printed on standard error). On a loopback
address ``Host`` and ``Origin`` are checked; any other address needs
``--auth-token-file`` (lines ``NAME TOKEN``: each client sends
``Authorization: Bearer TOKEN``, and NAME is the client for its fair share),
or serve-mcp refuses to start (:mod:`.access`). It stops when
its stdio client disconnects, or on Ctrl-C or SIGTERM (exit status 130),
closing the upstream servers it started either way.

This module imports neither the MCP SDK nor the runtime: the CLI builds its
parser without them, and says which extra to install when ``serve-mcp`` runs
without the SDK.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, TextIO

import attrs

from .._extras import install_command
from ..gate.approval_text import inert_line

__all__ = ["add_parser", "run", "approval_banner"]

COMMAND = "serve-mcp"


def run_limits(args: argparse.Namespace) -> dict[str, Any]:
    """A run's ``timeout`` from the command line (``run``'s or ``serve-mcp``'s), or its
    ``limits`` when the command line sets one beside it (``--cpu-time``)."""
    if getattr(args, "cpu_time", None) is None:
        return {"timeout": args.timeout}
    from ..limits import Limits

    return {"limits": Limits(timeout=args.timeout, cpu_time=args.cpu_time)}


def add_parser(sub: Any, *, positive_int: Any, seconds: Any) -> argparse.ArgumentParser:
    """Add the ``serve-mcp`` subcommand to the CLI's subparsers ``sub``.

    ``positive_int`` and ``seconds`` are the CLI's argparse types, so these
    flags are checked and worded like ``run``'s.
    """
    parser: argparse.ArgumentParser = sub.add_parser(
        COMMAND,
        help="serve one run_code tool over MCP, calling a module's tools and/or upstream MCP servers",
        description="Serve Code Mode over MCP: one run_code tool whose programs call the tools of MODULE and "
        "of upstream MCP servers, with per-call approval (MCP elicitation when the client supports it, "
        "otherwise denied unless pre-approved) and a JSON-lines audit log. Needs the mcp extra: "
        f"{install_command('mcp')}.",
    )
    parser.add_argument("--tools", metavar="MODULE", help="dotted module name or .py file defining TOOLS or tools()")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=TARGET",
        help="an upstream MCP server: TARGET is an http(s):// URL or a command line to start (repeatable)",
    )
    parser.add_argument("--mcp-config", metavar="FILE", help='upstream servers from a JSON file with "mcpServers"')
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="NAME",
        help="let upstream server NAME's tool annotations decide parallelism and approval (repeatable)",
    )
    parser.add_argument(
        "--approval-store",
        metavar="FILE",
        help="a client that cannot answer an approval question gets the run's suspension instead of a refusal "
        "(SQLite file, redis:// or postgresql:// URL; decide with `nous-sched approvals ... --store FILE`)",
    )
    parser.add_argument(
        "--state-store",
        metavar="STORE",
        help="give each client's programs a state of their own across runs (`state.get/set`): a scope per MCP "
        "session, or per bearer token's name; STORE is a SQLite file, a redis:// or postgresql:// URL, or `memory`",
    )
    parser.add_argument("--policy", metavar="FILE", help="JSON policy: allow, deny, require_approval, approve, ...")
    parser.add_argument(
        "--approve", action="append", default=[], metavar="TOOL", help="approve every call of TOOL without asking"
    )
    parser.add_argument("--deny", action="append", default=[], metavar="TOOL", help="never grant TOOL")
    parser.add_argument(
        "--require-approval", action="append", default=[], metavar="TOOL", help="every call of TOOL needs approval"
    )
    parser.add_argument("--audit-log", metavar="FILE", help="append audit events to FILE as JSON lines")
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve Streamable HTTP at http://HOST:PORT/mcp (HOST defaults to 127.0.0.1) instead of stdio",
    )
    parser.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="with --http: every request must carry one of FILE's bearer tokens (lines NAME TOKEN); "
        "needed to serve on an address that is not loopback",
    )
    parser.add_argument("--timeout", type=seconds, default=30.0, metavar="S", help="each run's deadline (30)")
    parser.add_argument(
        "--cpu-time",
        type=seconds,
        default=None,
        metavar="S",
        help="the CPU time each run's JavaScript may use, waits not counted (default: no budget but the deadline)",
    )
    parser.add_argument(
        "--max-parallel", type=positive_int, default=10, metavar="N", help="most tool calls running at once (10)"
    )
    parser.add_argument(
        "--description-budget",
        type=positive_int,
        default=None,
        metavar="N",
        help="most characters of run_code's description, at least 1,500 (32,000); "
        "larger tool sets are listed shorter, down to a count and sdk.search",
    )
    parser.add_argument(
        "--max-runs-per-session",
        type=positive_int,
        default=None,
        metavar="N",
        help="most runs one client may have going at once (default: half the worker pool, at least 1); "
        "a client is its bearer token's NAME (--auth-token-file), else its connection",
    )
    return parser


def run(args: argparse.Namespace, err: TextIO) -> int:
    """Serve until the client disconnects (stdio) or the process is interrupted (HTTP); return 0.

    :raises UsageError: bad arguments, a tools module or upstream server that
        cannot be loaded, or the MCP SDK missing.
    """
    from ..errors import ConfigError
    from ..mcp import INSTALL_HINT, require_sdk
    from .loading import UsageError

    try:
        require_sdk()
    except ImportError:
        raise UsageError(f"serve-mcp: {INSTALL_HINT}") from None
    try:
        return _serve(args, err)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _serve(args: argparse.Namespace, err: TextIO) -> int:
    from ..errors import ConfigError
    from ..gate.policy import PermissionPolicy
    from ..mcp.client import connect
    from ..mcp.config import load_config, load_policy
    from ..mcp.serve import CodeModeServer
    from ..mcp.spec import ServerSpec
    from .loading import UsageError, load_tools

    address = _address(args.http) if args.http is not None else None
    verifier = _token_verifier(args, address)
    specs = _servers(args, ServerSpec, load_config)
    if args.tools is None and not specs:
        raise UsageError(
            "serve-mcp: give the tools to serve: --tools MODULE, --server NAME=TARGET or --mcp-config FILE"
        )
    policy, approve = load_policy(args.policy) if args.policy else (PermissionPolicy(), frozenset())
    policy = PermissionPolicy(
        allow=policy.allow,
        deny=policy.deny | set(args.deny),
        require_approval=policy.require_approval | set(args.require_approval),
        approval_categories=policy.approval_categories,
    )
    approve = approve | set(args.approve)

    tools = load_tools(args.tools) if args.tools else []
    connection = connect(*specs) if specs else None
    restore = _stop_on_sigterm()
    try:
        if connection is not None:
            names = {tool.name for tool in tools}
            for tool in connection.tools():
                if tool.name in names:
                    raise ConfigError(
                        f"serve-mcp: tool {tool.name!r} comes both from --tools and from an MCP server; "
                        "rename one (several MCP servers prefix their tools with their names)"
                    )
                tools.append(tool)
        server = CodeModeServer(
            tools,
            policy=policy,
            approve=approve,
            audit_log=args.audit_log,
            **run_limits(args),
            max_parallel=args.max_parallel,
            max_runs_per_session=args.max_runs_per_session,
            **({} if args.description_budget is None else {"budget": args.description_budget}),
            **_durable_options(args),
            **_state_options(args),
        )
        try:
            granted = sorted(t.name for t in tools if policy.permits(t))
            what = f"run_code over {len(granted)} tools ({', '.join(granted) or 'none'})"
            audit = f"audit log: {args.audit_log}" if args.audit_log else "audit log: off (--audit-log FILE)"
            flags = connection.flags() if connection is not None else {}
            approvals = approval_banner([t for t in tools if policy.permits(t)], policy, approve, flags)
            approvals.append(
                f"at most {server.max_runs_per_session} runs at once per client (--max-runs-per-session); "
                + ("a client is its bearer token's name" if verifier is not None else "a client is its connection")
            )
            if getattr(args, "state_store", None):
                approvals.append(
                    "state: each client's programs keep their own scope of the state store (--state-store); "
                    + (
                        "a stateless request from no bearer token has none"
                        if address is not None
                        else "scope mcp-stdio"
                    )
                )

            def banner(where: str) -> None:
                _say(err, f"serving {what} {where}; {audit}")
                for line in approvals:
                    _say(err, line)

            if address is None:
                banner("over stdio")
                server.run_stdio()
            else:
                server.run_http(*address, ready=lambda url: banner(f"at {url}"), token_verifier=verifier)
        finally:
            server.close()
    finally:
        restore()
        if connection is not None:
            connection.close()
    return 0


def approval_banner(tools: list[Any], policy: Any, approve: Any, flags: Any) -> list[str]:
    """The start-up lines saying which granted tools need approval and why (``flags``: a Connection's)."""
    lines = []
    for tool in sorted(tools, key=lambda t: t.name):
        why = _needs_approval_because(tool, policy, flags)
        if why:
            asked = "approved without asking (--approve)" if tool.name in approve else "asked"
            lines.append(f"  {inert_line(tool.name)}: {why}; {asked}")
    if not lines:
        return ["no tool needs approval"]
    return [
        f"{len(lines)} tools need approval (asked by MCP elicitation; refused when the client cannot be asked):"
    ] + lines


def _needs_approval_because(tool: Any, policy: Any, flags: Any) -> str:
    reasons = []
    if tool.requires_approval:
        decided = flags.get(tool.name)
        reasons.append(decided.reason if decided is not None else "the tool requires it")
    if tool.name in policy.require_approval:
        reasons.append("policy: require_approval")
    if tool.category in policy.approval_categories:
        reasons.append(f"policy: category {tool.category!r}")
    return "; ".join(inert_line(r) for r in reasons)


def _stop_on_sigterm() -> Any:
    """Make SIGTERM stop serving the way Ctrl-C does, so upstream servers are closed, not orphaned.

    Returns the function that puts the previous handler back.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _servers(args: argparse.Namespace, spec_class: Any, load_config: Any) -> list[Any]:
    from .loading import UsageError

    specs = list(load_config(args.mcp_config)) if args.mcp_config else []
    for entry in args.server:
        name, sep, target = entry.partition("=")
        if not sep or not name or not target.strip():
            raise UsageError(f"--server {entry}: expected NAME=TARGET (a URL or a command line)")
        if not target.startswith(("http://", "https://")):
            try:
                target = shlex.split(target)
            except ValueError as exc:
                raise UsageError(f"--server {entry}: cannot split the command line: {exc}") from None
        specs.append(spec_class(target, name=name))
    names = [spec.name for spec in specs]
    for name in args.trust:
        if name not in names:
            raise UsageError(f"--trust {name}: no upstream server of that name (servers: {', '.join(names) or 'none'})")
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise UsageError(f"serve-mcp: two upstream servers are named {duplicate!r}")
    trusted = set(args.trust)
    return [attrs.evolve(spec, trusted=True) if spec.name in trusted else spec for spec in specs]


def _address(text: str) -> tuple[str, int]:
    from .loading import UsageError

    host, sep, port_text = text.rpartition(":")
    host = (host or "127.0.0.1").strip("[]") if sep else "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UsageError(f"--http {text}: expected [HOST:]PORT with a port from 0 to 65535")
    return host, port


def _token_verifier(args: argparse.Namespace, address: Any) -> Any:
    """``--auth-token-file``'s tokens (:class:`.access.BearerTokens`), checked before anything starts."""
    from ..mcp.access import BearerTokens, transport_security
    from .loading import UsageError

    path = getattr(args, "auth_token_file", None)
    if path is not None and address is None:
        raise UsageError(
            "--auth-token-file: bearer tokens are for --http; stdio serves the one process that started it"
        )
    verifier = BearerTokens.from_file(path) if path is not None else None
    if address is not None:
        transport_security(address[0], authorized=verifier is not None)  # the address's rule, before any upstream
    return verifier


def _say(err: TextIO, message: str) -> None:
    try:
        err.write(f"nous-sched serve-mcp: {message}\n")
        err.flush()
    except (OSError, ValueError):
        pass


def _state_options(args: Any) -> dict[str, Any]:
    """``state_store`` when ``--state-store`` is given (see :mod:`nous_sched.state`)."""
    if not getattr(args, "state_store", None):
        return {}
    from .durable import open_state_option

    return {"state_store": open_state_option(args.state_store)}


def _durable_options(args: Any) -> dict[str, Any]:
    """``approval_store`` when ``--approval-store`` is given (see :mod:`nous_sched.durable`)."""
    if not getattr(args, "approval_store", None):
        return {}
    from .durable import open_store

    return {"approval_store": open_store(args.approval_store)}
