"""CPU placement: which CPUs each service runs on.

A CPU list is Linux's notation ("0-2,5"; "" means every CPU this process may use). A placement
names a plan, service -> CPUs:

- `shared`: every service on every CPU of the set (what an unpinned deployment does);
- `nic`: the SmartNIC agent, the storage nodes and the frontend on the NIC's cores, the last
  max(1, n // 4) CPUs of the set, and the compute node on the rest (on 2 CPUs: 1 and 1; on 1 CPU
  it cannot be honoured).

With several replicas (`kvtb up --replicas N`: an agent and a compute node each), replica 0's are
`smartnic` and `compute` and replica i's `smartnic-i` and `compute-i` in the plan (their process
names), and the compute CPUs (every CPU under `shared`, the non-NIC ones under `nic`) are split among
the compute nodes in contiguous shares whose sizes differ by one at most (`shares`): on 2 CPUs under
`shared`, 2 replicas get one CPU each; with fewer compute CPUs than replicas, compute node i shares
CPU i mod n with others. Under `nic` the agents share the NIC's cores; with at least N + 1 of them
each agent's fast path has one of the last N to itself (busy polling), else every fast path waits
on its doorbell.

`apply(cpus)` pins the whole current process to a set: every thread it has now (threads started
later inherit the set from the one that starts them), so a service applies it first thing.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvtb.settings import SettingsError

logger = logging.getLogger(__name__)

PLACEMENTS = ("shared", "nic")
SERVICES = ("storage", "smartnic", "compute", "frontend")
NIC_SERVICES = ("storage", "smartnic", "frontend")  # on the NIC's cores under `nic`
OFFLOAD_NAP_US = "200"  # the compute node's offload thread on the NIC's CPUs looks for work this often
NIC_NAP_US = "1000"  # a fast path sharing its NIC CPU naps this long (a wake-up costs ~30 µs here: ~3% of it)


def replica_services(index: int) -> tuple[str, str]:
    """(agent, compute node) names of replica `index` in a plan: smartnic, compute for 0; smartnic-i, compute-i."""
    return ("smartnic", "compute") if index == 0 else (f"smartnic-{index}", f"compute-{index}")


def section(service: str) -> str:
    """The settings section of a plan's service ("compute-1" -> "compute", "storage" -> "storage")."""
    return service.split("-", 1)[0]


