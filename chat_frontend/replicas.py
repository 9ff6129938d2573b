"""The replicas behind the frontend (each a SmartNIC agent and its compute node) as one Agent.

`Replicas` has the Agent protocol of chat_service.py over one AgentClient per replica. A turn
(`generate`) goes where chat_frontend.routing's policy says, among the replicas in the rotation;
if that replica fails with UNAVAILABLE before it streamed a token (or it leaves the rotation
while the turn waits for its first token), it leaves the rotation and the turn is retried once on
another (the turn's Route names both); a failure after a token was streamed is UNAVAILABLE saying
the replica failed mid-reply: the user's next turn goes to another replica, which restores the
conversation's KV from the storage nodes. Info, EncodeChat and Decode go to any replica in the
rotation, with the same failover. The health loop (`run`) probes every replica each
health_interval_s (Info, then the compute node's Stats, each within health_timeout_s): a replica
that fails leaves the rotation, one that answers returns; the figures feed least_loaded.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from chat_frontend.agent_client import AgentClient, chat_error
from chat_frontend.errors import ChatError
from chat_frontend.routing import Load, Route, Router
from chat_frontend.settings import FrontendSettings
from kvtb.grpc_health import Health
from kvtb.rpc import Security
from kvtb_proto import compute_pb2, smartnic_pb2
from scale import dilation

logger = logging.getLogger(__name__)

T = TypeVar("T")
RETRYABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")  # the replica failed or does not answer: another may
MEAN_FIELDS = ("kv_cache_usage_perc",)  # ComputeStatsResponse fields averaged over replicas (the rest add up)


class Client(Protocol):
    """What a replica's client offers (agent_client.AgentClient; tests pass fakes)."""

    address: str
    model: str

    async def info(self, timeout_s: float = 10.0) -> compute_pb2.InfoResponse: ...
    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]: ...
    async def decode(self, token_ids: list[int]) -> str: ...
    def generate(self, request: compute_pb2.TurnRequest) -> AsyncIterator[compute_pb2.TurnEvent]: ...
    async def compute_stats(self, timeout_s: float = 5.0) -> compute_pb2.ComputeStatsResponse: ...
    async def agent_stats(self, timeout_s: float = 5.0) -> smartnic_pb2.StatsResponse: ...
    async def close(self) -> None: ...


@dataclasses.dataclass(eq=False)
class Replica:
    """One replica and what the frontend knows of it."""

    name: str
    client: Client
    up: bool = True             # in the rotation (until a probe or a turn says otherwise)
    reason: str = ""            # why it is out of the rotation
    stats: compute_pb2.ComputeStatsResponse | None = None  # its last figures
    sent: int = 0               # turns sent to it since those figures
    turns: int = 0              # turns (choices) it served
    down: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # set when it leaves

    def load(self) -> Load:
        s = self.stats
        if s is None:
            return Load(self.name, sent=self.sent)
        return Load(self.name, s.num_requests_running, s.num_requests_waiting + s.num_requests_restoring,
                    self.sent)


class _FailedBeforeToken(Exception):
    """A turn's replica failed before it streamed a token: the turn may go to another."""

    def __init__(self, error: ChatError):
        super().__init__(error.message)
        self.error = error


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ChatError):
        return exc.message
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}"


def sum_stats(figures: Sequence[compute_pb2.ComputeStatsResponse]) -> compute_pb2.ComputeStatsResponse:
    """The replicas' compute figures as one engine's: counts and gauges added, MEAN_FIELDS averaged."""
    out = compute_pb2.ComputeStatsResponse()
    for field in out.DESCRIPTOR.fields:
        name = field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            merged = getattr(out, name)
            for stats in figures:
                for key, value in getattr(stats, name).items():
                    merged[key] += value
        elif field.type == field.TYPE_STRING:  # pacing_json: the replicas' pacers as one
            texts = [getattr(s, name) for s in figures if getattr(s, name)]
            setattr(out, name, json.dumps(dilation.merge([json.loads(t) for t in texts])) if texts else "")
        elif name in MEAN_FIELDS:
            setattr(out, name, sum(getattr(s, name) for s in figures) / len(figures) if figures else 0.0)
        else:
            setattr(out, name, sum(getattr(s, name) for s in figures))
    return out


