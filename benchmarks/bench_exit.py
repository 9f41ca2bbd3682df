"""13. A host's exit: from its last ``run_code``'s return to the process gone.

A ``python -c`` host makes one run with one tool call (the default runtime:
a worker from the fork server), notes the time and its own CPU, and
returns; the parent notes when ``wait4`` returns and the child's CPU in all.
What lies between is the pool's teardown at exit (every worker killed, the
fork server ended) and the interpreter's finalization (every module torn
down, every object freed): what a short-lived host, a CLI or a test
process, waits for after its answer. CPU is the host's own (``wait4``'s
rusage against ``getrusage`` at the return), not the workers'.

Baseline, alternating with it: the same measurement of a host that imports
nothing (a bare interpreter's exit). Run it with ``PYTHONPATH`` pointing at
another checkout for a before/after.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import _common as c

HOST = r"""
import resource, sys, time
from nous_sched import Tool, run_code
tool = Tool("price", lambda args: 1, description="Unit price.", parameters={"type": "object"})
result = run_code("return await tools.price({})", [tool], description="One call", timeout=30)
assert result.ok, result.error
r = resource.getrusage(resource.RUSAGE_SELF)
sys.stdout.write("%.6f %.6f\n" % (time.time(), r.ru_utime + r.ru_stime))
sys.stdout.flush()
"""
BARE = r"""
import resource, sys, time
r = resource.getrusage(resource.RUSAGE_SELF)
sys.stdout.write("%.6f %.6f\n" % (time.time(), r.ru_utime + r.ru_stime))
sys.stdout.flush()
"""


def one(code: str) -> tuple[float, float]:
    """(wall, CPU) seconds from the child's last line to its exit."""
    with tempfile.TemporaryFile("w+") as out:  # not a pipe: a worker holding it would delay end-of-file
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        gone = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"the host exited with {proc.returncode}")
        out.seek(0)
        returned, cpu = map(float, out.read().split())
    return gone - returned, usage.ru_utime + usage.ru_stime - cpu


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    k = 2 if opts.quick else 3

    def section() -> list[c.Row]:
        cpu: dict[str, list[float]] = {"host": [], "bare": []}

        def sample(code: str, key: str) -> float:
            got = [one(code) for _ in range(k)]
            cpu[key].append(statistics.median(x[1] for x in got))
            return statistics.median(x[0] for x in got)

        s = c.interleave(opts.reps, lambda: sample(HOST, "host"), lambda: sample(BARE, "bare"))
        ms = 1000.0
        return [
            c.Row(
                "host exit after its last run_code: wall",
                c.Stats.of([x * ms for x in s[0]]),
                c.Stats.of([x * ms for x in s[1]]),
                unit="ms",
                base_name="a bare interpreter",
                ratio=c.ratios(s[0], s[1]),
                regime=s.regime,
                load=s.load,
                note=f"median of {k} hosts per sample",
            ),
            c.Row(
                "  host exit after its last run_code: the host's CPU",
                c.Stats.of([x * ms for x in cpu["host"]]),
                c.Stats.of([x * ms for x in cpu["bare"]]),
                unit="ms CPU",
                base_name="a bare interpreter",
                ratio=c.ratios(cpu["host"], cpu["bare"]),
                regime=s.regime,
                load=s.load,
            ),
        ]

    return c.run(__doc__.splitlines()[0], [("exit", section)], opts)


if __name__ == "__main__":
    sys.exit(main())
