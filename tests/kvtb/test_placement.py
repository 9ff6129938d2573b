"""CPU lists, the placements' plans, and pinning this process."""
from __future__ import annotations

import os
import threading

import pytest

from kvtb import placement
from kvtb.placement import apply, format_cpus, parse_cpus, plan
from kvtb.settings import SettingsError


def test_parse_cpus_sorts_and_drops_repeats():
    assert parse_cpus("0-2,5") == (0, 1, 2, 5)
    assert parse_cpus(" 5, 1-2 ,2,0 ") == (0, 1, 2, 5)
    assert parse_cpus("3") == (3,)
    assert parse_cpus("") == () and parse_cpus("  ") == ()


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-", "0,,2", "1-b", "0.5"])
def test_parse_cpus_refuses_what_is_not_a_cpu_list(text):
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpus(text)


def test_format_cpus_is_parse_cpus_backwards():
    assert format_cpus((0, 1, 2, 5)) == "0-2,5"
    assert format_cpus([7, 3, 4]) == "3-4,7"
    assert format_cpus(()) == ""
    for text in ("0", "0-3", "1,3,5-9"):
        assert format_cpus(parse_cpus(text)) == text


def test_shared_puts_every_service_on_every_cpu():
    assert plan("shared", (0, 1)) == {s: (0, 1) for s in ("storage", "smartnic", "compute", "frontend")}
    assert plan("shared", [3]) == {s: (3,) for s in placement.SERVICES}


def test_shared_defaults_to_this_processs_cpus():
    assert plan("shared")["compute"] == tuple(sorted(os.sched_getaffinity(0)))


def test_nic_on_two_cpus_is_one_and_one():
    p = plan("nic", (0, 1))
    assert p["compute"] == (0,)
    assert p["smartnic"] == p["storage"] == p["frontend"] == (1,)


def test_nic_on_eight_cpus_gives_the_nic_the_last_quarter():
    p = plan("nic", range(8))
    assert p["compute"] == (0, 1, 2, 3, 4, 5)
    assert p["smartnic"] == (6, 7)  # the agent's set holds its fast path's CPU (7), which nothing else gets
    assert p["storage"] == p["frontend"] == (6,)
    assert placement.agent_settings("nic", p["smartnic"]) == {
        "fastpath": "process", "watcher_busy_poll": "true", "fastpath_cpus": "7", "watcher_nap_us": "0"}


def test_a_fast_path_polls_without_sleeping_only_on_a_cpu_of_its_own():
    assert placement.agent_settings("nic", (1,)) == {"fastpath": "process", "watcher_busy_poll": "false",
                                                      "fastpath_cpus": "", "watcher_nap_us": placement.NIC_NAP_US}
    assert placement.agent_settings("shared", (0, 1)) == {"fastpath": "thread", "watcher_busy_poll": "false",
                                                           "fastpath_cpus": "", "watcher_nap_us": "0"}
    p = plan("nic", range(16))
    assert format_cpus(p["compute"]) == "0-11" and format_cpus(p["smartnic"]) == "12-15"
    assert plan("nic", (2, 4, 9))["smartnic"] == (9,)  # the last of the set, not of the machine


def test_the_offload_thread_runs_on_the_nics_cpus_that_no_fast_path_has_to_itself():
    assert placement.compute_settings_in("nic", plan("nic", (0, 1)))["offload_thread_cpus"] == "1"
    assert placement.compute_settings_in("nic", plan("nic", range(8)))["offload_thread_cpus"] == "6"
    assert placement.compute_settings_in("shared", plan("shared", (0, 1))) == {"offload_thread_cpus": "", "offload_thread_nap_us": "0"}


def test_nic_on_one_cpu_cannot_be_honoured():
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        plan("nic", (0,))


def test_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="unknown placement 'spread'"):
        plan("spread", (0, 1))


def test_formatted_plan():
    assert placement.formatted(plan("nic", range(4))) == {"storage": "3", "smartnic": "3", "compute": "0-2",
                                                           "frontend": "3"}


@pytest.fixture
def restore_affinity():
    before = {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}
    yield before
    for tid, cpus in before.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass


def _task_cpus() -> dict[int, set[int]]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = os.sched_getaffinity(int(tid))
        except ProcessLookupError:
            pass
    return out


