"""The fast path in a process of its own (`fastpath: process`, busy polling): the agent's contract
holds as with the thread (blocks leave by their descriptors and come back bit-identical, refusals
are counted and the block re-armed), and the child never outlives the agent."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.smartnic import test_agent_service as contract
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import agent_env
from tests.conftest import secure_channel
from kvtb_proto import smartnic_pb2_grpc


@pytest.fixture
def agent(start_service, storage):
    proc = start_service("agent", "serve", "smartnic",
                         env=agent_env(storage, fastpath="process", watcher_busy_poll="true"))
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    yield proc, smartnic_pb2_grpc.SmartNicStub(channel)
    channel.close()


@pytest.fixture
def compute(agent):
    with compute_beside(agent[0].addresses["grpc"]) as triple:
        yield triple


def children(pid: int) -> list[int]:
    """Processes whose parent is pid (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def fastpath_child(agent_pid: int) -> int:
    for child in children(agent_pid):
        try:
            if b"smartnic.fastpath" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            continue
    raise AssertionError(f"agent {agent_pid} has no fast path process")


def test_blocks_leave_by_descriptor_and_come_back_bit_identical(compute, storage):
    contract.test_a_block_leaves_by_its_descriptor_and_comes_back_bit_identical(compute, storage)


def test_forged_stale_and_out_of_range_descriptors_are_refused_and_the_block_rearmed(compute):
    contract.test_a_descriptor_that_does_not_describe_its_block_is_refused_and_counted(compute)


def test_a_put_reads_the_block_when_it_fires(compute):
    contract.test_a_put_reads_the_block_when_it_fires(compute)


def test_the_fast_path_process_dies_with_the_agent(agent):
    proc, _ = agent
    child = fastpath_child(proc.proc.pid)
    os.kill(proc.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists():
        status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
        if "State:\tZ" in status:
            break  # dead, waiting for its (gone) parent's reaper
        assert time.monotonic() < deadline, "the fast path process outlived its agent"
        time.sleep(0.05)


def test_a_storage_node_down_ends_the_restore_with_errors_in_bounded_time(compute, storage):
    contract.test_a_storage_node_down_ends_the_restore_with_errors_in_bounded_time(compute, storage)


def test_a_restore_after_the_fast_path_died_ends_on_its_error_counters(agent, compute):
    """The fast path's process gone (kill -9): a follow-up's restore does not hang, every block ends on its
    error part (the compute node recomputes), and the agent goes on answering."""
    pool, fake, channel = compute
    pool.offload(contract.IDS, contract.USER, contract.CTX)
    os.kill(fastpath_child(agent[0].proc.pid), signal.SIGKILL)
    start = time.monotonic()
    contract.turn(channel, contract.IDS + [7])
    assert time.monotonic() - start < 8
    assert fake.outcomes[-1] and all(err for _, err in fake.outcomes[-1])
    assert contract.stats(pool).errors_by_kind["fastpath_gone"] == len(fake.outcomes[-1])