def shares(cpus: Iterable[int], count: int) -> list[tuple[int, ...]]:
    """`cpus` split into `count` contiguous shares, sizes differing by one at most; with fewer CPUs than
    shares, share i is CPU i mod n (shared)."""
    cpus = tuple(sorted(set(cpus)))
    if count < 1 or not cpus:
        raise ValueError(f"placement: cannot split {format_cpus(cpus) or 'no CPUs'} into {count} shares")
    if len(cpus) < count:
        return [(cpus[i % len(cpus)],) for i in range(count)]
    return [cpus[i * len(cpus) // count:(i + 1) * len(cpus) // count] for i in range(count)]


def own_fast_path(plan: Mapping[str, Iterable[int]], agent: str) -> bool:
    """Whether the agent's last CPU is its alone in the plan (so its fast path may poll it without
    sleeping): it has another CPU for its other threads and no other service runs there."""
    mine = tuple(sorted(set(plan[agent])))
    return len(mine) >= 2 and not any(mine[-1] in set(cpus) for name, cpus in plan.items() if name != agent)


def agent_settings_in(name: str, plan: Mapping[str, Iterable[int]], agent: str = "smartnic") -> dict[str, str]:
    """agent_settings for the agent `agent` of a plan: under `nic`, a fast path process that busy-polls
    only a CPU of its own (own_fast_path), else waits on the doorbell."""
    if name != "nic":
        return agent_settings(name)
    if own_fast_path(plan, agent):
        return agent_settings(name, plan[agent])
    return agent_settings(name, tuple(plan[agent])[-1:])


def agent_settings(name: str, nic: Iterable[int] = ()) -> dict[str, str]:
    """The agent's fast path settings under placement `name` (nic: the NIC's CPUs of its plan).

    `nic`: standing PUTs fire in the fast path's own process (smartnic.fastpath). With two NIC CPUs or
    more, that process has the last one to itself and polls it without ever sleeping, as a NIC's
    engine does (the agent's other threads, the storage nodes and the frontend keep to the others).
    With one, it shares its CPU with the NIC's data movement, and a poller that never sleeps would
    hold the CPU the PUTs it fires need (measured: milliseconds): it naps instead (a real-time thread,
    NIC_NAP_US at a time for a while after a fire, then on the doorbell), so that while a decode runs
    the compute node's counter stores wake no one (a wake from the compute node's CPU cost its engine
    thread 25-200 µs); the naps cost the NIC's CPU, not the compute node's. `shared`: the fast path is
    a thread of the agent, on the doorbell (naps there would take the forward's CPU).
    """
    nic = tuple(sorted(set(nic)))
    if name != "nic":
        return {"fastpath": "thread", "watcher_busy_poll": "false", "fastpath_cpus": "", "watcher_nap_us": "0"}
    own = len(nic) >= 2
    return {"fastpath": "process", "watcher_busy_poll": "true" if own else "false",
            "fastpath_cpus": format_cpus(nic[-1:]) if own else "", "watcher_nap_us": "0" if own else NIC_NAP_US}


def compute_settings_in(name: str, plan: Mapping[str, Iterable[int]]) -> dict[str, str]:
    """The compute node's settings under placement `name`: under `nic`, its offload thread (the triggered
    stores, compute_node.offload_thread: the NIC's work) runs on the NIC's CPUs that no fast path has to
    itself (the storage nodes' and the frontend's), looking for work every OFFLOAD_NAP_US (a hand-off
    is then an append, not a wake-up from the engine's thread); under `shared`, on the node's own, woken."""
    if name != "nic":
        return {"offload_thread_cpus": "", "offload_thread_nap_us": "0"}
    return {"offload_thread_cpus": format_cpus(plan["storage"]), "offload_thread_nap_us": OFFLOAD_NAP_US}


def parse_cpus(text: str) -> tuple[int, ...]:
    """"0-2,5" -> (0, 1, 2, 5): sorted, unique; "" -> () (every CPU). ValueError on anything else."""
    text = (text or "").strip()
    if not text:
        return ()
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        if not low.strip().isdigit() or (sep and not high.strip().isdigit()):
            raise ValueError(f"CPU list {text!r}: {part!r} is not a CPU number or a range a-b "
                             "(CPU numbers are 0 or more)")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"CPU list {text!r}: range {part!r} ends before it starts")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpus(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> "0-2,5"; () -> ""."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def current_cpus() -> tuple[int, ...]:
    """The CPUs the calling thread may run on now."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan(name: str, cpus: Iterable[int] | None = None, replicas: int = 1) -> dict[str, tuple[int, ...]]:
    """service -> its CPUs under placement `name`, on `cpus` (default: this process's CPUs), for
    `replicas` agent and compute node pairs (replica i >= 1: smartnic-i, compute-i)."""
    cpus = tuple(sorted(set(current_cpus() if cpus is None else cpus)))
    if not cpus:
        raise ValueError("placement: no CPUs to place the services on")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"placement: replicas must be a whole number of 1 or more, got {replicas!r}")
    if name == "shared":
        given = {service: cpus for service in SERVICES}
        for i, share in enumerate(shares(cpus, replicas)):
            agent, compute = replica_services(i)
            given.update({agent: cpus, compute: share if replicas > 1 else cpus})
        return given
    if name == "nic":
        if len(cpus) < 2:
            raise ValueError(f"placement nic needs at least 2 CPUs (the compute node's and the NIC's); "
                             f"this set has {format_cpus(cpus)}: use placement shared")
        nic = cpus[-max(1, len(cpus) // 4):]
        compute = cpus[:len(cpus) - len(nic)]
        # the last NIC CPUs are the fast paths' alone, one each (agent_settings_in), when the NIC has more
        own = len(nic) >= replicas + 1
        rest = nic[:-replicas] if own else nic
        given = {service: rest for service in NIC_SERVICES}
        for i, share in enumerate(shares(compute, replicas)):
            agent, node = replica_services(i)
            given.update({agent: rest + (nic[len(nic) - replicas + i],) if own else nic, node: share})
        return {service: given[service] for service in (*SERVICES, *given) if service in given}
    raise ValueError(f"unknown placement {name!r}: one of {', '.join(PLACEMENTS)}")


def formatted(placement: Mapping[str, Iterable[int]]) -> dict[str, str]:
    """service -> its CPU list as text (for ready lines, records and the environment)."""
    return {service: format_cpus(cpus) for service, cpus in placement.items()}


def machine_cpus() -> tuple[int, ...]:
    """The machine's online CPUs (/sys), or 0 .. cpu_count - 1 where that cannot be read."""
    try:
        return parse_cpus(Path("/sys/devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return tuple(range(os.cpu_count() or 1))


def apply(cpus: str | Iterable[int]) -> tuple[int, ...]:
    """Pin every thread of this process to `cpus` (a CPU list or numbers); empty: leave it as it is.

    Returns the set the calling thread now runs on. SettingsError when a CPU is not this machine's,
    or the kernel (a container's cpuset) does not allow all of them.
    """
    wanted = parse_cpus(cpus) if isinstance(cpus, str) else tuple(sorted(set(cpus)))
    if not wanted:
        return current_cpus()
    missing = sorted(set(wanted) - set(machine_cpus()))
    if missing:
        raise SettingsError(f"cpus {format_cpus(wanted)}: CPU {format_cpus(missing)} is not one of this "
                            f"machine's ({format_cpus(machine_cpus())})")
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), wanted)
            except ProcessLookupError:  # the thread ended meanwhile
                pass
        os.sched_setaffinity(0, wanted)
    except OSError as exc:  # EINVAL: none of them is allowed here (a container's cpuset)
        raise SettingsError(f"cpus {format_cpus(wanted)}: not allowed here ({exc.strerror}); "
                            f"this process may use {format_cpus(current_cpus())}") from exc
    effective = current_cpus()
    if effective != wanted:  # the kernel dropped the CPUs a cpuset does not allow
        raise SettingsError(f"cpus {format_cpus(wanted)}: only {format_cpus(effective)} are allowed here "
                            "(a container's cpuset?)")
    return effective


def pin(service: str, cpus: str) -> tuple[int, ...]:
    """apply(cpus) at a service's start, logged: the set it runs on (its ready line says it too)."""
    effective = apply(cpus)
    logger.info("%s runs on CPUs %s%s", service, format_cpus(effective), "" if cpus.strip() else " (all it may use)")
    return effective
