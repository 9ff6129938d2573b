"""Admission of turns: a work-conserving fair share, a bounded wait, one turn per context at a time.

At most `max_active` turns run at once (the frontend forwards them to the compute nodes, whose
schedulers batch them). Alone, a user may take every place: nothing refuses a turn while a place is
free. A turn that cannot start waits, at most `timeout_s`, in its user's queue. When a place frees,
the next turn comes from the waiting user with the fewest turns running (ties: round-robin, the user
served least recently first), so a newcomer's first turn starts at the next free place, before the
turns of a user who already holds many; a greedy user's turns beyond its share are the ones that wait.

The waiting room holds at most `max_waiting` turns. When it is full, a turn of a user with fewer turns
waiting than the user with the most takes the place of that user's newest waiting turn, which is
refused (pushed out): so a full room refuses its largest holder, never a newcomer. Only a room full
of turns of users holding as many as this one refuses it.

An operator may set quotas per user (`UserLimits`, off by default): turns running at once (past it
they wait), turns waiting, prompt tokens in the user's turns running or waiting (a turn alone always
passes, however long its prompt). Past a quota, a full room, or a wait of timeout_s:
RESOURCE_EXHAUSTED at once, with a time to try again; never dropped silently. Turns of the same
context run one after the other (a conversation is a sequence). Use from one event loop only.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import math
import time
from collections.abc import AsyncIterator, Callable, Hashable

from chat_frontend.errors import ChatError

BYTES_PER_TOKEN = 4       # what a BPE token of English text takes, about
TOKENS_PER_MESSAGE = 4    # the chat template's own tokens around a message
HOLD_WEIGHT = 0.2         # weight of the latest turn in the mean time a turn holds its place


@dataclasses.dataclass(frozen=True)
class UserLimits:
    """An operator's quotas for one user; None: no quota (the default)."""

    max_concurrent_turns: int | None = None
    max_waiting_turns: int | None = None
    max_queued_prompt_tokens: int | None = None


NO_QUOTA = UserLimits()


