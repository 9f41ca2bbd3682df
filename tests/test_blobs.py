"""Blob handles (issue 40): a result too big to cross stays on the host, the program holds a handle.

The must-show: a 10 MB tool result passed by handle to a second tool, in a
worker whose heap (``Limits.memory_bytes``) is far below 10 MB, the second
tool getting the exact bytes and the model-facing answer staying small; the
same run with handles off fails on that heap, so the bound is a real measure.
Then: a forged handle and another run's are refused, reads are bounded, the
schema checks the value, the audit, live events and usage say what was held.
"""

from __future__ import annotations

import json

import pytest

from nous_sched import ConfigError, Limits, Tool, ToolOutcomeEvent, run_code, start_run
from nous_sched.blobs import KEY, PREVIEW_CHARS, BlobStore
from nous_sched.crossing import dumps

MIB = 1024 * 1024
TEN_MB = "é" * (5 * 1000 * 1000)  # 10,000,000 bytes of UTF-8
SMALL_HEAP = Limits(memory_bytes=8 * MIB, timeout=60)
PASS_ON = """
const r = await tools.big({});
const n = await tools.take({s: r.body, note: "the body"});
console.log("handle", r.body);
return {n, handle: r.body, meta: r.meta};
"""


def _pair(seen: list) -> list[Tool]:
    return [
        Tool("big", lambda args: {"meta": {"rows": 1}, "body": TEN_MB}),
        Tool("take", lambda args: seen.append(args["s"]) or len(args["s"])),
    ]


def test_a_10_mb_result_passed_by_handle_reaches_the_second_tool_exactly_and_the_answer_stays_small(runtime):
    seen: list = []
    result = run_code(PASS_ON, _pair(seen), limits=SMALL_HEAP, description="pass a big result on")
    assert result.error is None, result.error
    assert len(seen) == 1 and seen[0] == TEN_MB  # the exact value, every byte
    handle = result.result["handle"]
    assert handle[KEY].startswith("blob-") and handle["kind"] == "text" and handle["size"] == 10_000_002
    assert handle["length"] == len(TEN_MB) and handle["preview"] == "é" * PREVIEW_CHARS + "…"
    assert result.result["n"] == len(TEN_MB) and result.result["meta"] == {"rows": 1}  # the small part crossed
    # The model-facing answer: the handle, a few hundred bytes, never the megabytes.
    assert result.usage.model_bytes == result.usage.answer_bytes < 2_000
    assert len(json.dumps(result.for_model())) < 2_000
    assert result.usage.held_bytes == 10_000_002 and sum(c.chars for c in result.usage.calls) < 1_000


def test_without_handles_the_same_run_does_not_fit_that_heap(runtime):
    # The measure above is real: the 10 MB crossing into the program does not fit an 8 MiB heap.
    seen: list = []
    limits = Limits(memory_bytes=8 * MIB, timeout=60, blob_bytes=None)
    result = run_code(PASS_ON, _pair(seen), limits=limits, description="pass a big result on")
    assert result.error is not None and result.error.kind == "abort" and "memory" in result.error.message
    assert seen == []


def test_a_part_of_a_result_is_held_and_the_rest_crosses():
    rows = [{"id": i, "text": "r" * 100} for i in range(100)]  # 12 KB together, each row small
    result_of = {"title": "t", "body": "x" * 10_000, "rows": rows, "tail": [1, 2]}
    program = "const r = await tools.get({}); return {title: r.title, tail: r.tail, body: r.body, rows: r.rows};"
    result = run_code(program, [Tool("get", lambda a: result_of)], limits=Limits(blob_bytes=8192), description="t")
    assert result.error is None, result.error
    out = result.result
    assert out["title"] == "t" and out["tail"] == [1, 2]
    assert out["body"]["kind"] == "text" and out["rows"]["kind"] == "json"
    assert out["rows"]["size"] == len(dumps(rows)) and out["rows"]["preview"].startswith('[{"id":0,')


