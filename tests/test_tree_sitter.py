"""nous_sched/_tree_sitter.py: the one TypeScript parser the stripper and the review's summary share.

Both read programs at once on many threads (runs start, reviews are made, on
the caller's threads); each answer must be the one a single thread gets.
"""

from __future__ import annotations

import threading

from nous_sched import Tool
from nous_sched._tree_sitter import parse
from nous_sched.review import summarize
from nous_sched.runtime._typescript import strip

TYPED = "const n: number = await tools.add({a: 1, b: 2}) as number;\nfunction f(x: string): string { return x }\nn"
PLAIN = "async function go() { return await tools.add({a: 1}); }\nconst g = () => 2;\nreturn await go();"
TOOLS = [Tool("add", lambda args: args)]


def test_the_stripper_and_the_summary_on_many_threads_at_once_answer_as_on_one():
    stripped, summary = strip(TYPED), summarize(PLAIN, TOOLS)
    expected = (stripped.text, stripped.changed, stripped.last, summary)
    seen: list[object] = []
    start = threading.Barrier(8)

    def work(i: int) -> None:
        start.wait(60)
        for _ in range(40):
            if i % 2:
                s = strip(TYPED)
                seen.append((s.text, s.changed, s.last, summarize(PLAIN, TOOLS)))
            else:
                got = summarize(PLAIN, TOOLS)
                s = strip(TYPED)
                seen.append((s.text, s.changed, s.last, got))

    threads = [threading.Thread(target=work, args=(i,), name=f"test-parse-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert stripped.changed and "number" not in stripped.text
    assert seen == [expected] * 320


def test_each_query_gives_its_own_captures_from_the_one_parser():
    root, names = parse(b"function f() {}\nconst g = () => 1;", "(function_declaration name: (identifier) @name)")
    assert not root.has_error and [bytes(n.text) for n in names["name"]] == [b"f"]
    root, found = parse(b"let x: number = 1 as number;", "(as_expression) @cast")
    assert [bytes(n.text) for n in found["cast"]] == [b"1 as number"]
    root, names = parse(b"function h() {}", "(function_declaration name: (identifier) @name)")  # compiled once, reused
    assert [bytes(n.text) for n in names["name"]] == [b"h"]
