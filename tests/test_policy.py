"""PermissionPolicy: which tools a program may call and which calls need approval.

(How ``run_code`` applies a policy to a program's calls is in test_run_code.py.)
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_sched import PermissionPolicy, Tool
from nous_sched.gate.policy import denied_message


def tool(name, **kw):
    return Tool(name=name, function=lambda args: args, **kw)


# --- permits -------------------------------------------------------------------------


def test_default_policy_permits_everything_and_asks_for_nothing():
    policy = PermissionPolicy()
    assert policy.allow is None
    assert policy.deny == frozenset()
    assert policy.require_approval == frozenset()
    assert policy.approval_categories == frozenset()
    for name in ("a", "run_code", "odd-name", "é"):
        assert policy.permits(tool(name))
        assert not policy.needs_approval(tool(name))


def test_allow_list_permits_only_its_names():
    policy = PermissionPolicy(allow=["search", "read"])
    assert policy.allow == frozenset({"search", "read"})
    assert policy.permits(tool("search")) and policy.permits(tool("read"))
    assert not policy.permits(tool("write"))
    assert not policy.permits(tool("Search"))  # names are exact


def test_a_single_string_is_one_name_not_its_characters():
    policy = PermissionPolicy(allow="search", deny="rm", require_approval="pay", approval_categories="execute")
    assert policy.allow == frozenset({"search"})
    assert policy.deny == frozenset({"rm"})
    assert policy.require_approval == frozenset({"pay"})
    assert policy.approval_categories == frozenset({"execute"})
    assert not policy.permits(tool("s"))
    assert policy.permits(tool("search"))


def test_deny_wins_over_allow():
    policy = PermissionPolicy(allow=["a", "b"], deny=["b"])
    assert policy.permits(tool("a"))
    assert not policy.permits(tool("b"))


def test_deny_alone_permits_the_rest():
    policy = PermissionPolicy(deny=["rm"])
    assert not policy.permits(tool("rm"))
    assert policy.permits(tool("ls"))


def test_empty_allow_denies_everything_but_none_allows_all():
    assert not PermissionPolicy(allow=[]).permits(tool("a"))
    assert not PermissionPolicy(allow=set()).permits(tool("a"))
    assert PermissionPolicy(allow=None).permits(tool("a"))
    assert PermissionPolicy(deny=None).permits(tool("a"))


def test_any_iterable_of_names_is_accepted_and_frozen():
    names = (n for n in ["a", "b"])
    policy = PermissionPolicy(allow=names, deny={"c"}, require_approval=("d",))
    assert policy.allow == frozenset({"a", "b"})
    assert isinstance(policy.deny, frozenset) and isinstance(policy.require_approval, frozenset)
    assert policy.permits(tool("a")) and policy.permits(tool("b"))  # the generator was read once


def test_policy_is_an_immutable_value():
    policy = PermissionPolicy(allow=["a"], deny=["b"])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.allow = None
    assert policy == PermissionPolicy(allow={"a"}, deny=("b",))
    assert hash(policy) == hash(PermissionPolicy(allow={"a"}, deny=("b",)))
    assert policy != PermissionPolicy(allow=["a"])


def test_permits_works_on_any_object_with_a_name():
    policy = PermissionPolicy(allow=["x"])
    assert policy.permits(SimpleNamespace(name="x"))
    assert not policy.permits(SimpleNamespace(name="y"))


# --- needs_approval ------------------------------------------------------------------


def test_tools_own_requires_approval_always_applies():
    gated = tool("pay", requires_approval=True)
    assert PermissionPolicy().needs_approval(gated)
    assert PermissionPolicy(allow=["pay"]).needs_approval(gated)


def test_require_approval_by_name():
    policy = PermissionPolicy(require_approval=["pay", "send"])
    assert policy.needs_approval(tool("pay"))
    assert policy.needs_approval(tool("send"))
    assert not policy.needs_approval(tool("read"))


def test_approval_by_category():
    policy = PermissionPolicy(approval_categories=["execute", "write"])
    assert policy.needs_approval(tool("sh", category="execute"))
    assert policy.needs_approval(tool("save", category="write"))
    assert not policy.needs_approval(tool("ls", category="read"))
    assert not policy.needs_approval(tool("ls"))  # the default category is "read"
    assert PermissionPolicy(approval_categories="read").needs_approval(tool("ls"))


def test_approval_and_permission_are_independent_questions():
    # A denied tool can "need approval"; run_code refuses it before ever asking.
    policy = PermissionPolicy(deny=["pay"], require_approval=["pay"])
    assert not policy.permits(tool("pay"))
    assert policy.needs_approval(tool("pay"))


def test_needs_approval_on_duck_typed_tools():
    policy = PermissionPolicy(approval_categories=["execute"], require_approval=["x"])
    assert policy.needs_approval(SimpleNamespace(name="x"))
    assert policy.needs_approval(SimpleNamespace(name="y", category="execute"))
    assert not policy.needs_approval(SimpleNamespace(name="y"))
    assert policy.needs_approval(SimpleNamespace(name="z", requires_approval=True))
    assert not PermissionPolicy().needs_approval(SimpleNamespace(name="z", requires_approval=False))


# --- the refusal message ---------------------------------------------------------------


def test_denied_message_format():
    assert denied_message("x") == 'tool "x" is denied by the permission policy'
    assert denied_message('a"b') == 'tool "a\\"b" is denied by the permission policy'
    assert denied_message("é") == 'tool "é" is denied by the permission policy'


# --- properties ------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c", "d", "run_code", "é"])
NAME_SETS = st.frozensets(NAMES, max_size=4)
CATEGORIES = st.sampled_from(["read", "write", "execute"])


@given(
    allow=st.none() | NAME_SETS,
    deny=NAME_SETS,
    require=NAME_SETS,
    categories=st.frozensets(CATEGORIES),
    name=NAMES,
    category=CATEGORIES,
    own=st.booleans(),
)
def test_policy_semantics(allow, deny, require, categories, name, category, own):
    policy = PermissionPolicy(allow=allow, deny=deny, require_approval=require, approval_categories=categories)
    t = tool(name, category=category, requires_approval=own)
    assert policy.permits(t) == (name not in deny and (allow is None or name in allow))
    assert policy.needs_approval(t) == (own or name in require or category in categories)
