"""Who holds a claim, and whether it is dead (nous_sched/durable/_claimer.py): real processes, hostile names."""

import json
import subprocess
import sys

import pytest

from nous_sched.durable._claimer import claim_alive, claimer, describe


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
