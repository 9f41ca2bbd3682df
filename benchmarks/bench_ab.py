"""A/B. One agent task done two ways with the same tools: direct tool calls, and one ``run_code`` program.

The task: *find the three cheapest in-stock products across the catalog's
categories and total their price.* Four tools over an in-memory catalog (4
categories x 5 products), deterministic, each waiting a fixed 1 ms like a
fast internal API:

- ``list_categories({})`` -> the category names;
- ``list_products({category})`` -> ``[{id, name}]``;
- ``get_product({id})`` -> ``{id, name, category, price, currency, rating, summary}``;
- ``get_stock({id})`` -> ``{id, in_stock, quantity, warehouse}``.

The same 45 calls (1 + 4 + 20 + 20) are made both ways, and both ways must
reach the same answer:

(a) **direct**: a scripted model calls one tool per turn, as a model without
    code does, and decides its next call from the JSON text of the last
    result: every call it writes and every result it reads is in its
    context. Each call goes through ``nous_sched.call_tool`` (the text it
    returns is what the model is sent). Beside it, the best a direct model
    can do: every independent call of a turn written at once as parallel
    tool calls (3 tool turns), run concurrently by the loop on 10 threads.
(b) **code**: one call of ``run_code_tool``'s tool (the model writes the
    program; ``call_tool`` runs it, ``max_parallel`` 10), whose answer is
    the run's logs and return value within ``run_code_tool``'s output budget.

Model-visible bytes are counted in the OpenAI Chat Completions shapes: each
call as the ``tool_calls`` entry the model writes (``{id, type, function:
{name, arguments}}``), each result as the ``{role: "tool", tool_call_id,
content}`` message it reads, UTF-8, compact JSON; the tool definitions are
``openai_tool`` of each tool (for code mode, the ``run_code`` tool, whose
description carries the tools' TypeScript declarations). A model turn is a
round trip to the model; the closing answer turn is counted, its text (the
same both ways) is not. *Input over all turns* is what the model is sent in
total: every turn re-sends the definitions, the task and the transcript so
far (before any prompt caching). Wall time is the tools' side only: no model
is called, so each turn's model latency (seconds, in practice) is not in it.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
from typing import Any, Callable

import _common as c

from nous_sched import Tool, call_tool, openai_tool, run_code_tool

WAIT = 0.001
THREADS = 10
TASK = (
    "Find the three cheapest products that are in stock, across all the catalog's categories, "
    "and give their names, prices and the total of their prices."
)
CATEGORIES = ("books", "garden", "kitchen", "toys")
PER_CATEGORY = 5
WAREHOUSES = ("north", "south", "east")


def _catalog() -> dict[str, dict[str, Any]]:
    """A fixed catalog: prices and stock from arithmetic, so every run sees the same data."""
    products: dict[str, dict[str, Any]] = {}
    for ci, category in enumerate(CATEGORIES):
        for k in range(PER_CATEGORY):
            n = ci * PER_CATEGORY + k
            pid = f"{category[:2]}-{100 + n}"
            cents = 499 + (n * 7919) % 4500  # spread over 4.99-49.98
            quantity = (n * 37) % 11 if n % 3 else 0  # every third product is out of stock
            products[pid] = {
                "id": pid,
                "name": f"{category.title()} item {k + 1}",
                "category": category,
                "price": cents / 100,
                "currency": "EUR",
                "rating": round(3.0 + (n * 13 % 20) / 10, 1),
                "summary": f"A {category} product, model {n:03d}: sturdy, well reviewed, ships in 2-3 days.",
                "quantity": quantity,
            }
    return products


CATALOG = _catalog()


_made = [0]
_made_lock = threading.Lock()


def _wait() -> None:
    with _made_lock:
        _made[0] += 1
    time.sleep(WAIT)


def calls_made() -> int:
    """Tool calls made so far in this process, however they were made (direct or from a program)."""
    with _made_lock:
        return _made[0]


def list_categories(args: dict[str, Any]) -> Any:
    _wait()
    return list(CATEGORIES)


def list_products(args: dict[str, Any]) -> Any:
    _wait()
    return [{"id": p["id"], "name": p["name"]} for p in CATALOG.values() if p["category"] == args["category"]]


def get_product(args: dict[str, Any]) -> Any:
    _wait()
    p = CATALOG[args["id"]]
    return {k: p[k] for k in ("id", "name", "category", "price", "currency", "rating", "summary")}


def get_stock(args: dict[str, Any]) -> Any:
    _wait()
    p = CATALOG[args["id"]]
    n = int(p["id"].split("-")[1])
    return {"id": p["id"], "in_stock": p["quantity"] > 0, "quantity": p["quantity"], "warehouse": WAREHOUSES[n % 3]}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_STR = {"type": "string"}
_ID = _obj({"id": {"type": "string", "description": "A product id from list_products."}}, ["id"])
READ_ONLY = {"concurrency_safe": lambda args: True, "category": "read"}
TOOLS = [
    Tool(
        "list_categories",
        list_categories,
        "The catalog's category names.",
        parameters=_obj({}, []),
        returns={"type": "array", "items": _STR},
        **READ_ONLY,
    ),
    Tool(
        "list_products",
        list_products,
        "The products of one category: id and name.",
        parameters=_obj({"category": _STR}, ["category"]),
        returns={"type": "array", "items": _obj({"id": _STR, "name": _STR}, ["id", "name"])},
        **READ_ONLY,
    ),
    Tool(
        "get_product",
        get_product,
        "One product's details, price in `currency`.",
        parameters=_ID,
        returns=_obj(
            {
                "id": _STR,
                "name": _STR,
                "category": _STR,
                "price": {"type": "number"},
                "currency": _STR,
                "rating": {"type": "number"},
                "summary": _STR,
            },
            ["id", "name", "category", "price", "currency", "rating", "summary"],
        ),
        **READ_ONLY,
    ),
    Tool(
        "get_stock",
        get_stock,
        "One product's stock: whether it is in stock, how many, where.",
        parameters=_ID,
        returns=_obj(
            {"id": _STR, "in_stock": {"type": "boolean"}, "quantity": {"type": "integer"}, "warehouse": _STR},
            ["id", "in_stock", "quantity", "warehouse"],
        ),
        **READ_ONLY,
    ),
]
BY_NAME = {t.name: t for t in TOOLS}

PROGRAM = """\
const categories = await tools.list_categories({});
const lists = await Promise.all(categories.map((category) => tools.list_products({ category })));
const ids = lists.flat().map((p) => p.id);
const [details, stock] = await Promise.all([
  Promise.all(ids.map((id) => tools.get_product({ id }))),
  Promise.all(ids.map((id) => tools.get_stock({ id }))),
]);
const cheapest = details
  .filter((p, i) => stock[i].in_stock)
  .sort((a, b) => a.price - b.price)
  .slice(0, 3);
