"""Pacing an operation of the process's profile, for the services: nothing happens in real time.

`ticket(kind, real_bytes, ...)` starts an operation's slot (None in real time: no profile); `wait`
ends it on this thread (sleeping out what is left); `finish` ends it without blocking: the caller's
completion runs no earlier than the slot's end (on the pacer's timer thread when it must wait), or
now when the real work overran it (a counted violation). `step_ticket(batch)` is a GPU step's slot.
"""
from __future__ import annotations

from collections.abc import Callable

from scale import dilation, ops, settings as scale_settings
from scale.dilation import Ticket


def ticket(kind: str, real_bytes: int, real_kv_bytes_per_token: int = 0, not_before: float = 0.0) -> Ticket | None:
    """An operation of `kind` moving `real_bytes` (charged as the virtual model's KV of as many tokens)
    starts now, or at `not_before` (when its data is delivered) if later."""
    pacer, profile = dilation.current(), scale_settings.current_profile()
    if pacer is None or profile is None:
        return None
    virtual = real_bytes * scale_settings.kv_scale_of(profile, real_kv_bytes_per_token)
    return pacer.reserve(kind, ops.modeled_s(profile, kind, virtual), ops.RESOURCE.get(kind), not_before)


def delivered(paced_until: float) -> float:
    """Data a sender's modeled link delivers at `paced_until` arrived now: a violation if it came later.
    Returns when the data counts as delivered (the later of the two)."""
    pacer = dilation.current()
    if pacer is None or paced_until <= 0:
        return 0.0
    now = pacer.clock()
    pacer.record("delivery", 0.0, max(0.0, now - paced_until), violated=now > paced_until)
    return max(now, paced_until)


def step_ticket(batch) -> Ticket | None:
    """A forward over batch [(context tokens, new tokens), ...] on the modeled GPU (None: no profile,
    or one that cannot cost a step)."""
    pacer, profile = dilation.current(), scale_settings.current_profile()
    if pacer is None or profile is None or not ops.applies(profile, "gpu_step"):
        return None
    return pacer.reserve("gpu_step", ops.modeled_s(profile, "gpu_step", batch=batch), ops.RESOURCE["gpu_step"])


def mark(name: str, at: float | None = None) -> None:
    pacer = dilation.current()
    if pacer is not None:
        pacer.mark(name, at)


def virtual_s(wall_s: float) -> float:
    """A span of this process's wall time in virtual time (wall / D under a pacer; as is in real time): what a
    target set in a user's seconds (a step's time budget) is compared with."""
    pacer = dilation.current()
    return wall_s if pacer is None else pacer.virtual(wall_s)


def active() -> bool:
    return dilation.current() is not None and scale_settings.current_profile() is not None


def end_of(t: Ticket | None) -> float:
    """When the ticket's slot ends (0.0 for none): what a capsule's paced_until carries."""
    return t.end if t is not None else 0.0


def settle(t: Ticket | None) -> None:
    """End the slot now without waiting (its work waited on something else meanwhile)."""
    pacer = dilation.current()
    if t is not None and pacer is not None:
        pacer.settle(t)


def wait(t: Ticket | None, stalled: float = 0.0) -> None:
    """End the slot on this thread: sleep out what is left of it. `stalled`: wall seconds the work spent
    waiting for another paced operation (a forward waiting for restored layers): the slot ends that much
    later, and they are not the work's own."""
    pacer = dilation.current()
    if t is None or pacer is None:
        return
    left = pacer.settle(t, stalled)
    if left > 0:
        pacer.sleep(left)


def finish(t: Ticket | None, fn: Callable[[], None]) -> None:
    """End the slot without blocking: fn() at its end (now, if it is past)."""
    pacer = dilation.current()
    if t is None or pacer is None:
        return fn()
    if pacer.settle(t) > 0:
        pacer.defer(t.end, fn)
    else:
        fn()
