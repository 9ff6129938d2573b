"""Where `kvtb bench smartnic` runs its agent (in its own process), its storage node and its stand-in
compute node, for each placement it compares side by side.

`shared` and `nic` are kvtb.placement's plans with the agent settings `kvtb up` gives them. The agent
runs in the benchmark's process, so that process is pinned to the agent's CPUs for the placement's
measurements (every thread: the agent's start after it) and put back after; the storage node is
started on its CPUs; the stand-in compute node is pinned in its child process.

`nic-own-core` is the benchmark's what-if for a small host: the fast path's process alone on the
last CPU, polling without sleeping, as `nic` gives it on a host of 8 CPUs or more, and everything
else (the agent's control plane, the storage node, the stand-in compute node) on the other CPUs.
On 2 CPUs that squeezes the compute node's share, so only trigger-to-fire is measured in it, and only
when asked (`--placements ... nic-own-core`): there the fast path's PUT and I/O threads share the
compute node's CPU, and when the compute node keeps it busy the fire waits for the interpreter lock
those threads hold while descheduled (milliseconds). A NIC core of its own pays off where the NIC
has two or more (placement nic on 8 CPUs or more), not by squeezing everything else onto one.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from kvtb import placement

OWN_CORE = "nic-own-core"
LAYOUTS = (*placement.PLACEMENTS, OWN_CORE)


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    agent: tuple[int, ...]     # the benchmark's process (the agent's control plane, and its fast path
    storage: tuple[int, ...]   # unless fastpath_cpus names its own)
    compute: tuple[int, ...]
    settings: dict             # SmartNicSettings fields

    def record(self) -> dict:
        """The placement record of this layout (bench.results.record_placement's form)."""
        fast = self.settings.get("fastpath_cpus") or placement.format_cpus(self.agent)
        return {"smartnic": placement.format_cpus(self.agent), "fastpath": fast,
                "storage": placement.format_cpus(self.storage), "compute": placement.format_cpus(self.compute)}


def layout_of(name: str, cpus: tuple[int, ...] | None = None) -> Layout:
    """The layout `name` on `cpus` (default: this process's); ValueError where it cannot be honoured."""
    cpus = tuple(sorted(cpus or placement.current_cpus()))
    if name == OWN_CORE:
        if len(cpus) < 2:
            raise ValueError(f"{OWN_CORE} needs at least 2 CPUs")
        rest = cpus[:-1]
        return Layout(name, cpus, rest, rest, {"fastpath": "process", "watcher_busy_poll": True,
                                               "fastpath_cpus": placement.format_cpus(cpus[-1:])})
    plan = placement.plan(name, cpus)
    given = placement.agent_settings(name, plan["smartnic"] if name == "nic" else ())
    settings = {"fastpath": given["fastpath"], "watcher_busy_poll": given["watcher_busy_poll"] == "true",
                "fastpath_cpus": given["fastpath_cpus"], "watcher_nap_us": float(given["watcher_nap_us"])}
    return Layout(name, plan["smartnic"], plan["storage"], plan["compute"], settings)


@contextlib.contextmanager
def pinned(layout: Layout) -> Iterator[Layout]:
    """This process (every thread) on the layout's agent CPUs until the block ends; then back."""
    before = placement.current_cpus()
    placement.apply(layout.agent)
    try:
        yield layout
    finally:
        placement.apply(before)