const total = cheapest.reduce((sum, p) => sum + Math.round(p.price * 100), 0) / 100;
console.log(`checked ${ids.length} products in ${categories.length} categories`);
return { cheapest: cheapest.map((p) => ({ id: p.id, name: p.name, price: p.price })), total };"""
DESCRIPTION = "Find the three cheapest in-stock products across all categories and total their price."


def answer(details: list[dict[str, Any]], stock: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's answer from the details and stock the model read: what both ways must reach."""
    in_stock = [p for p, s in zip(details, stock) if s["in_stock"]]
    cheapest = sorted(in_stock, key=lambda p: p["price"])[:3]
    total = sum(round(p["price"] * 100) for p in cheapest) / 100
    return {"cheapest": [{"id": p["id"], "name": p["name"], "price": p["price"]} for p in cheapest], "total": total}


def size(value: Any) -> int:
    """Bytes of a value as compact JSON, UTF-8: what it weighs in the model's context."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


class Transcript:
    """What the model writes and reads, turn by turn, in the OpenAI Chat Completions shapes."""

    def __init__(self, tools: list[Tool]) -> None:
        self.definitions = size([openai_tool(t) for t in tools])
        self.task = size({"role": "user", "content": TASK})
        self.written = 0  # bytes of the tool_calls entries the model wrote
        self.read = 0  # bytes of the tool messages it read
        self.calls = 0  # tool calls the model wrote
        self.turns = 0  # round trips to the model
        self.sent = 0  # bytes sent to the model over every turn
        self.texts: list[str] = []

    def turn(self, calls: list[tuple[str, str]], run: Callable[[list[tuple[str, str]]], list[str]]) -> list[str]:
        """One model turn that writes ``calls`` ((name, arguments JSON) pairs); the loop runs them with ``run``."""
        self.turns += 1
        self.sent += self.definitions + self.task + self.written + self.read
        texts = run(calls)
        for (name, arguments), text in zip(calls, texts):
            self.calls += 1
            cid = f"call_{self.calls}"
            self.written += size({"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}})
            self.read += size({"role": "tool", "tool_call_id": cid, "content": text})
        self.texts.extend(texts)
        return texts

    def close(self) -> None:
        """The closing turn: the model reads everything once more and answers."""
        self.turns += 1
        self.sent += self.definitions + self.task + self.written + self.read


def _one(name: str, arguments: str) -> str:
    return call_tool(BY_NAME[name], arguments)


def sequential_loop(calls: list[tuple[str, str]]) -> list[str]:
    return [_one(name, arguments) for name, arguments in calls]


def _args(**kw: Any) -> str:
    return json.dumps(kw, separators=(",", ":"))


def direct(parallel: bool, pool: concurrent.futures.Executor) -> tuple[Transcript, dict[str, Any]]:
    """The task by direct tool calls: one call per turn, or each turn's independent calls at once."""
    t = Transcript(TOOLS)

    def concurrent_loop(calls: list[tuple[str, str]]) -> list[str]:
        return list(pool.map(lambda call: _one(*call), calls))

    def ask(calls: list[tuple[str, str]]) -> list[Any]:
        if parallel:
            texts = t.turn(calls, concurrent_loop)
        else:
            texts = [t.turn([call], sequential_loop)[0] for call in calls]
        return [json.loads(text) for text in texts]

    (categories,) = ask([("list_categories", "{}")])
    lists = ask([("list_products", _args(category=cat)) for cat in categories])
    ids = [p["id"] for products in lists for p in products]
    read = ask([("get_product", _args(id=i)) for i in ids] + [("get_stock", _args(id=i)) for i in ids])
    t.close()
    return t, answer(read[: len(ids)], read[len(ids) :])


