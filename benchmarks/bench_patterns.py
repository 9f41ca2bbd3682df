"""12. Schema patterns: the linear-time engine the host checks them with, against the alternatives.

Issue 18 measured ``google-re2`` against ``jsonschema-rs``; these rows keep
that measurement. Each row times one argument check of the same schema and
argument, both orders alternating:

- the issue's pattern ``^(\\w+\\s?)*$`` against ``"a" * 22 + "!"``: Python's
  ``re`` (what ``jsonschema`` used; exponential, 1.8x per character, so 22
  keeps it short) against ``nous_sched``'s check (RE2 inside ``jsonschema``);
- the same pattern against 1 MB: ``nous_sched`` against ``jsonschema-rs``
  with its linear ``regex`` engine (``RegexOptions``);
- a typical tool schema (a pattern, an integer bound, a unique string array)
  and a valid argument: ``nous_sched`` against ``jsonschema-rs``, the price
  of keeping ``jsonschema`` (whose errors the host words for the program).

``jsonschema-rs`` rows are SKIP when it is not installed (``pip install
jsonschema-rs``); it is not a dependency.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

import _common as c

from nous_sched import Tool
from nous_sched.gate.schema import argument_error

EVIL = r"^(\w+\s?)*$"
TYPICAL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]+$"},
        "days": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["city"],
}


def _ours(schema: Any, args: Any) -> Callable[[], float]:
    tool = Tool("t", lambda a: a, parameters=schema)
    argument_error(tool, args)  # compiled once, as in a run
    return lambda: c.timed(lambda: argument_error(tool, args))


def _rs(schema: Any, args: Any) -> Callable[[], float]:
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(schema, pattern_options=jsonschema_rs.RegexOptions())
    return lambda: c.timed(lambda: validator.is_valid(args))


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=15, quick_reps=3)
    ms = 1000.0
    evil_schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": EVIL}}}

    def section() -> list[c.Row]:
        short = {"q": "a" * 22 + "!"}
        backtracking = lambda: c.timed(lambda: re.search(EVIL, short["q"]))  # noqa: E731
        s = c.interleave(opts.reps, _ours(evil_schema, short), backtracking)
        rows = [
            c.ours_vs(
                "the issue's pattern, 23 characters: RE2 vs re",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="python re",
                target=c.ratio_below(0.1),
            )
        ]
        try:
            import jsonschema_rs  # noqa: F401
        except ImportError:
            return rows + [c.skip_row("vs jsonschema-rs", "jsonschema-rs is not installed")]
        big = {"q": "a" * 1_000_000 + "!"}
        s = c.interleave(opts.reps, _ours(evil_schema, big), _rs(evil_schema, big))
        rows.append(
            c.ours_vs("the issue's pattern, 1 MB", s[0], s[1], s, scale=ms, unit="ms", base_name="jsonschema-rs")
        )
        typical = {"city": "Oslo", "days": 3, "tags": ["a", "b", "c"]}
        s = c.interleave(opts.reps, _ours(TYPICAL, typical), _rs(TYPICAL, typical))
        rows.append(c.ours_vs("a typical schema, valid", s[0], s[1], s, scale=ms, unit="ms", base_name="jsonschema-rs"))
        return rows

    return c.run("12. schema patterns (one argument check each)", [("patterns", section)], opts)


if __name__ == "__main__":
    sys.exit(main())
