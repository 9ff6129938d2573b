"""No head-of-line blocking across hosts: a full queue, a slow fsync and a stall, on a node in this process."""
from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from fabric import status as st
from fabric.client import StorageStatusError
from kvtb_proto import nvmeof_pb2 as pb
from storage_node.node import serve
from storage_node.stall_watch import LoopWatch

from .conftest import GOOD_HOST, settings_for
from tests.conftest import fabric_client

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

OTHER_HOST = "nqn.2026-11.org.kvtestbed:other-host"
DEPTH = 4


@pytest.fixture
def node(tmp_path):
    n = serve(settings_for(tmp_path, queue_depth=DEPTH, metrics_address="127.0.0.1:0",
                           allowed_hosts={GOOD_HOST: "*", OTHER_HOST: "*"}))
    n.start()
    yield n
    n.stop()


@pytest.fixture
def held_commit(node):
    """Namespace 1's data fdatasync held until the returned Event is set (a very slow disk)."""
    gate = threading.Event()
    ns = node.subsystem.namespaces[1]
    real = ns.sync_data

    def slow() -> None:
        gate.wait(30)
        real()
    ns.sync_data = slow
    yield gate
    gate.set()


def store_capsule(key: bytes, value: bytes) -> pb.CommandCapsule:
    return pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=key,
                             value_length=len(value))


def test_one_hosts_full_queue_leaves_another_hosts_commands_answered(node, held_commit):
    address = node.addresses["fabric"]
    with fabric_client(address, GOOD_HOST, queue_depth=64, timeout_s=30) as a, \
            fabric_client(address, OTHER_HOST, timeout_s=5) as b:
        held_commit.set()
        b.store(1, b"before", [b"stored before the disk slowed"])
        held_commit.clear()
        value = os.urandom(64 << 10)
        # host A: DEPTH Stores stuck in the held commit, DEPTH parked behind them, DEPTH more refused
        futures = [a.submit(store_capsule(b"a%d" % i, value), [value]) for i in range(3 * DEPTH)]
        refused = [f.result(5) for f in futures[2 * DEPTH:]]
        assert all((r.response.status_code_type, r.response.status_code) == st.COMMAND_INTERRUPTED for r in refused)
        assert "full" in refused[0].response.message
        assert not any(f.done() for f in futures[:2 * DEPTH])  # A's own are held (the disk), none lost
        # host B meanwhile: reads, Exist, List, NVM writes and reads are all answered, promptly
        start = time.monotonic()
        assert bytes(b.retrieve(1, b"before").payload()) == b"stored before the disk slowed"
        assert b.exist(1, b"before") and b"before" in b.list_keys(1)
        block = os.urandom(4096)
        b.submit(pb.CommandCapsule(command_set=pb.NVM, opcode=pb.NVM_WRITE, namespace_id=2, starting_lba=3,
                                   number_of_lbas=1), [block]).result(5).raise_for_status()
        read = b.submit(pb.CommandCapsule(command_set=pb.NVM, opcode=pb.NVM_READ, namespace_id=2, starting_lba=3,
                                          number_of_lbas=1)).result(5).raise_for_status()
        assert bytes(read.payload()) == block and time.monotonic() - start < 3
        held_commit.set()  # the disk catches up: everything A was acknowledged is stored
        assert all(f.result(20).ok for f in futures[:2 * DEPTH])
        assert all(bytes(a.retrieve(1, b"a%d" % i).payload()) == value for i in range(2 * DEPTH))
        with pytest.raises(StorageStatusError):  # the refused were never executed
            a.retrieve(1, b"a%d" % (2 * DEPTH))


def test_a_host_that_reconnects_behind_a_slow_commit_leaves_the_other_host_answered(node, held_commit):
    """The stall of issue 42, item 3: one agent's Stores wait on a slow fdatasync past its timeout, it reconnects
    (a new session of the same host: the same queue pair) and sends as many again. Before, that host's queue
    held depth commands waiting and the node stopped reading its socket for every host: the other agent
    heard nothing until the disk caught up, and the node logged nothing."""
    address = node.addresses["fabric"]
    value = os.urandom(4096)
    with fabric_client(address, OTHER_HOST, timeout_s=5) as b:
        held_commit.set()
        b.store(1, b"other", [b"the other agent's"])
        held_commit.clear()
        first = fabric_client(address, GOOD_HOST, timeout_s=30)
        first.connect()
        for _ in range(3 * DEPTH):  # a session that ran a while: its command ids are past a new one's
            first.exist(1, b"other")
        stuck = [first.submit(store_capsule(b"old%d" % i, value), [value]) for i in range(DEPTH)]
        with fabric_client(address, GOOD_HOST, queue_depth=64, timeout_s=30) as second:  # the reconnect
            again = [second.submit(store_capsule(b"new%d" % i, value), [value]) for i in range(DEPTH + 1)]
            assert (again[-1].result(5).response.status_code_type,
                    again[-1].result(5).response.status_code) == st.COMMAND_INTERRUPTED
            start = time.monotonic()
            assert bytes(b.retrieve(1, b"other").payload()) == b"the other agent's" and b.exist(1, b"other")
            assert time.monotonic() - start < 2
            held_commit.set()
            assert all(f.result(20).ok for f in stuck + again[:DEPTH])
        first.close()