def code(tool: Tool) -> tuple[Transcript, dict[str, Any]]:
    """The task by one run_code call: the model writes the program and reads the run's answer."""
    t = Transcript([tool])
    arguments = json.dumps({"code": PROGRAM, "description": DESCRIPTION}, ensure_ascii=False)
    (text,) = t.turn([("run_code", arguments)], lambda calls: [call_tool(tool, arguments)])
    t.close()
    out = json.loads(text)
    if "result" not in out or out.get("logs") != ["checked 20 products in 4 categories"]:
        raise AssertionError(f"the program failed: {text[:300]}")
    return t, out["result"]


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="bench-ab-loop")
    title = "A/B: direct tool calls against one run_code program (ratio = code / direct)"

    def counts() -> list[c.Row]:
        seq, want = direct(False, pool)
        par, same = direct(True, pool)
        tool = run_code_tool(TOOLS, max_parallel=THREADS)
        before = calls_made()
        prog, got = code(tool)
        subcalls = calls_made() - before  # the tool calls the program made, counted at the tools
        if not (want == same == got) or subcalls != seq.calls:
            raise AssertionError(f"the two ways differ: direct {want} in {seq.calls} calls, code {got} in {subcalls}")
        d, p = "direct, one call per turn", "direct, parallel calls"

        def row(name: str, ours: float, base: float, unit: str, base_name: str, **kw: Any) -> c.Row:
            return c.Row(name, c.Stats.fixed(ours), c.Stats.fixed(base), unit=unit, base_name=base_name, **kw)

        smaller = c.ratio_below(1.0, "(code smaller)")
        return [
            row(
                "A/B: tool calls, total (code: 1 run_code + its sub-calls)",
                1 + subcalls,
                seq.calls,
                "calls",
                d,
                note="the same 45 calls both ways; code mode adds the run_code call itself",
            ),
            row("A/B: tool calls the model writes", prog.calls, seq.calls, "calls", d),
            row(
                "A/B: model turns (round trips to the model)",
                prog.turns,
                seq.turns,
                "turns",
                d,
                target=smaller,
                note="tool turns plus the closing answer turn",
            ),
            row("  model turns against parallel direct calls", prog.turns, par.turns, "turns", p, target=smaller),
            row(
                "A/B: model-visible bytes (calls written + results read)",
                prog.written + prog.read,
                seq.written + seq.read,
                "bytes",
                d,
                target=smaller,
                note="OpenAI chat tool_calls entries and tool messages, compact JSON, UTF-8; "
                "parallel direct calls write and read the same bytes",
            ),
            row(
                "  of which written by the model (calls; code: the program)",
                prog.written,
                seq.written,
                "bytes",
                d,
            ),
            row("  of which read by the model (results; code: logs + return value)", prog.read, seq.read, "bytes", d),
            row(
                "A/B: tool definitions, sent every turn",
                prog.definitions,
                seq.definitions,
                "bytes",
                d,
                note="openai_tool of each tool; code: the run_code tool, its description the tools' declarations",
            ),
            row(
                "A/B: input over all turns (definitions + task + transcript)",
                prog.sent,
                seq.sent,
                "bytes",
                d,
                target=smaller,
                note="what the model is sent in total, before any prompt caching",
            ),
            row(
                "  input over all turns against parallel direct calls", prog.sent, par.sent, "bytes", p, target=smaller
            ),
        ]

    def wall(rc: c.RuntimeChoice) -> list[c.Row]:
        tool = run_code_tool(TOOLS, runtime=rc.runtime, max_parallel=THREADS)

        def time_code() -> float:
            t0 = time.perf_counter()
            _, got = code(tool)
            dt = time.perf_counter() - t0
            assert got["total"] > 0
            return dt

        def time_direct(parallel: bool) -> Callable[[], float]:
            def once() -> float:
                t0 = time.perf_counter()
                direct(parallel, pool)
                return time.perf_counter() - t0

            return once

        for _ in range(2):  # warm-up: the runtime's pool, the loop's threads
            time_code(), time_direct(False)(), time_direct(True)()
        s = c.interleave(opts.reps, time_code, time_direct(False), time_direct(True))
        ms = 1000.0
        return [
            c.ours_vs(
                f"A/B: wall time, tools only [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="direct, one call per turn",
                note=f"45 calls of a {WAIT * ms:g} ms tool; no model in the clock (it would add one latency per turn)",
            ),
            c.ours_vs(
                "  wall time against parallel direct calls",
                s[0],
                s[2],
                s,
                scale=ms,
                unit="ms",
                base_name="direct, parallel calls",
                note=f"each turn's calls run at once on {THREADS} threads by the loop",
            ),
        ]

    try:
        return c.run(title, [("counts", counts)] + c.per_runtime(opts, "wall", wall), opts)
    finally:
        pool.shutdown()


if __name__ == "__main__":
    sys.exit(main())
