"""Admission of turns: a fair share per user, a bounded wait, one turn per context at a time.

At most `max_active` turns run at once (the frontend forwards them to the compute node). A turn
that cannot start waits, at most `timeout_s`, in its user's queue; when a place frees, the next
turn comes from the next user with a turn that may start, round-robin over users (not first come,
first served), so a user with many turns waiting cannot delay another's first one by more than a
turn. Each user (`UserLimits`) runs at most `max_concurrent_turns` turns, keeps at most
`max_waiting_turns` waiting (and never more than half the waiting room, so one user cannot fill
it), and has at most `max_queued_prompt_tokens` prompt tokens in its turns running or waiting
(a turn alone always passes, however long its prompt). Past any bound: RESOURCE_EXHAUSTED at once,
with a time to try again; never dropped silently. Turns of the same context run one after the
other (a conversation is a sequence). Use from one event loop only.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Hashable

from chat_frontend.errors import ChatError

BYTES_PER_TOKEN = 4       # what a BPE token of English text takes, about
TOKENS_PER_MESSAGE = 4    # the chat template's own tokens around a message
HOLD_WEIGHT = 0.2         # weight of the latest turn in the mean time a turn holds its place


@dataclasses.dataclass(frozen=True)
class UserLimits:
    """One user's share of the frontend."""

    max_concurrent_turns: int
    max_waiting_turns: int
    max_queued_prompt_tokens: int


UNLIMITED = UserLimits(1 << 30, 1 << 30, 1 << 62)


