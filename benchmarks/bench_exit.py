"""13. A host's exit: from its last ``run_code``'s return to the process gone.

A ``python -c`` host makes one run with one tool call (the default runtime:
a worker from the fork server), notes the time and its own CPU, and
returns; the parent notes when ``wait4`` returns and the child's CPU in all.
What lies between is the pool's teardown at exit (every worker killed, the
fork server ended) and the interpreter's finalization (every module torn
down, every object freed): what a short-lived host, a CLI or a test
process, waits for after its answer. CPU is the host's own, not the
workers' nor the fork server's: ``getrusage`` from the return to the last
atexit handler, then ``wait4``'s figure less what the host and its reaped
children had used by then.

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

# Both hosts print, at the return and again from the atexit handler that runs
# last (registered first), the time, their own CPU and their reaped
# children's (the fork server's, once the pool's teardown has reaped it).
PRELUDE = r"""
import atexit, resource, sys, time
def note():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stdout.write("%.6f %.6f %.6f\n" % (time.time(), me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime))
    sys.stdout.flush()
atexit.register(note)
"""
HOST = (
    PRELUDE
    + r"""
from nous_sched import Tool, run_code
tool = Tool("price", lambda args: 1, description="Unit price.", parameters={"type": "object"})
result = run_code("return await tools.price({})", [tool], description="One call", timeout=30)
assert result.ok, result.error
note()
"""
)
BARE = PRELUDE + "note()\n"


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
        (returned, me, _), (_, me_last, kids_last) = (map(float, line.split()) for line in out.read().splitlines())
    # The host's own CPU from the return to its last atexit handler (the pool's
    # teardown), then everything after it (finalization): wait4's figure also
    # holds the children it reaped, the fork server's whole life among them.
    return gone - returned, (me_last - me) + (usage.ru_utime + usage.ru_stime - me_last - kids_last)


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
