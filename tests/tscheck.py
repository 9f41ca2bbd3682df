"""A small TypeScript syntax checker for rendered SDKs (shared by the SDK tests).

It accepts exactly the shapes :mod:`nous_sched.sdk` emits, so a test fails on
broken output rather than on a missing compiler: CI has Python, not ``tsc``.
"""

from __future__ import annotations

import json
import re

_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}
_PLAIN = re.compile(r"[A-Za-z0-9_$ :;?|&,.+=\-]")
_SIGNATURE_OPEN = re.compile(r'^""\(args: \{$')
_DECLARATION = re.compile(r"^type ([A-Za-z_$][\w$]*) = (.+);$")
_INDEX_SIGNATURE = "[name: string]: (args: object) => Promise<unknown>;"
_IDENTIFIER = re.compile(r"(?<![\w$.])[A-Za-z_$][\w$]*")
# Identifiers an SDK may use without declaring them.
_KNOWN = frozenset(
    {"declare", "const", "tools", "type", "args", "object", "name"}
    | {"Promise", "Array", "Record", "unknown", "string", "number", "boolean", "null", "true", "false"}
)


def check_typescript(text: str) -> None:
    """Fail unless ``text`` has the shape of a well-formed TypeScript SDK.

    Outside comments and string literals only identifiers, numbers and type
    punctuation may appear; ``() [] {} <>`` balance; every string literal is a
    JSON string; each doc comment closes exactly where the layout puts it (so
    no ``*/`` hides in its body); named types are declared once, before
    ``tools``, and every name used is declared; each code line is a member
    ending in ``;`` or opens a block.
    """
    assert text.endswith("};\n"), text[-40:]
    stack: list[str] = []
    lines: list[str] = []
    line: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif text.startswith("/**", i):
            end = text.find("*/", i + 3)
            assert end != -1, "unclosed doc comment"
            body = text[i + 3 : end]
            assert text[end + 2] == "\n", f"text after a doc comment: {text[end : end + 30]!r}"
            if "\n" in body:
                assert body.startswith("\n") and body.rsplit("\n", 1)[1] == "   ", repr(body)
                assert all(row.startswith("   * ") for row in body.split("\n")[1:-1]), repr(body)
            else:
                assert body.startswith(" ") and body.endswith(" "), repr(body)
            assert "".join(line).strip() == "", "doc comment after code on one line"
            i = end + 2
        elif text[i] == '"':
            end = i + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            assert isinstance(json.loads(text[i : end + 1]), str)
            line.append('""')
            i = end + 1
        elif text.startswith("=>", i):  # an arrow, not a closing bracket: only the index signature has one
            line.append("=>")
            i += 2
        elif text[i] == "\n":
            if code := "".join(line).strip():
                lines.append(code)
            line = []
            i += 1
        else:
            char = text[i]
            if char in "([{<":
                stack.append(char)
            elif char in _CLOSERS:
                assert stack and stack.pop() == _CLOSERS[char], f"unbalanced {char!r} at {i}"
            else:
                assert _PLAIN.fullmatch(char), f"unexpected {char!r} in code at {i}: {text[i - 40 : i + 40]!r}"
            line.append(char)
            i += 1
    assert not stack, f"unclosed {stack}"
    declared: set[str] = set()
    while lines and lines[0].startswith("type "):
        declaration = lines.pop(0)
        match = _DECLARATION.fullmatch(declaration)
        assert match, f"bad declaration {declaration!r}"
        assert match.group(1) not in declared and match.group(1) not in _KNOWN, f"{match.group(1)} declared twice"
        declared.add(match.group(1))
    if lines == ["declare const tools: {", _INDEX_SIGNATURE, "};"]:
        return  # a tool set too large to list: any name, one arguments object
    for code in lines:
        assert "=" not in code, f"`=` outside a declaration: {code!r}"
    used = {name for code in lines for name in _IDENTIFIER.findall(code)}
    used |= {name for name in _IDENTIFIER.findall(_declarations_text(text))}
    assert used <= _KNOWN | declared, f"undeclared names {sorted(used - _KNOWN - declared)}"
    if lines == ["declare const tools: {};"]:
        return
    assert lines[0] == "declare const tools: {", lines[0]
    assert lines[-1] == "};"
    for code in lines[1:-1]:
        assert code.endswith(";") or _SIGNATURE_OPEN.match(code), f"bad line {code!r}"
        if code.startswith('""('):
            assert re.search(r"\): Promise<.+>;$", code) or code.endswith("{"), code


def _declarations_text(text: str) -> str:
    """The code of the `type` lines, with string literals blanked."""
    head = text.split("declare const tools", 1)[0]
    rows = [row for row in head.split("\n") if row.startswith("type ")]
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', "\n".join(rows)).replace("type ", " ")