class Replicas:
    """The Agent of chat_service.py over several replicas. One event loop."""

    def __init__(self, replicas: Sequence[Replica], security: Security, policy: str = "kv_aware",
                 balance_abs_threshold: int = 4, health_timeout_s: float = 2.0):
        if not replicas:
            raise ValueError("Replicas needs at least one replica")
        self.replicas = list(replicas)
        self.security = security
        self.health_timeout_s = health_timeout_s
        self.router = Router([r.name for r in self.replicas], policy, balance_abs_threshold)
        self.retries = 0  # turns retried on another replica
        self._calls = 0   # Info, EncodeChat and Decode go round the replicas in the rotation

    @classmethod
    def connect(cls, settings: FrontendSettings, security: Security) -> Replicas:
        """One AgentClient per replica of the settings."""
        members = [Replica(r.name, AgentClient(r.address, security, settings.agent_timeout_s, peer=r.identity))
                   for r in settings.replica_addresses()]
        return cls(members, security, settings.routing, settings.balance_abs_threshold,
                   settings.health_timeout_s)

    @property
    def address(self) -> str:
        """The agent's address (one replica), or each replica's as NAME=ADDRESS."""
        if len(self.replicas) == 1:
            return self.replicas[0].client.address
        return ", ".join(f"{r.name}={r.client.address}" for r in self.replicas)

    @property
    def model(self) -> str:
        """The model's name once a replica's Info answered (one in the rotation first), else ''."""
        return next((r.client.model for r in sorted(self.replicas, key=lambda r: not r.up) if r.client.model), "")

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def candidates(self) -> list[Replica]:
        """The replicas a call may go to: those in the rotation; a lone replica always (there is no
        other to go to, and its own error says more than that it is out)."""
        return self.replicas if len(self.replicas) == 1 else self.healthy()

    def figures(self) -> dict[str, Any]:
        """For /metrics: each replica's state and turns, and the turns retried."""
        return {"up": {r.name: int(r.up) for r in self.replicas},
                "turns": {r.name: r.turns for r in self.replicas}, "retries": self.retries}

    def mark_down(self, replica: Replica, reason: str) -> None:
        """Take the replica out of the rotation (its turns waiting for a first token go elsewhere)."""
        if replica.up:
            logger.warning("replica %s (%s) is out of the rotation: %s", replica.name, replica.client.address,
                           reason)
            self.router.forget(replica.name)
            replica.down.set()
        replica.up, replica.reason = False, reason

    def mark_up(self, replica: Replica) -> None:
        if not replica.up:
            logger.info("replica %s (%s) is back in the rotation", replica.name, replica.client.address)
            replica.down = asyncio.Event()
        replica.up, replica.reason = True, ""

    def _none_up(self) -> ChatError:
        why = "; ".join(f"{r.name} at {r.client.address}: {r.reason or 'down'}" for r in self.replicas)
        return ChatError("UNAVAILABLE", f"no replica is in the rotation ({why})")

    async def close(self) -> None:
        for r in self.replicas:
            await r.client.close()

    # the health loop

    async def probe(self, replica: Replica) -> bool:
        """Ask the replica's Info and its compute node's Stats; in or out of the rotation by the answer."""
        try:
            async with asyncio.timeout(self.health_timeout_s):
                await replica.client.info(timeout_s=self.health_timeout_s)
                stats = await replica.client.compute_stats(timeout_s=self.health_timeout_s)
        except grpc.aio.AioRpcError as exc:
            self.mark_down(replica, f"health probe: {chat_error(exc, replica.client.address).message}")
            return False
        except (ChatError, TimeoutError) as exc:
            self.mark_down(replica, f"health probe: {_reason(exc)}")
            return False
        replica.stats, replica.sent = stats, 0
        self.mark_up(replica)
        return True

    async def probe_all(self) -> bool:
        """Probe every replica at once; whether any is in the rotation."""
        return any(await asyncio.gather(*(self.probe(r) for r in self.replicas)))

    async def run(self, health: Health | None, interval_s: float, retry_s: float) -> None:
        """Until cancelled: probe every retry_s until a replica answers (then SERVING), then every interval_s."""
        serving = False
        while True:
            try:
                up = await self.probe_all()
            except Exception:  # noqa: BLE001 - a bug in a probe must not end the health loop
                logger.exception("probing the replicas failed")
                up = False
            if up and not serving:
                serving = True
                logger.info("replicas answer (%d of %d): model %s", len(self.healthy()), len(self.replicas),
                            self.model)
                if health is not None:
                    health.set_serving()
            elif not serving:
                logger.info("waiting for a replica: %s", self._none_up().message)
            await asyncio.sleep(interval_s if serving else retry_s)

    # the Agent protocol

    async def _any(self, call: Callable[[Client], Awaitable[T]]) -> T:
        """call on a replica in the rotation; on one that fails, once more on another."""
        failed: ChatError | None = None
        for _ in range(2):
            candidates = [r for r in self.candidates() if not failed or r.up]
            if not candidates:
                break
            replica = candidates[self._calls % len(candidates)]
            self._calls += 1
            try:
                return await call(replica.client)
            except ChatError as exc:
                if exc.code not in RETRYABLE:
                    raise
                self.mark_down(replica, exc.message)
                failed = exc
        raise failed if failed is not None else self._none_up()

    async def info(self, timeout_s: float = 10.0) -> compute_pb2.InfoResponse:
        """The model's facts, from any replica; the router learns the pool's block size from them."""
        info = await self._any(lambda c: c.info(timeout_s=timeout_s))
        if info.block_tokens:
            self.router.block_tokens = info.block_tokens
        return info

    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]:
        return await self._any(lambda c: c.encode_chat(request))

    async def decode(self, token_ids: list[int]) -> str:
        return await self._any(lambda c: c.decode(token_ids))

    async def compute_stats(self, timeout_s: float = 5.0) -> compute_pb2.ComputeStatsResponse:
        """The figures of the compute nodes in the rotation added up (vLLM's gauges over the engines);
        UNAVAILABLE if none answers."""
        members = self.candidates()
        if not members:
            raise self._none_up()
        replies = await asyncio.gather(*(r.client.compute_stats(timeout_s=timeout_s) for r in members),
                                       return_exceptions=True)
        figures = [f for f in replies if isinstance(f, compute_pb2.ComputeStatsResponse)]
        if not figures:
            raise ChatError("UNAVAILABLE", f"no compute node answered Stats: {_reason(replies[0])}")
        return sum_stats(figures)

    def _followed(self, route: Route) -> Replica | None:
        """The replica of the route this one follows (the first choice's), if it is still a candidate."""
        name = route.follow.replica if route.follow is not None else ""
        return next((r for r in self.candidates() if r.name == name), None) if name else None

    def _pick(self, owner: str, token_ids: Sequence[int], retry: bool = False) -> Replica | None:
        candidates = {r.name: r for r in (self.healthy() if retry else self.candidates())}
        decision = self.router.pick(owner, token_ids, [r.load() for r in candidates.values()])
        if decision is None:
            return None
        self.router.routed(owner, token_ids, decision.replica)
        logger.debug("routed to %s (%s, %d prefix blocks)", decision.replica, decision.reason,
                     decision.matched_blocks)
        return candidates[decision.replica]

    async def generate(self, request: compute_pb2.TurnRequest,
                       route: Route | None = None) -> AsyncIterator[compute_pb2.TurnEvent]:
        """The turn's events from the replica the policy picks (retried once on another if it failed
        before its first token); route, if given, is filled in with where it went."""
        route = route if route is not None else Route()
        owner = f"{request.tenant}\0{request.user_id}"
        if self.router.policy == "kv_aware" and not self.router.block_tokens:
            with contextlib.suppress(ChatError):  # the pool's block size, from its compute node (once)
                await self.info()
        first = self._followed(route) or self._pick(owner, request.token_ids)
        if first is None:
            raise self._none_up()
        try:
            async with contextlib.aclosing(self._serve(first, owner, request, route, may_retry=True)) as events:
                async for event in events:
                    yield event
            return
        except _FailedBeforeToken as exc:
            error = exc.error
        self.mark_down(first, error.message)
        other = self._pick(owner, request.token_ids, retry=True)
        if other is None:
            raise error
        self.retries += 1
        route.retried_from = first.name
        logger.warning("turn %s: replica %s failed before its first token (%s); retried on %s",
                       request.request_id, first.name, error.message, other.name)
        async with contextlib.aclosing(self._serve(other, owner, request, route, may_retry=False)) as events:
            async for event in events:
                yield event

    async def _serve(self, replica: Replica, owner: str, request: compute_pb2.TurnRequest, route: Route,
                     may_retry: bool) -> AsyncIterator[compute_pb2.TurnEvent]:
        replica.sent += 1
        route.replica = replica.name
        streamed = False
        events = replica.client.generate(request)
        try:
            if may_retry and replica.up and len(self.replicas) > 1:  # elsewhere, if it leaves the rotation
                event = await _first_event(events, replica)
            else:
                event = await anext(events, None)
            while event is not None:
                if event.HasField("token"):
                    streamed = True
                elif event.HasField("record"):
                    event.record.replica = replica.name
                    replica.turns += 1
                    self.router.routed(owner, [*request.token_ids, *event.record.output_token_ids], replica.name)
                yield event
                event = await anext(events, None)
        except ChatError as exc:
            if exc.code not in RETRYABLE:
                raise
            if not streamed and may_retry:
                raise _FailedBeforeToken(exc) from None
            if exc.code == "DEADLINE_EXCEEDED" and streamed:
                raise  # a turn past its deadline: the replica itself may be fine
            self.mark_down(replica, exc.message)
            if not streamed:
                raise
            others = [r.name for r in self.healthy()]
            then = (f"the next turn goes to {'another replica' if len(others) > 1 else others[0]}, which "
                    "restores the conversation's KV from storage") if others else "no other replica is up"
            raise ChatError("UNAVAILABLE", f"replica {replica.name} failed mid-reply ({exc.message}); "
                            f"{then}") from None
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()


async def _first_event(events: AsyncIterator[compute_pb2.TurnEvent],
                       replica: Replica) -> compute_pb2.TurnEvent | None:
    """The stream's first event, or UNAVAILABLE if the replica leaves the rotation before it comes."""
    nxt = asyncio.ensure_future(anext(events, None))
    gone = asyncio.ensure_future(replica.down.wait())
    try:
        await asyncio.wait((nxt, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not nxt.done():  # the replica left, or the turn was cancelled
            nxt.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChatError):
                await nxt
    if nxt.cancelled():
        raise ChatError("UNAVAILABLE", f"replica {replica.name} left the rotation before the turn's first "
                        f"token ({replica.reason})")
    return nxt.result()
