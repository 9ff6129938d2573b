"""Admission of turns: a bound on turns in flight, a bounded wait, one turn per context."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import AsyncIterator, Hashable

from chat_frontend.errors import ChatError


@dataclasses.dataclass
class AdmissionStats:
    admitted: int = 0
    rejected_full: int = 0
    rejected_timeout: int = 0


class Admission:
    """At most `max_active` turns run; up to `max_waiting` more wait at most `timeout_s`.

    A turn past those bounds gets RESOURCE_EXHAUSTED at once: never dropped silently.
    Turns of the same context run one after the other (a conversation is a sequence).
    Use from one event loop only.
    """

    def __init__(self, max_active: int, max_waiting: int, timeout_s: float):
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_active)
        self._waiting = 0
        self._active = 0
        self._context_locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}  # lock, [users]
        self.stats = AdmissionStats()

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    @contextlib.asynccontextmanager
    async def turn(self, context_id: Hashable) -> AsyncIterator[None]:
        """Hold a place for one turn of the context (its key: (user, context id)); wait for it, bounded."""
        if self._slots.locked() and self._waiting >= self.max_waiting:
            self.stats.rejected_full += 1
            raise ChatError("RESOURCE_EXHAUSTED",
                            f"busy: {self._active} turns running and {self._waiting} waiting "
                            f"(limits {self.max_active} and {self.max_waiting}); try again later")
        lock, users = self._context_locks.setdefault(context_id, (asyncio.Lock(), [0]))
        users[0] += 1
        self._waiting += 1
        admitted = [False]
        try:
            await asyncio.wait_for(self._acquire(lock, admitted), self.timeout_s)
        except asyncio.TimeoutError:
            self.stats.rejected_timeout += 1
            raise ChatError("RESOURCE_EXHAUSTED",
                            f"busy: waited {self.timeout_s:g} s for a free place; try again later"
                            ) from None
        finally:
            if not admitted[0]:
                self._waiting -= 1
                self._forget(context_id, users)
        try:
            yield
        finally:
            self._active -= 1
            self._slots.release()
            lock.release()
            self._forget(context_id, users)

    def _forget(self, context_id: Hashable, users: list[int]) -> None:
        users[0] -= 1
        if users[0] == 0:
            del self._context_locks[context_id]

    async def _acquire(self, lock: asyncio.Lock, admitted: list[bool]) -> None:
        await lock.acquire()
        try:
            await self._slots.acquire()
        except BaseException:
            lock.release()
            raise
        # Counted as active from the moment it holds its place, with no await in between.
        self._waiting -= 1
        self._active += 1
        self.stats.admitted += 1
        admitted[0] = True
