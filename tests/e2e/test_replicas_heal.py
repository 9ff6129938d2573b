"""Replicas heal (`kvtb up --replicas 2`, the real model): a compute node killed with -9 is restarted with its
agent and back in the frontend's rotation within a bound, serving turns; an agent killed with -9 is
restarted alone while its compute node waits for it (same process, pool kept, registered again); and
`kvtb up` stopped right after a kill -9 leaves none of its regions in /dev/shm."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
import yaml

from chat_client.client import FrontendClient
from kvtb import regions
from tests.kvtb.metrics_scrape import scrape, value

from .conftest import USERS, Up, run_turn

pytestmark = [pytest.mark.service, pytest.mark.slow]

BACK_WITHIN_S = 240  # a kill -9 of a compute node to its replica serving again (it loads the model again)


@pytest.fixture(scope="module")
def heal(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal")
    up = Up(root, "triggered", replicas=2, frontend={"routing": "round_robin", "health_interval_s": 0.5})
    config = yaml.safe_load(up.config.read_text())
    node = f"heal{os.getpid()}"  # regions of our own: kvtb-heal<pid>-<pid> and kvtb-heal<pid>-1-<pid>
    config["compute"]["node_name"] = node
    up.config.write_text(yaml.safe_dump(config))
    up.node = node
    up.start()
    yield up
    if up.proc.alive():
        up.stop()


def ours(up) -> list[str]:
    """The regions of this deployment's compute nodes in /dev/shm."""
    directory = regions.shm_dir()
    return sorted(n for n in os.listdir(directory) if n.startswith(f"kvtb-{up.node}-"))


def replica_up(up, replica: str) -> float:
    return value(scrape(up.services["frontend"]["metrics"]), "kvtb:replica_up", replica=replica)


def wait(condition, timeout_s: float, what: str, up) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s; kvtb up:\n{up.proc.log_tail(40)}")
        time.sleep(0.2)
    return time.monotonic() - start


def restarts(up) -> list[dict[str, int]]:
    """The pids of each restart `kvtb up` reported ("... restarted (...: pids smartnic-1 12, compute-1 34)")."""
    found = re.findall(r"restarted \([^:]*: pids ([^)]*)\)", up.proc.log_path.read_text())
    return [{name: int(pid) for name, pid in (p.split() for p in line.split(", "))} for line in found]


def restarted_pids(up) -> dict[str, int]:
    """The last restart's pids."""
    return (restarts(up) or [{}])[-1]


def pids_now(up) -> dict[str, int]:
    """Each service's pid now: as started, then as restarted."""
    pids = dict(up.proc.ready["pids"])
    for restart in restarts(up):
        pids.update(restart)
    return pids


def served_by(up, replica: str, tries: int = 4):
    """A new conversation's turns until one is served by replica (round_robin alternates): its summary."""
    client = FrontendClient(up.frontend, USERS["alice"])
    try:
        for i in range(tries):
            text, summary = run_turn(client, f"Say hello to number {i}.", max_new_tokens=8)
            if summary.replica == replica:
                return text, summary
    finally:
        client.close()
    raise AssertionError(f"no turn went to {replica} in {tries}")


def test_a_killed_compute_node_is_back_in_the_rotation(heal):
    pid = heal.proc.ready["pids"]["compute-1"]
    region = f"kvtb-{heal.node}-1-{pid}"
    assert region in ours(heal)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait(lambda: region not in ours(heal), 10, "the dead node's region removed", heal)
    wait(lambda: replica_up(heal, "replica-1") == 0, 30, "replica-1 out of the rotation", heal)
    served_by(heal, "replica-0", tries=2)  # the other one serves meanwhile
    wait(lambda: replica_up(heal, "replica-1") == 1, BACK_WITHIN_S, "replica-1 back in the rotation", heal)
    back = time.monotonic() - killed
    text, summary = served_by(heal, "replica-1")
    serving = time.monotonic() - killed
    print(f"\nkill -9 of compute-1 to replica-1 back in the rotation: {back:.1f} s; to a turn served by it: "
          f"{serving:.1f} s")
    assert text and summary.tokens_out > 0
    pids = restarted_pids(heal)
    assert set(pids) == {"smartnic-1", "compute-1"} and pids["compute-1"] != pid  # the pair restarted
    assert heal.proc.alive()


def test_a_killed_agent_is_restarted_and_its_compute_node_waits(heal):
    before = pids_now(heal)
    compute_log = heal.root / "var" / "logs" / "compute-1.log"
    registered = compute_log.read_text().count("registered again")
    killed = time.monotonic()
    os.kill(before["smartnic-1"], signal.SIGKILL)
    wait(lambda: restarted_pids(heal).get("smartnic-1", before["smartnic-1"]) != before["smartnic-1"], 120,
         "the agent restarted", heal)
    assert "compute-1" not in restarted_pids(heal)  # the agent alone
    wait(lambda: compute_log.read_text().count("registered again") > registered, 60,
         "the compute node registered again", heal)
    wait(lambda: replica_up(heal, "replica-1") == 1, 60, "replica-1 back in the rotation", heal)
    text, _ = served_by(heal, "replica-1")
    print(f"\nkill -9 of smartnic-1 to replica-1 serving again: {time.monotonic() - killed:.1f} s")
    assert text
    os.kill(before["compute-1"], 0)  # the same compute node all along (kvtb up reaps a dead one within 0.5 s)
    since = heal.proc.log_path.read_text().split("smartnic-1 of replica-1 exited")[-1]
    assert "compute-1 of replica-1 exited" not in since


def test_stopped_after_a_kill_9_no_region_is_left(heal):
    pids = pids_now(heal)
    assert ours(heal) == sorted(f"kvtb-{heal.node}{suffix}-{pids[name]}" for name, suffix in (("compute", ""),
                                                                                                ("compute-1", "-1")))
    os.kill(pids["compute-1"], signal.SIGKILL)
    os.kill(pids["compute"], signal.SIGKILL)
    heal.stop()
    assert ours(heal) == []