def estimate_tokens(*texts: str) -> int:
    """About how many prompt tokens these messages make (from their UTF-8 bytes), before tokenizing."""
    return sum(math.ceil(len(t.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE
               for t in texts)


@dataclasses.dataclass
class AdmissionStats:
    admitted: int = 0
    rejected_full: int = 0      # the waiting room was full
    rejected_timeout: int = 0   # waited timeout_s
    rejected_share: int = 0     # past the user's own limits


@dataclasses.dataclass(eq=False)
class _Waiter:
    user: str
    context: Hashable
    tokens: int
    admitted: asyncio.Future


@dataclasses.dataclass(eq=False)
class _User:
    limits: UserLimits
    active: int = 0
    tokens: int = 0  # prompt tokens of its turns running or waiting
    waiting: collections.deque = dataclasses.field(default_factory=collections.deque)


class Admission:
    """The places for turns, shared fairly between users (see the module's docstring)."""

    def __init__(self, max_active: int, max_waiting: int, timeout_s: float,
                 limits_of: Callable[[str], UserLimits] = lambda user: UNLIMITED):
        if max_active <= 0 or max_waiting < 0 or timeout_s <= 0:
            raise ValueError(f"need max_active > 0, max_waiting >= 0, timeout_s > 0; got "
                             f"{max_active}, {max_waiting}, {timeout_s}")
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.limits_of = limits_of
        self._active = 0
        self._waiting = 0
        self._users: dict[str, _User] = {}  # users with turns running or waiting only
        self._rotation: collections.OrderedDict[str, None] = collections.OrderedDict()  # users with waiters
        self._busy: set[Hashable] = set()   # contexts with a turn running
        self._hold_s = 1.0                  # mean time a turn holds its place
        self.stats = AdmissionStats()

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def users(self) -> int:
        """Users with turns running or waiting."""
        return len(self._users)

    def retry_after_s(self) -> int:
        """When a refused turn may try again: about the time a turn holds its place (whole seconds)."""
        return max(1, math.ceil(self._hold_s))

    @contextlib.asynccontextmanager
    async def turn(self, user: str, context_id: Hashable, prompt_tokens: int = 0) -> AsyncIterator[None]:
        """Hold a place for one turn of the user's context (its key: unique across users); wait for
        it, bounded; RESOURCE_EXHAUSTED past a bound."""
        waiter = self._enter(user, context_id, prompt_tokens)
        await self._wait(waiter)
        start = time.monotonic()
        try:
            yield
        finally:
            self._leave(waiter, time.monotonic() - start)

    def _refuse(self, message: str) -> ChatError:
        return ChatError("RESOURCE_EXHAUSTED", f"{message}; try again in {self.retry_after_s()} s",
                         retry_after_s=self.retry_after_s())

    def _waiting_bound(self, user: _User) -> int:
        """Turns a user may keep waiting: its own limit, and never more than half the room (at least 1)."""
        return min(user.limits.max_waiting_turns, max(1, self.max_waiting // 2))

    def _enter(self, name: str, context: Hashable, tokens: int) -> _Waiter:
        """The turn in its user's queue (and admitted at once if it may start), or a refusal."""
        user = self._users.get(name) or _User(self.limits_of(name))
        limits = user.limits
        busy = user.active + len(user.waiting)
        if busy and user.tokens + tokens > limits.max_queued_prompt_tokens:
            self.stats.rejected_share += 1
            raise self._refuse(f"over your share: {user.tokens} prompt tokens in your {busy} turns running "
                               f"or waiting, and about {tokens} in this one, pass your limit of "
                               f"{limits.max_queued_prompt_tokens}")
        starts_now = (self._active < self.max_active and user.active < limits.max_concurrent_turns
                      and context not in self._busy)
        if not starts_now:
            if len(user.waiting) >= self._waiting_bound(user):
                self.stats.rejected_share += 1
                raise self._refuse(f"over your share: {user.active} turns running and {len(user.waiting)} "
                                   f"waiting (your limits {limits.max_concurrent_turns} and "
                                   f"{self._waiting_bound(user)})")
            if self._waiting >= self.max_waiting:
                self.stats.rejected_full += 1
                raise self._refuse(f"busy: {self._active} turns running and {self._waiting} waiting "
                                   f"(limits {self.max_active} and {self.max_waiting})")
        waiter = _Waiter(name, context, tokens, asyncio.get_running_loop().create_future())
        self._users[name] = user
        user.waiting.append(waiter)
        user.tokens += tokens
        self._waiting += 1
        self._rotation.setdefault(name)
        self._dispatch()
        return waiter

    async def _wait(self, waiter: _Waiter) -> None:
        """Until the waiter is admitted; on a timeout or cancellation it leaves the queue."""
        if waiter.admitted.done():
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.admitted
        except TimeoutError:
            if self._was_admitted(waiter):  # admitted just as its time ran out: take the place
                return
            self._withdraw(waiter)
            self.stats.rejected_timeout += 1
            raise self._refuse(f"busy: waited {self.timeout_s:g} s for a free place") from None
        except BaseException:  # cancelled: the user went away
            if self._was_admitted(waiter):
                self._leave(waiter, 0.0)
            else:
                self._withdraw(waiter)
            raise

    @staticmethod
    def _was_admitted(waiter: _Waiter) -> bool:
        return waiter.admitted.done() and not waiter.admitted.cancelled()

    def _dispatch(self) -> None:
        """Admit waiters while places are free: the next user in turn with a turn that may start."""
        while self._active < self.max_active and self._rotation:
            picked = self._next_waiter()
            if picked is None:
                return
            user = self._users[picked.user]
            user.waiting.remove(picked)
            self._waiting -= 1
            user.active += 1
            self._active += 1
            self._busy.add(picked.context)
            if user.waiting:
                self._rotation.move_to_end(picked.user)  # its next turn waits for the others' turns
            else:
                del self._rotation[picked.user]
            self.stats.admitted += 1
            picked.admitted.set_result(None)

    def _next_waiter(self) -> _Waiter | None:
        for name in self._rotation:
            user = self._users[name]
            if user.active >= user.limits.max_concurrent_turns:
                continue
            for waiter in user.waiting:  # its oldest turn whose context is not running
                if waiter.context not in self._busy:
                    return waiter
        return None

    def _withdraw(self, waiter: _Waiter) -> None:
        user = self._users[waiter.user]
        user.waiting.remove(waiter)
        self._waiting -= 1
        user.tokens -= waiter.tokens
        if not user.waiting:
            self._rotation.pop(waiter.user, None)
        self._forget_if_idle(waiter.user, user)
        self._dispatch()

    def _leave(self, waiter: _Waiter, held_s: float) -> None:
        user = self._users[waiter.user]
        user.active -= 1
        self._active -= 1
        user.tokens -= waiter.tokens
        self._busy.discard(waiter.context)
        if held_s > 0:
            self._hold_s += HOLD_WEIGHT * (held_s - self._hold_s)
        self._forget_if_idle(waiter.user, user)
        self._dispatch()

    def _forget_if_idle(self, name: str, user: _User) -> None:
        if not user.active and not user.waiting:
            del self._users[name]