def test_a_result_within_the_limit_crosses_whole_and_handles_can_be_turned_off():
    program = "const r = await tools.get({}); return typeof r.body;"
    tools = [Tool("get", lambda a: {"body": "x" * 300_000})]
    assert run_code(program, tools, description="t").result == "object"  # the default limit, 256 KiB, held it
    assert run_code(program, tools, limits=Limits(blob_bytes=None), description="t").result == "string"
    assert run_code(program, tools, limits=Limits(blob_bytes=400_000), description="t").result == "string"


def test_a_forged_handle_and_another_runs_handle_are_refused_and_never_reach_the_tool():
    seen: list = []
    tools = [Tool("big", lambda a: "x" * 10_000), Tool("take", lambda a: seen.append(a) or "ran")]
    limits = Limits(blob_bytes=4096)
    first = run_code("return await tools.big({});", tools, limits=limits, description="make a handle")
    other = first.result
    assert other[KEY].startswith("blob-")
    program = """
    const out = [];
    for (const h of [HANDLES]) {
      try { out.push(await tools.take({deep: [{h}]})); } catch (e) { out.push(e.message); }
    }
    return out;
    """
    forged = {KEY: "blob-" + "0" * 32, "kind": "text", "size": 1, "length": 1, "preview": "x"}
    made_up = {KEY: "not even an id \u202e"}
    handles = ", ".join(json.dumps(h) for h in (other, forged, made_up))
    result = run_code(program.replace("HANDLES", handles), tools, limits=limits, description="forge")
    assert result.error is None, result.error
    assert seen == []
    for message, h in zip(result.result, (other, forged, made_up), strict=True):
        assert message.startswith(f"blob handle {json.dumps(h[KEY], ensure_ascii=False)} is not one of this run's")
        assert "from another run, or made up, is refused" in message
    assert [r.tool for r in result.refused] == ["take"] * 3


def test_a_handle_the_run_made_passes_anywhere_inside_the_arguments():
    seen: list = []
    tools = [Tool("big", lambda a: {"v": list(range(3000))}), Tool("take", lambda a: seen.append(a) or "ok")]
    program = 'const r = await tools.big({}); return await tools.take({a: [1, {b: r}], c: "$blob"});'
    result = run_code(program, tools, limits=Limits(blob_bytes=4096), description="t")
    assert result.error is None, result.error
    assert seen == [{"a": [1, {"b": {"v": list(range(3000))}}], "c": "$blob"}]


def test_the_tool_gets_a_copy_of_the_value():
    # A tool that changes what it was given changes nothing the next call gets.
    seen: list = []

    def spoil(args):
        seen.append(list(args["v"]))
        args["v"].append("spoiled")
        return "ok"

    tools = [Tool("big", lambda a: list(range(3000))), Tool("spoil", spoil)]
    program = "const h = await tools.big({}); await tools.spoil({v: h}); await tools.spoil({v: h}); return 1;"
    result = run_code(program, tools, limits=Limits(blob_bytes=4096), description="t")
    assert result.error is None, result.error
    assert seen == [list(range(3000))] * 2


def test_the_schema_checks_the_value_the_handle_stands_for():
    seen: list = []
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 20_000}}, "required": ["s"]}
    tools = [
        Tool("big", lambda a: {"short": "y" * 10_000, "long": "z" * 30_000}),
        Tool("take", lambda a: seen.append(len(a["s"])) or "ok", parameters=schema),
    ]
    program = """
    const r = await tools.big({});
    const ok = await tools.take({s: r.short});  // a handle, an object, where a string is expected: the value is one
    let refused = null;
    try { await tools.take({s: r.long}); } catch (e) { refused = e.message; }
    return {ok, refused, kinds: [typeof r.short, typeof r.long]};
    """
    result = run_code(program, tools, limits=Limits(blob_bytes=4096), description="t")
    assert result.error is None, result.error
    assert result.result["ok"] == "ok" and seen == [10_000]
    assert result.result["kinds"] == ["object", "object"]
    assert result.result["refused"].startswith("invalid arguments: $.s: expected a string of at most 20000 characters")