def estimate_tokens(*texts: str) -> int:
    """About how many prompt tokens these messages make (from their UTF-8 bytes), before tokenizing."""
    return sum(math.ceil(len(t.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE
               for t in texts)


@dataclasses.dataclass
class AdmissionStats:
    admitted: int = 0
    rejected_full: int = 0      # the waiting room was full of turns of users holding no more than this one's
    rejected_pushed: int = 0    # waited, then gave its place in a full room to a user holding fewer
    rejected_timeout: int = 0   # waited timeout_s
    rejected_quota: int = 0     # past an operator's quota for its user


class _State(enum.Enum):
    WAITING = "waiting"
    ADMITTED = "admitted"
    PUSHED = "pushed"


@dataclasses.dataclass(eq=False)
class _Waiter:
    user: str
    context: Hashable
    tokens: int
    admitted: asyncio.Future
    state: _State = _State.WAITING


@dataclasses.dataclass(eq=False)
class _User:
    limits: UserLimits
    active: int = 0
    tokens: int = 0  # prompt tokens of its turns running or waiting
    waiting: collections.deque = dataclasses.field(default_factory=collections.deque)

    def under(self, quota: int | None, value: int) -> bool:
        return quota is None or value < quota


class Admission:
    """The places for turns, shared fairly between users (see the module's docstring)."""

    def __init__(self, max_active: int, max_waiting: int, timeout_s: float,
                 limits_of: Callable[[str], UserLimits] = lambda user: NO_QUOTA):
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

    def _enter(self, name: str, context: Hashable, tokens: int) -> _Waiter:
        """The turn in its user's queue (and admitted at once if it may start), or a refusal."""
        user = self._users.get(name) or _User(self.limits_of(name))
        limits = user.limits
        busy = user.active + len(user.waiting)
        quota = limits.max_queued_prompt_tokens
        if busy and quota is not None and user.tokens + tokens > quota:
            self.stats.rejected_quota += 1
            raise self._refuse(f"over your quota: {user.tokens} prompt tokens in your {busy} turns running "
                               f"or waiting, and about {tokens} in this one, pass your limit of {quota}")
        starts_now = (self._active < self.max_active and context not in self._busy
                      and user.under(limits.max_concurrent_turns, user.active))
        if not starts_now:
            quota = limits.max_waiting_turns
            if quota is not None and len(user.waiting) >= quota:
                self.stats.rejected_quota += 1
                raise self._refuse(f"over your quota: {user.active} turns running and {len(user.waiting)} "
                                   f"waiting (your limits {limits.max_concurrent_turns} and {quota})")
            if self._waiting >= self.max_waiting:
                self._make_room(name, user)
        waiter = _Waiter(name, context, tokens, asyncio.get_running_loop().create_future())
        self._users[name] = user
        user.waiting.append(waiter)
        user.tokens += tokens
        self._waiting += 1
        self._rotation.setdefault(name)
        self._dispatch()
        return waiter

    def _make_room(self, name: str, user: _User) -> None:
        """The room is full: push out the newest waiting turn of the user with the most waiting, if it
        has at least two more than this user would; else refuse this turn."""
        mine = len(user.waiting)
        holder = max(self._rotation, key=lambda n: len(self._users[n].waiting), default=None)
        if holder is None or holder == name or len(self._users[holder].waiting) < mine + 2:
            self.stats.rejected_full += 1
            raise self._refuse(f"busy: {self._active} turns running and {self._waiting} waiting "
                               f"(limits {self.max_active} and {self.max_waiting})")
        owner = self._users[holder]
        victim = owner.waiting[-1]
        self._remove(victim)
        owner.tokens -= victim.tokens
        victim.state = _State.PUSHED
        self.stats.rejected_pushed += 1
        victim.admitted.set_exception(self._refuse(
            f"busy: your waiting turn gave its place to another user's ({self._active} turns running and "
            f"{self._waiting + 1} waiting, {len(owner.waiting) + 1} of them yours)"))
        self._forget_if_idle(holder, owner)

    async def _wait(self, waiter: _Waiter) -> None:
        """Until the waiter is admitted; on a timeout or cancellation it leaves the queue."""
        if waiter.state is _State.ADMITTED:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.admitted
        except TimeoutError:
            if waiter.state is _State.ADMITTED:  # admitted just as its time ran out: take the place
                return
            if waiter.state is _State.WAITING:
                self._withdraw(waiter)
                self.stats.rejected_timeout += 1
            raise self._refuse(f"busy: waited {self.timeout_s:g} s for a free place") from None
        except ChatError:  # pushed out of a full room: already gone from the queue
            raise
        except BaseException:  # cancelled: the user went away
            if waiter.state is _State.ADMITTED:
                self._leave(waiter, 0.0)
            elif waiter.state is _State.WAITING:
                self._withdraw(waiter)
            raise

    def _dispatch(self) -> None:
        """Admit waiters while places are free: the next user in turn with a turn that may start."""
        while self._active < self.max_active and self._rotation:
            picked = self._next_waiter()
            if picked is None:
                return
            user = self._users[picked.user]
            self._remove(picked)
            user.active += 1
            self._active += 1
            self._busy.add(picked.context)
            if picked.user in self._rotation:
                self._rotation.move_to_end(picked.user)  # its next turn waits for the others' turns
            self.stats.admitted += 1
            picked.state = _State.ADMITTED
            picked.admitted.set_result(None)

    def _next_waiter(self) -> _Waiter | None:
        """The oldest startable turn of the waiting user with the fewest turns running (ties: rotation order)."""
        best: _Waiter | None = None
        best_active = 0
        for name in self._rotation:
            user = self._users[name]
            if (best is not None and user.active >= best_active) or \
                    not user.under(user.limits.max_concurrent_turns, user.active):
                continue
            for waiter in user.waiting:  # its oldest turn whose context is not running
                if waiter.context not in self._busy:
                    best, best_active = waiter, user.active
                    break
        return best

    def _remove(self, waiter: _Waiter) -> None:
        """The waiter leaves its user's queue (its tokens stay counted if it is admitted)."""
        user = self._users[waiter.user]
        user.waiting.remove(waiter)
        self._waiting -= 1
        if not user.waiting:
            self._rotation.pop(waiter.user, None)

    def _withdraw(self, waiter: _Waiter) -> None:
        user = self._users[waiter.user]
        self._remove(waiter)
        user.tokens -= waiter.tokens
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