def test_a_command_outstanding_over_a_second_is_logged_with_what_it_waits_on(node, held_commit, caplog):
    caplog.set_level(logging.WARNING)
    value = os.urandom(4096)
    with fabric_client(node.addresses["fabric"], GOOD_HOST, queue_depth=64, timeout_s=30) as a:
        futures = [a.submit(store_capsule(b"s%d" % i, value), [value]) for i in range(DEPTH + 1)]
        time.sleep(1.8)
        held_commit.set()
        assert all(f.result(20).ok for f in futures)
        time.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    stalls = [m for m in messages if m.startswith("stall: ")]
    assert any(f"of host {GOOD_HOST} on queue" in m and "(the oldest kv_store (command id" in m and
               "waiting on group commit of namespace 1: committer of namespace 1: a batch of" in m and
               "in fdatasync of the data file" in m for m in stalls), stalls
    assert any("waiting on parked: its queue is full" in m for m in stalls), stalls
    assert len(stalls) <= 3  # one line per host, queue and stage, not one per command
    assert any(m.startswith(f"stall over: {DEPTH + 1} stalled commands of host {GOOD_HOST}") or
               m.startswith("stall over: ") and "stalled command" in m for m in messages)
    assert any("a group commit of" in r.getMessage() and "in 1 fdatasync of the data file" in r.getMessage()
               for r in caplog.records)
    assert node.stats.snapshot()["longest_command_s"] > 1.5 and node.stats.snapshot()["stalls"] >= DEPTH + 1


def test_a_busy_fabric_thread_is_logged_with_where_it_is(node, caplog):
    caplog.set_level(logging.WARNING)
    ns = node.subsystem.namespaces[1]
    real = ns.exist
    ns.exist = lambda key: (time.sleep(1.6), real(key))[1]  # Exist runs on the fabric thread
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=10) as a:
        assert not a.exist(1, b"nothing")
        time.sleep(0.6)
    messages = [r.getMessage() for r in caplog.records]
    stall = next(m for m in messages if m.startswith("stall: the fabric thread has been busy"))
    assert "handling received capsules" in stall and "_kv_exist" in stall  # what it does, and its stack
    assert any(m.startswith("stall over: the fabric thread was busy for") for m in messages)


def test_fsync_runs_on_the_committer_and_sync_threads_only(node, monkeypatch):
    seen: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (seen.append(threading.current_thread().name), real(fd))[1])
    value = os.urandom(300 << 10)  # a Store that runs on an I/O worker
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=10) as a:
        for i in range(4):
            a.store(1, b"f%d" % i, [value])
        a.delete(1, b"f0")
        a.submit(pb.CommandCapsule(command_set=pb.NVM, opcode=pb.NVM_WRITE, namespace_id=2, starting_lba=0,
                                   number_of_lbas=1), [bytes(4096)]).result(5).raise_for_status()
        futures = [a.submit(pb.CommandCapsule(command_set=pb.NVM, opcode=pb.NVM_FLUSH, namespace_id=nsid))
                   for nsid in (1, 2, 2)]
        assert all(f.result(5).ok for f in futures)
    assert {"commit-ns1", "sync-ns1", "sync-ns2"} <= set(seen)
    assert set(seen) <= {"commit-ns1", "sync-ns1", "sync-ns2"}, seen  # never "fabric", never an "io" worker


def test_loop_watch_reports_a_stall_once_and_its_end():
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    log = logging.getLogger("storage_node.stall_watch")
    log.addHandler(handler)
    watch = LoopWatch("test", threshold=0.1, period=0.02)
    go = threading.Event()

    def loop() -> None:
        go.wait(5)
        watch.busy("waiting on purpose", lambda: "a detail")
        time.sleep(0.4)
        watch.idle()
    thread = threading.Thread(target=loop)
    thread.start()
    watch.start(thread.ident)
    try:
        go.set()
        thread.join()
        time.sleep(0.1)
    finally:
        watch.stop()
        log.removeHandler(handler)
    starts = [m for m in logged if m.startswith("stall: the test thread")]
    assert len(starts) == 1 and "waiting on purpose (a detail)" in starts[0] and "in loop" in starts[0]
    assert any(m.startswith("stall over: the test thread was busy for") for m in logged) and watch.stalls == 1


def test_a_node_that_stays_overloaded_logs_each_host_and_stage_once_per_repeat(caplog):
    from types import SimpleNamespace
    from storage_node.queues import QueuePair
    from storage_node.stall_watch import CommandWatch
    caplog.set_level(logging.WARNING)
    controller = SimpleNamespace(host_nqn="nqn.h", qid=1, queue=QueuePair(1, depth=1000))
    watch = CommandWatch(repeat_s=10.0)

    def command(cid: int, admitted: float):
        cmd = SimpleNamespace(capsule=pb.CommandCapsule(command_id=cid, key=b"k"), spec=SimpleNamespace(name="kv_store"),
                              controller=controller, stage="waiting for an I/O worker", waits_on=None,
                              admitted=admitted, stall_logged=False)
        controller.queue.submit(cid, cmd)
        return cmd
    for second in range(30):  # every second 5 more commands pass the threshold
        for i in range(5):
            command(second * 5 + i, admitted=100.0 + second - 1.5)
        watch.check([controller], now=100.0 + second)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stall: ")]
    assert len(lines) == 3 and "5 commands of host nqn.h on queue 1" in lines[0]
    assert "45 more waited so in the last 10 s" in lines[1]