def test_reads_are_bounded_and_give_back_the_exact_value():
    text = "".join(chr(0x20 + i % 90) for i in range(20_000)) + "\U0001f600 end"
    rows = [{"i": i, "s": "é" * 10} for i in range(500)]
    tools = [Tool("get", lambda a: {"text": text, "rows": rows})]
    program = """
    const r = await tools.get({});
    async function whole(h) {
      let out = "";
      for (let at = 0; at < h.length; ) {
        const part = await blobs.read(h, at);
        if (part.length === 0) break;
        out += part; at += [...part].length;
      }
      return out;
    }
    const big = await blobs.read(r.text, 0, 1e9);
    const past = await blobs.read(r.text, 1e9, 10);
    const text = await whole(r.text);
    const rows = JSON.parse(await whole(r.rows));
    const errors = [];
    for (const args of [[], [r.text, -1], [r.text, 0, 1.5], [5], [{}], [r.text, "0"], ["blob-" + "0".repeat(32)]]) {
      try { await blobs.read(...args); errors.push(null); } catch (e) { errors.push([e.tool, e.message]); }
    }
    return {big: big.length, past, same: text === r_text(), rows, errors, handle: r.text};
    """.replace("r_text()", json.dumps(text))
    result = run_code(program, tools, limits=Limits(blob_bytes=4096), description="read in slices")
    assert result.error is None, result.error
    out = result.result
    assert out["big"] == 4096 and out["past"] == "" and out["same"] is True and out["rows"] == rows
    assert out["handle"]["length"] == len(text)  # code points: the emoji is one
    assert all(e is not None and e[0] == "blobs.read" for e in out["errors"])
    assert "`start` must be an integer of at least 0" in out["errors"][1][1]
    assert "expects a blob handle" in out["errors"][3][1] and "is not one of this run's" in out["errors"][6][1]
    assert result.usage.read_chars > len(text)  # every slice, as it crossed (JSON-quoted)


def test_a_read_in_a_run_without_blobs_says_why():
    program = 'try { await blobs.read({"$blob": "blob-" + "1".repeat(32)}); } catch (e) { return e.message; }'
    result = run_code(program, [], limits=Limits(blob_bytes=None), description="t")
    assert "Limits.blob_bytes is None" in result.result


def test_the_audit_live_events_and_logs_show_the_handle_never_the_bytes():
    secret_tail = "TAIL-" + "q" * 20
    body = "p" * 50_000 + secret_tail
    tools = [Tool("big", lambda a: body), Tool("take", lambda a: len(a["s"]))]
    program = "const h = await tools.big({}); console.log(h); return await tools.take({s: h});"
    run = start_run(program, tools, limits=Limits(blob_bytes=4096), description="audit")
    events = list(run.events())
    result = run.result()
    assert result.error is None and result.result == len(body)
    outcome = next(e for e in result.events if isinstance(e, ToolOutcomeEvent) and e.tool == "big")
    ((blob_id, size),) = outcome.blobs
    assert outcome.as_event().data["blobs"] == [{"id": blob_id, "bytes": size}] and size == len(body) + 2
    audit = json.dumps([e.as_event().data for e in result.events], default=str)
    live = json.dumps([e.data for e in events], default=str)
    for shown in (audit, live, "\n".join(result.logs), json.dumps(result.to_dict())):
        assert secret_tail not in shown and len(shown) < 20_000
        assert blob_id in shown
    commit = next(e for e in events if e.kind == "commit" and e.data["tool"] == "big")
    assert commit.data["blobs"] == [{"id": blob_id, "bytes": size}]
    call = next(e for e in events if e.kind == "call" and e.data["tool"] == "take")
    assert call.data["arguments"][0]["value"].startswith('{"$blob": "' + blob_id)  # as written, not the value


def test_blob_bytes_is_checked_when_limits_are_made():
    with pytest.raises(ConfigError, match="blob_bytes"):
        Limits(blob_bytes=100)
    with pytest.raises(ConfigError, match="blob_bytes"):
        Limits(blob_bytes="64k")  # type: ignore[arg-type]


