"""The paper studies' rig: a storage node process, an agent in this process (its standing PUTs and its
GETs), a compute process (a spawned child, as the compute node is one) and a fabric client of our own
that checks the namespace is empty between samples; all stopped at the end.

Used by the transfers (bench.study.paper, under a profile bench.study.paper_scaled) and by the GET
direction (bench.study.paper_get); each gives its own compute process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Rig:
    agent: Any
    storage: Any      # the storage node's ServiceProcess
    admin: Any        # a fabric client of our own (the benchmarks' host)
    compute: Any      # the compute process (a bench.study.child_process.ChildProcess)
    directory: Path   # the storage node's

    def __iter__(self):  # agent, storage, admin, compute = rig
        return iter((self.agent, self.storage, self.admin, self.compute))


@contextlib.contextmanager
def rig(directory: Path, compute_process: Callable[[str, str], Any], name: str, *, salt: str,
        namespace_size_bytes: int | None = None, admin_timeout_s: float | None = None,
        own_credentials: bool = False, **agent_settings: Any) -> Iterator[Rig]:
    """The rig in `directory` (storage node `name`); compute_process(fabric address, host NQN) makes the
    compute process; agent_settings go to the agent's SmartNicSettings."""
    from bench.stack import BENCH_NQN, bench_client, start_storage, use_credentials
    from kvtb.heap import keep_large_buffers_in_the_heap
    from smartnic.agent import Agent
    from smartnic.settings import SmartNicSettings, StorageNodeRef

    if own_credentials:
        use_credentials(directory)
    keep_large_buffers_in_the_heap()  # the agent runs in this process: as its main sets it up
    with contextlib.ExitStack() as stack:
        extra = {} if namespace_size_bytes is None else {"namespace_size_bytes": namespace_size_bytes}
        storage = start_storage(directory, name, **extra)
        stack.callback(storage.stop)
        node = StorageNodeRef(name, storage.addresses["admin"], storage.addresses["fabric"])
        agent = Agent(SmartNicSettings(listen_address="127.0.0.1:0", storage_nodes=(node,), salt=salt,
                                       eviction_policy="timer", fabric_security="auth", kv_mac=True,
                                       **agent_settings))
        agent.start()
        stack.callback(agent.close)
        deadline = time.monotonic() + 60
        while not agent.nodes.up():
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not reach the storage node within 60 s")
            time.sleep(0.02)
        admin = (bench_client(node.fabric_address) if admin_timeout_s is None
                 else bench_client(node.fabric_address, timeout_s=admin_timeout_s))
        admin.connect()
        stack.callback(admin.close)
        compute = compute_process(node.fabric_address, BENCH_NQN)
        stack.callback(compute.close)
        yield Rig(agent, storage, admin, compute, directory / f"storage-{name}")


def rusage_s() -> float:
    """This process's CPU seconds (the agent's, which runs here)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def wait_empty(admin, nsid: int, timeout_s: float = 120.0) -> None:
    """Until the storage node holds no key in the namespace (the agent's deletes are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while admin.list_keys(nsid, max_keys=1):
        if time.monotonic() > deadline:
            raise TimeoutError("stored keys were not deleted")
        time.sleep(0.005)
