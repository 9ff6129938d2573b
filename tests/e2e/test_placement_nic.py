"""The paper's chat in placement `nic`: the NIC's services on their own core, standing PUTs and
restores in the fast path's own process; the follow-ups restore their KV and reply as resident KV
does in the same placement (the same torch threads: equal float math)."""
import os
import re
from pathlib import Path

import pytest

from .conftest import assert_restored_as_resident, paper_messages, run_conversation, start_up

pytestmark = [pytest.mark.service, pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement nic needs 2 CPUs")]


def cpus_of(pid: int) -> set[str]:
    """The Cpus_allowed_list of every thread of a process."""
    return {re.search(r"Cpus_allowed_list:\s*(\S+)", (task / "status").read_text()).group(1)
            for task in Path(f"/proc/{pid}/task").iterdir()}


def processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])))
            except (OSError, ValueError):
                continue
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_conversation_in_the_nic_placement_restores_and_replies_as_resident(tmp_path_factory):
    replies = {}
    for policy in ("triggered", "resident"):
        up = start_up(tmp_path_factory, policy, placement="nic")
        try:
            assert up.proc.ready["placement"] == "nic"
            cpus = up.proc.ready["cpus"]
            assert cpus["compute"] != cpus["smartnic"] and cpus["storage-0"] == cpus["smartnic"]
            client = up.client("alice")
            replies[policy] = run_conversation(client, paper_messages())
            client.close()
            if policy == "triggered":  # the fast path's own process, a child of this agent, on the NIC's CPU
                fastpath = [pid for pid, parent in processes() if b"smartnic.fastpath" in cmdline(pid)
                            and b"serve\0smartnic" in cmdline(parent) and str(up.config).encode() in cmdline(parent)]
                assert len(fastpath) == 1 and cpus_of(fastpath[0]) == {cpus["smartnic"]}
        finally:
            up.stop()
    assert_restored_as_resident(replies)
