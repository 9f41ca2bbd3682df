"""Live call counts on standard error while a program runs."""

from __future__ import annotations

import threading
from typing import Any, Optional, TextIO

from ..events import COMMIT, START

__all__ = ["Progress"]


class Progress:
    """Live ``calls started N / committed M`` on a stream, fed by the scheduler's observer.

    :meth:`observe` runs on the scheduler's driver thread, so it only bumps
    counters: it never writes, locks or waits. A separate daemon thread
    (``nous-sched-progress``) redraws at most every ``interval`` seconds, and
    only when a count changed. On a terminal the line is redrawn in place and
    erased at the end; elsewhere each change is a new line, and a final line is
    always written.
    """

    def __init__(self, stream: TextIO, *, interval: float = 0.1, tty: Optional[bool] = None) -> None:
        self.stream = stream
        self.interval = interval
        self.tty = isatty(stream) if tty is None else tty
        self.started = 0
        self.committed = 0
        self.failed = 0
        self._stop = threading.Event()
        self._shown: Optional[tuple[int, int, int]] = None
        self._thread = threading.Thread(target=self._loop, name="nous-sched-progress", daemon=True)

    def observe(self, record: Any, phase: str) -> None:
        # Driver thread: integer bumps only (each counter has this one writer).
        # The observer's phases (nous_sched.events.PHASES): both counted.
        if phase == START:
            self.started += 1
        elif phase == COMMIT:
            self.committed += 1
            if record.ok is False:
                self.failed += 1

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self._draw(final=True)

    def text(self) -> str:
        line = f"calls started {self.started} / committed {self.committed}"
        return line + (f" ({self.failed} failed)" if self.failed else "")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw(final=False)

    def _draw(self, *, final: bool) -> None:
        state = (self.started, self.committed, self.failed)
        try:
            if self.tty:
                if final:
                    self.stream.write("\r\033[K")
                elif state != self._shown:
                    self.stream.write("\r\033[K" + self.text())
            elif state != self._shown or (final and self._shown is None):
                self.stream.write(self.text() + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream must not break the run
        self._shown = state


def isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
