"""CPU placement: which CPUs each service runs on.

A CPU list is Linux's notation ("0-2,5"; "" means every CPU this process may use). A placement
names a plan, service -> CPUs:

- `shared`: every service on every CPU of the set (what an unpinned deployment does);
- `nic`: the SmartNIC agent, the storage nodes and the frontend on the NIC's cores, the last
  max(1, n // 4) CPUs of the set, and the compute node on the rest (on 2 CPUs: 1 and 1; on 1 CPU
  it cannot be honoured).

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


def agent_settings(name: str, nic: Iterable[int] = ()) -> dict[str, str]:
    """The agent's fast path settings under placement `name` (nic: the NIC's CPUs of its plan).

    `nic`: standing PUTs fire in the fast path's own process (smartnic.fastpath). With two NIC CPUs or
    more, that process has the last one to itself and polls it without ever sleeping, as a NIC's
    engine does (the agent's other threads, the storage nodes and the frontend keep to the others).
    With one, it shares its CPU with the NIC's data movement, and a poller that never sleeps would
    hold the CPU the PUTs it fires need (measured: milliseconds): it waits on the doorbell, a
    real-time thread, instead. `shared`: the fast path is a thread of the agent, on the doorbell.
    """
    nic = tuple(sorted(set(nic)))
    if name != "nic":
        return {"fastpath": "thread", "watcher_busy_poll": "false", "fastpath_cpus": ""}
    own = len(nic) >= 2
    return {"fastpath": "process", "watcher_busy_poll": "true" if own else "false",
            "fastpath_cpus": format_cpus(nic[-1:]) if own else ""}


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


def plan(name: str, cpus: Iterable[int] | None = None) -> dict[str, tuple[int, ...]]:
    """service -> its CPUs under placement `name`, on `cpus` (default: this process's CPUs)."""
    cpus = tuple(sorted(set(current_cpus() if cpus is None else cpus)))
    if not cpus:
        raise ValueError("placement: no CPUs to place the services on")
    if name == "shared":
        return {service: cpus for service in SERVICES}
    if name == "nic":
        if len(cpus) < 2:
            raise ValueError(f"placement nic needs at least 2 CPUs (the compute node's and the NIC's); "
                             f"this set has {format_cpus(cpus)}: use placement shared")
        nic = cpus[-max(1, len(cpus) // 4):]
        compute = cpus[:len(cpus) - len(nic)]
        rest = nic[:-1] if len(nic) >= 2 else nic  # the last NIC CPU is the fast path's alone (agent_settings)
        given = {"compute": compute, "smartnic": nic}
        return {service: given.get(service, rest) for service in SERVICES}
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
