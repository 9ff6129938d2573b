"""The slot manager and the wait queue (pure: no torch, grpc or I/O; the time is passed in).

A slot is FREE, RESERVED (by the agent for a context's prefetch, with a lease), ACTIVE (a
turn runs in it), RESIDENT (it keeps a context's KV; evicted least recently used first) or
DRAINING (it becomes free once a counter reaches a target: the offload counter after a turn,
or the restore counter after a restore that timed out).
"""
from __future__ import annotations

import dataclasses
from collections import deque
from typing import Callable, Generic, TypeVar

FREE, RESERVED, ACTIVE, RESIDENT, DRAINING = "free", "reserved", "active", "resident", "draining"

Context = tuple[str, str]  # (user id, context id)
T = TypeVar("T")


@dataclasses.dataclass
class Slot:
    """What one slot holds; mutated only by SlotManager."""

    index: int
    state: str = FREE
    context: Context | None = None
    lease_until: float = 0.0
    last_use: float = 0.0
    drain_counter: int = -1
    drain_target: int = 0
    drain_until: float = 0.0
    drain_reason: str = ""


@dataclasses.dataclass(frozen=True)
class Acquired:
    """A slot given to a turn: how it was found."""

    slot: int
    how: str  # "reserved", "resident", "free" or "evicted"


class SlotManager:
    """Slots of one pool. Not thread-safe: the engine owns it (service calls go through the engine lock)."""

    def __init__(self, num_slots: int):
        assert num_slots > 0
        self.slots = [Slot(i) for i in range(num_slots)]
        self.evictions = 0
        self.drain_timeouts = 0

    # -- queries
    def count(self, state: str) -> int:
        return sum(1 for s in self.slots if s.state == state)

    @property
    def in_use(self) -> int:
        return len(self.slots) - self.count(FREE)

    def resident_slot(self, context: Context) -> int | None:
        for s in self.slots:
            if s.state == RESIDENT and s.context == context:
                return s.index
        return None

    def reserved_for(self, slot: int, context: Context) -> bool:
        s = self.slots[slot]
        return s.state == RESERVED and s.context == context

    # -- taking slots
    def _free_or_evict(self, keep: Context | None) -> tuple[Slot, str] | None:
        for s in self.slots:
            if s.state == FREE:
                return s, "free"
        resident = [s for s in self.slots if s.state == RESIDENT and s.context != keep]
        if resident:
            victim = min(resident, key=lambda s: s.last_use)
            self.evictions += 1
            return victim, "evicted"
        return None

    def reserve(self, context: Context, now: float, lease_s: float) -> Acquired | None:
        """A slot for the agent to restore `context` into, leased until now + lease_s."""
        found = self._free_or_evict(keep=None)
        if found is None:
            return None
        slot, how = found
        self._set(slot, RESERVED, context, now)
        slot.lease_until = now + lease_s
        return Acquired(slot.index, how)

    def acquire(self, context: Context, now: float, reserved: int | None = None) -> Acquired | None:
        """A slot for a turn of `context`: its reservation, its resident slot, a free one, or the LRU resident."""
        if reserved is not None and self.reserved_for(reserved, context):
            slot, how = self.slots[reserved], "reserved"
        elif (index := self.resident_slot(context)) is not None:
            slot, how = self.slots[index], "resident"
        else:
            found = self._free_or_evict(keep=context)
            if found is None:
                return None
            slot, how = found
        self._set(slot, ACTIVE, context, now)
        return Acquired(slot.index, how)

    def can_acquire(self, context: Context, reserved: int | None = None) -> bool:
        if reserved is not None and self.reserved_for(reserved, context):
            return True
        return any(s.state == FREE or (s.state == RESIDENT) for s in self.slots)

    # -- giving slots back
    def finish(self, slot: int, now: float, keep_resident: bool) -> None:
        """The turn is over: the slot keeps its context (resident) or becomes free."""
        s = self.slots[slot]
        self._set(s, RESIDENT if keep_resident else FREE, s.context if keep_resident else None, now)

    def drain(self, slot: int, now: float, counter: int, target: int, timeout_s: float,
              reason: str) -> None:
        """The slot becomes free once counter >= target (or after timeout_s)."""
        s = self.slots[slot]
        self._set(s, DRAINING, None, now)
        s.drain_counter, s.drain_target = counter, target
        s.drain_until, s.drain_reason = now + timeout_s, reason

    def release(self, slot: int, now: float) -> None:
        self._set(self.slots[slot], FREE, None, now)

    def drop_context(self, context: Context, now: float) -> None:
        """Forget a resident context (its KV is stale)."""
        index = self.resident_slot(context)
        if index is not None:
            self.release(index, now)

    def poll(self, now: float, counter_total: Callable[[int], int],
             claimed: frozenset[tuple[int, Context]] = frozenset()) -> list[int]:
        """Expire leases (except those claimed by a waiting turn) and finish drains; return the slots freed."""
        freed = []
        for s in self.slots:
            if s.state == RESERVED and now >= s.lease_until and (s.index, s.context) not in claimed:
                freed.append(s.index)
                self._set(s, FREE, None, now)
            elif s.state == DRAINING:
                if counter_total(s.drain_counter) >= s.drain_target:
                    freed.append(s.index)
                    self._set(s, FREE, None, now)
                elif now >= s.drain_until:
                    self.drain_timeouts += 1
                    freed.append(s.index)
                    self._set(s, FREE, None, now)
        return freed

    def _set(self, slot: Slot, state: str, context: Context | None, now: float) -> None:
        slot.state, slot.context, slot.last_use = state, context, now
        slot.drain_counter, slot.drain_reason = -1, ""


class QueueFull(Exception):
    """The wait queue is at its bound."""


class WaitQueue(Generic[T]):
    """A bounded FIFO from which the first item that can run is taken."""

    def __init__(self, bound: int):
        assert bound > 0
        self.bound = bound
        self._items: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T) -> None:
        if len(self._items) >= self.bound:
            raise QueueFull(f"{len(self._items)} turns are already waiting (queue_bound {self.bound})")
        self._items.append(item)

    def take_first(self, runnable: Callable[[T], bool]) -> T | None:
        """Remove and return the oldest item for which runnable(item) holds."""
        for item in self._items:
            if runnable(item):
                self._items.remove(item)
                return item
        return None

    def push_front(self, item: T) -> None:
        """Put an item back at the head (a turn moved to another slot), past the bound if need be."""
        self._items.appendleft(item)

    def remove(self, item: T) -> bool:
        try:
            self._items.remove(item)
            return True
        except ValueError:
            return False

    def items(self) -> list[T]:
        return list(self._items)