def test_ids_are_random_and_a_store_finds_only_its_own():
    one, two = BlobStore(4096), BlobStore(4096)
    held, _, (blob,) = one.hold("x" * 5000, dumps("x" * 5000))
    assert held == blob.handle() and len(blob.id) == len("blob-") + 32
    assert one.blob(blob.id) is blob and two.blob(blob.id) is None
    assert len({BlobStore(4096).hold("y" * 5000, dumps("y" * 5000))[2][0].id for _ in range(50)}) == 50
    parent = BlobStore(4096, parent=one.blob)  # the seam a state scope plugs into
    assert parent.blob(blob.id) is blob


def test_a_resumed_durable_run_gets_the_same_handles_and_their_values(tmp_path):
    from nous_sched import SqliteApprovalStore, resume

    body = "".join(chr(0x41 + i % 26) for i in range(20_000))
    bought: list = []
    tools = [
        Tool("fetch", lambda a: {"body": body}),
        Tool("buy", lambda a: bought.append(a["text"]) or "bought", requires_approval=True),
    ]
    program = """
    const r = await tools.fetch({});
    const done = await tools.buy({text: r.body});
    return {handle: r.body, done, head: await blobs.read(r.body, 0, 5)};
    """
    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    first = run_code(program, tools, limits=Limits(blob_bytes=4096), description="buy", approval_store=store)
    assert first.suspended is not None and bought == []
    (pending,) = first.suspended.pending
    held = pending.arguments["text"]  # the suspension's request, in the model's answer and the store: the handle
    assert held[KEY].startswith("blob-") and held["length"] == len(body)
    assert len(json.dumps(first.for_model())) < 2_000
    again = resume(
        first.suspended.token, {pending.seq: True}, tools, approval_store=store, limits=Limits(blob_bytes=4096)
    )
    assert again.error is None, again.error
    assert bought == [body] and again.result["done"] == "bought" and again.result["head"] == "ABCDE"
    assert again.result["handle"]["kind"] == "text" and again.result["handle"]["length"] == len(body)
    (made,) = [e for e in first.events if isinstance(e, ToolOutcomeEvent) and e.tool == "fetch"]
    assert again.result["handle"][KEY] == made.blobs[0][0]  # the handle the first run made


def test_a_handle_stored_in_a_state_scope_keeps_its_blob_for_the_scopes_next_runs(tmp_path):
    # The glue the run's state.set uses (nous_sched.blobs.keep_in_scope / scope_lookup), on a SQLite
    # store: the first run's blob is found by a later run of the same scope, by no run of another.
    from nous_sched import SqliteStateStore, State
    from nous_sched.blobs import SCOPE_PREFIX, keep_in_scope, scope_lookup

    path = str(tmp_path / "state.db")
    value = [{"i": i, "s": "é" * 20} for i in range(200)]
    first = BlobStore(4096)
    held, _, (blob,) = first.hold(value, dumps(value))
    scope = State("conversation-42", SqliteStateStore(path))
    assert keep_in_scope(first, scope, {"saved": [held]}, Limits()) is None
    assert scope.get(SCOPE_PREFIX + blob.id) == value

    later = BlobStore(4096, parent=scope_lookup(State("conversation-42", SqliteStateStore(path))))
    assert later.substitute({"x": held}) == {"x": value}
    assert later.read([held, 0, 10]).value == dumps(value)[:10]
    elsewhere = BlobStore(4096, parent=scope_lookup(State("another-scope", SqliteStateStore(path))))
    assert "is not one of this run's" in elsewhere.substitute({"x": held})
    # A handle the run does not hold, and a blob past the scope's bounds, are refused; nothing is written.
    forged = {KEY: "blob-" + "f" * 32}
    assert keep_in_scope(first, scope, forged, Limits())[0] == "invalid"
    tight = Limits(state_value_bytes=100)
    error, message = keep_in_scope(first, State("tight", SqliteStateStore(path)), held, tight)
    assert error == "limit" and "Limits.state_value_bytes" in message
    assert State("tight", SqliteStateStore(path)).keys() == []


