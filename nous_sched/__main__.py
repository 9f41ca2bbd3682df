"""``python -m nous_sched run PROGRAM.js --tools MODULE``: see :mod:`nous_sched.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
