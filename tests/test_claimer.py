"""Who holds a claim, and whether it is dead (nous_sched/durable/_claimer.py): real processes, hostile names."""

import json
import socket
import subprocess
import sys
import time

import pytest

from nous_sched import ConfigError
from nous_sched.durable import _claimer
from nous_sched.durable._claimer import claim_alive, claimer, describe, lease_alive


def test_this_process_is_alive_and_a_reaped_child_is_dead():
    assert claim_alive(claimer()) is True
    child = subprocess.run(
        [sys.executable, "-c", "from nous_sched.durable._claimer import claimer; print(claimer())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    name = child.stdout.strip()
    assert json.loads(name)["pid"] != json.loads(claimer())["pid"]
    assert claim_alive(name) is False
    assert describe(name).startswith("pid ")


def test_a_reused_pid_or_a_reboot_is_dead_and_another_host_cannot_be_told():
    mine = json.loads(claimer())
    assert claim_alive(json.dumps({**mine, "start": mine["start"] + 1})) is False  # another process under the pid
    assert claim_alive(json.dumps({**mine, "boot": "another-boot"})) is False  # this host booted since
    assert claim_alive(json.dumps({**mine, "host": mine["host"] + "-elsewhere"})) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "pid 123",
        "\x00\ud800\u202e\U000e0041",
        "[" * 100_000,
        json.dumps({"pid": True}),
        json.dumps({"pid": 1e308}),
        json.dumps({"pid": -1, "host": "\ud800"}),
        "x" * 1_000_000,
        None,
        12,
    ],
    ids=range(10),
)
def test_a_hostile_name_is_never_judged_dead_and_is_described_briefly(name):
    assert claim_alive(name) in (None, False)
    if name is None or isinstance(name, int) or not str(name).startswith("{"):
        assert claim_alive(name) is None
    assert len(describe(name)) <= 250


def test_the_host_id_is_the_claimers_host(monkeypatch):
    monkeypatch.setenv("NOUS_SCHED_HOST_ID", "rack-7")
    name = _claimer.claimer()
    assert json.loads(name)["host"] == "rack-7" and _claimer.describe(name).endswith(" on rack-7")
    assert _claimer.claim_alive(name) is True  # this very process, judged on its own host
    monkeypatch.setenv("NOUS_SCHED_HOST_ID", "rack-8")
    assert _claimer.claim_alive(name) is None  # another host: a pid says nothing there
    assert _claimer.lease_alive(name, time.time() + 60, time.time()) is True
    assert _claimer.lease_alive(name, time.time() - 1, time.time()) is False
    assert _claimer.lease_alive(name, None, time.time()) is None  # no lease: never judged dead
    monkeypatch.delenv("NOUS_SCHED_HOST_ID")
    assert json.loads(_claimer.claimer())["host"] == socket.gethostname()


@pytest.mark.parametrize("until", [float("nan"), True, "9999999999", [1], {"x": 1}, None], ids=range(6))
def test_a_lease_that_is_not_a_number_never_judges_a_claim(until):
    other = json.dumps({**json.loads(claimer()), "host": "elsewhere"})
    assert lease_alive(other, until, time.time()) is None


@pytest.mark.parametrize("given", ["h" * 256, "rack\n7", "\u202erack", "x\x01"], ids=range(4))
def test_a_hostile_host_id_is_a_config_error_naming_it(monkeypatch, given):
    monkeypatch.setenv("NOUS_SCHED_HOST_ID", given)
    with pytest.raises(ConfigError, match="NOUS_SCHED_HOST_ID"):
        claimer()