def test_a_deep_result_is_held_at_a_bounded_depth_and_passes_back_exactly():
    deep: object = {"leaf": "z" * 20_000, "n": 1}
    for i in range(40):
        deep = {"level": i, "inner": deep}
    store = BlobStore(4096)
    held, text, made = store.hold(deep, dumps(deep))
    assert len(text) <= 4096 and len(made) == 1  # one part held, at most 16 levels down
    assert text.count('"inner"') <= 16 and made[0].kind == "json"
    assert store.substitute({"x": held}) == {"x": deep}


def test_a_handle_a_run_stores_with_state_set_is_good_in_the_scopes_next_run(tmp_path):
    from nous_sched import SqliteStateStore, State

    path = str(tmp_path / "state.db")
    doc = "".join(chr(0x61 + i % 26) for i in range(30_000))
    got: list = []
    tools = [Tool("fetch", lambda a: doc), Tool("archive", lambda a: got.append(a["text"]) or len(a["text"]))]
    limits = Limits(blob_bytes=4096)
    first = run_code(
        'const h = await tools.fetch({}); await state.set("doc", {title: "t", body: h}); return h;',
        tools,
        limits=limits,
        state=State("conversation-7", SqliteStateStore(path)),
        description="store a handle",
    )
    assert first.error is None, first.error
    handle = first.result
    later = 'const d = await state.get("doc"); return [d.title, await tools.archive({text: d.body}), d.body];'
    second = run_code(
        later, tools, limits=limits, state=State("conversation-7", SqliteStateStore(path)), description="use it"
    )
    assert second.error is None, second.error
    assert second.result[:2] == ["t", len(doc)] and got == [doc]
    assert second.result[2] == handle  # the same handle, as stored
    # Another scope (its own "doc" holding the same handle) does not find the blob.
    State("elsewhere", SqliteStateStore(path)).set("doc", {"title": "t", "body": handle})
    third = run_code(
        'const d = await state.get("doc"); try { await tools.archive({text: d.body}); } catch (e) { return e.message; }',
        tools,
        limits=limits,
        state=State("elsewhere", SqliteStateStore(path)),
        description="use it elsewhere",
    )
    assert "is not one of this run's" in third.result and got == [doc]


def test_a_big_state_value_comes_back_as_a_handle():
    from nous_sched import State

    scope = State("big-values")
    scope.set("rows", ["r" * 100] * 100)  # 10 KB of JSON
    program = 'const v = await state.get("rows"); return [typeof v, Array.isArray(v), v.kind];'
    result = run_code(program, [], limits=Limits(blob_bytes=4096), state=scope, description="read a big value")
    assert result.error is None, result.error
    assert result.result == ["object", False, "json"]


def test_a_handle_passed_to_a_tool_with_a_bound_argument():
    from nous_sched import Tool as T

    got: list = []
    body = "b" * 10_000
    tools = [
        T("fetch", lambda a: body),
        T("send", lambda a: got.append((a["key"], a["text"])) or "sent", bound={"key": "sk-secret-value-123"}),
    ]
    program = "const h = await tools.fetch({}); return await tools.send({text: h});"
    result = run_code(program, tools, limits=Limits(blob_bytes=4096), description="send with a key")
    assert result.error is None, result.error
    assert got == [("sk-secret-value-123", body)]
    (call,) = [e.as_event().data for e in result.events if e.as_event().type == "tool_call" and e.tool == "send"]
    assert call["arguments"]["key"] == "[bound]" and call["arguments"]["text"][KEY].startswith("blob-")
    audit = json.dumps([e.as_event().data for e in result.events], default=str)
    assert "sk-secret-value-123" not in audit and body not in audit
    # Passing the bound argument itself is refused first, a handle or not.
    sneaky = (
        "const h = await tools.fetch({}); try { await tools.send({text: h, key: h}); } catch (e) { return e.message; }"
    )
    refused = run_code(sneaky, tools, limits=Limits(blob_bytes=4096), description="sneak")
    assert "bound" in refused.result and len(got) == 1