def test_apply_pins_every_thread_then_the_whole_set_again(restore_affinity):
    cpus = sorted(os.sched_getaffinity(0))
    subset = cpus[-1:]
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()  # a thread that exists before apply: it moves too
    try:
        assert apply(format_cpus(subset)) == tuple(subset)
        tasks = _task_cpus()
        assert other.native_id in tasks
        assert all(c == set(subset) for c in tasks.values()), tasks
        later: list[set[int]] = []
        t = threading.Thread(target=lambda: later.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
        assert later == [set(subset)]  # a thread started later inherits it
        assert apply(cpus) == tuple(cpus)  # numbers work as well as a list
        assert all(c == set(cpus) for c in _task_cpus().values())
    finally:
        stop.set()
        other.join()


def test_apply_of_nothing_leaves_the_process_as_it_is(restore_affinity):
    before = os.sched_getaffinity(0)
    assert apply("") == tuple(sorted(before))
    assert os.sched_getaffinity(0) == before


def test_apply_refuses_a_cpu_the_machine_has_not(restore_affinity):
    beyond = max(placement.machine_cpus()) + 1
    before = os.sched_getaffinity(0)
    with pytest.raises(SettingsError, match=f"CPU {beyond} is not one of this machine's"):
        apply(str(beyond))
    assert os.sched_getaffinity(0) == before


def test_apply_refuses_a_bad_list():
    with pytest.raises(ValueError, match="CPU list"):
        apply("0-x")


def test_pin_logs_the_set(restore_affinity, caplog):
    caplog.set_level("INFO", logger="kvtb.placement")
    cpus = placement.pin("storage", "")
    assert cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert f"storage runs on CPUs {format_cpus(cpus)} (all it may use)" in caplog.text


@pytest.mark.parametrize("module, cls, section", [
    ("compute_node.settings", "ComputeSettings", "compute"),
    ("smartnic.settings", "SmartNicSettings", "smartnic"),
    ("storage_node.settings", "StorageSettings", "storage"),
    ("chat_frontend.settings", "FrontendSettings", "frontend"),
])
def test_every_service_reads_cpus_from_its_environment(module, cls, section):
    import importlib

    from kvtb.settings import load_settings
    settings_cls = getattr(importlib.import_module(module), cls)
    assert settings_cls().cpus == ""
    env = {f"KVTB_{section.upper()}_CPUS": "0-1,3"}
    assert load_settings(settings_cls, section, None, environ=env).cpus == "0-1,3"
    with pytest.raises(SettingsError, match="CPU list"):
        load_settings(settings_cls, section, None, environ={f"KVTB_{section.upper()}_CPUS": "3-1"})


def test_shares_split_the_compute_cpus_among_replicas():
    assert placement.shares((0, 1), 2) == [(0,), (1,)]
    assert placement.shares(range(7), 3) == [(0, 1), (2, 3), (4, 5, 6)]
    assert placement.shares((0, 1, 2), 1) == [(0, 1, 2)]
    assert placement.shares((4,), 3) == [(4,), (4,), (4,)]  # fewer CPUs than replicas: they share
    assert placement.shares((0, 1), 3) == [(0,), (1,), (0,)]
    with pytest.raises(ValueError):
        placement.shares((), 2)


def test_shared_with_replicas_splits_only_the_compute_nodes():
    p = plan("shared", (0, 1), replicas=2)
    assert (p["compute"], p["compute-1"]) == ((0,), (1,))
    assert p["smartnic"] == p["smartnic-1"] == p["storage"] == p["frontend"] == (0, 1)
    assert plan("shared", (0, 1)) == plan("shared", (0, 1), replicas=1)  # one replica: as before
    assert list(plan("shared", (0, 1), replicas=2)) == ["storage", "smartnic", "compute", "frontend",
                                                        "smartnic-1", "compute-1"]


def test_nic_with_replicas_gives_each_fast_path_a_nic_cpu_when_there_are_enough():
    p = plan("nic", range(16), replicas=3)  # NIC: 12-15; 12 for the rest, 13, 14, 15 one fast path each
    assert [format_cpus(p[n]) for n in ("compute", "compute-1", "compute-2")] == ["0-3", "4-7", "8-11"]
    assert [format_cpus(p[n]) for n in ("smartnic", "smartnic-1", "smartnic-2")] == ["12-13", "12,14", "12,15"]
    assert p["storage"] == p["frontend"] == (12,)
    assert [placement.agent_settings_in("nic", p, n)["fastpath_cpus"] for n in ("smartnic", "smartnic-1",
                                                                                  "smartnic-2")] == ["13", "14", "15"]
    p = plan("nic", range(8), replicas=2)  # NIC: 6-7, too few: the agents share them, no busy poll: naps
    assert p["smartnic"] == p["smartnic-1"] == (6, 7)
    assert not placement.own_fast_path(p, "smartnic")
    assert placement.agent_settings_in("nic", p, "smartnic-1") == {"fastpath": "process", "watcher_busy_poll": "false",
                                                                   "fastpath_cpus": "", "watcher_nap_us": "1000"}
    assert plan("nic", range(8), replicas=1) == plan("nic", range(8))
    assert placement.agent_settings_in("nic", plan("nic", range(8)), "smartnic")["fastpath_cpus"] == "7"


def test_replica_names_and_sections():
    assert placement.replica_services(0) == ("smartnic", "compute")
    assert placement.replica_services(3) == ("smartnic-3", "compute-3")
    assert [placement.section(n) for n in ("compute-1", "smartnic", "storage")] == ["compute", "smartnic", "storage"]
    with pytest.raises(ValueError, match="replicas must be a whole number"):
        plan("shared", (0, 1), replicas=0)
