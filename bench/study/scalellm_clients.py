"""`kvtb study scalellm`'s clients (I/O): the HTTP clients of a level, each request cancelled at its
timeout; the turn summaries read back from the frontend; the compute nodes' counters; the warm-up."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from bench.openai_client import ChatFailed, ChatTimedOut, Message, chat, messages_of, model_name
from bench.stack import Stack
from bench.study.scalellm_figures import RequestRecord

logger = logging.getLogger(__name__)


async def _client(session: aiohttp.ClientSession, base_url: str, model: str, token: str, user: str,
                  client: int, prompts: Sequence[list[Message]], max_tokens: int, timeout_s: float,
                  done: Callable[[], None]) -> list[RequestRecord]:
    """One HTTP client: its requests back to back, each cancelled at timeout_s."""
    out = []
    for messages in prompts:
        start = time.perf_counter()
        try:
            reply = await chat(session, base_url, token, model, messages, max_tokens, timeout_s=timeout_s)
        except ChatTimedOut as exc:
            out.append(RequestRecord(client, "timeout", time.perf_counter() - start, ttft_s=exc.ttft_s,
                                     user=user, session_id=exc.session_id))
        except (ChatFailed, aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            out.append(RequestRecord(client, "error", time.perf_counter() - start,
                                     error=f"{type(exc).__name__}: {exc}"[:300], user=user))
        else:
            out.append(RequestRecord(client, "ok", reply.e2e_s, ttft_s=reply.ttft_s,
                                     tokens=reply.completion_tokens, prompt_tokens=reply.prompt_tokens,
                                     user=user, session_id=reply.session_id))
        done()
    return out


async def run_clients(base_url: str, model: str, clients: Sequence[tuple[str, str]],
                      prompts: Sequence[Sequence[list[Message]]], max_tokens: int, timeout_s: float,
                      done: Callable[[], None]) -> tuple[list[RequestRecord], float]:
    """len(clients) HTTP clients ((user, token) each) at once, each through its prompts; every record and
    the wall time from the common start to the last request's end."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as session:
        begin = time.perf_counter()
        per_client = await asyncio.gather(*(
            _client(session, base_url, model, token, user, k, prompts[k], max_tokens, timeout_s, done)
            for k, (user, token) in enumerate(clients)))
        wall_s = time.perf_counter() - begin
    return [r for records in per_client for r in records], wall_s


def attach_summaries(frontend: str, records: Sequence[RequestRecord], tokens: Mapping[str, str]) -> int:
    """Each completed request's turn summary from the frontend (GetContext as its user): engine,
    gateway and e2e as the frontend split them. Returns how many were found."""
    from chat_client.client import FrontendClient, RpcFailure

    found = 0
    by_user: dict[str, list[RequestRecord]] = collections.defaultdict(list)
    for r in records:
        if r.status == "ok" and r.session_id:
            by_user[r.user].append(r)
    for user, mine in by_user.items():
        client = FrontendClient(frontend, tokens[user], timeout_s=30.0)
        try:
            for r in mine:
                try:
                    turns = client.get_context(r.session_id).turns
                except RpcFailure as exc:
                    logger.warning("no summary of %s's context %s: %s", user, r.session_id, exc)
                    continue
                if not turns or not turns[-1].HasField("summary"):
                    continue
                s = turns[-1].summary
                r.engine_ms, r.frontend_e2e_ms, r.gateway_ms = s.engine_ms, s.e2e_ms, s.gateway_ms
                r.replica = s.replica
                found += 1
        finally:
            client.close()
    return found


def compute_counters(stack: Stack) -> dict | None:
    """Every replica's compute node's tokens_out and preemptions (by kind), summed; None (with a warning)
    when one does not answer in time: a busy node's statistics must not cost the level's measurements."""
    import grpc

    tokens, preemptions = 0, collections.Counter()
    for i in range(stack.replicas):
        try:
            stats = stack.compute_stats(i, timeout_s=30)
        except grpc.RpcError as exc:
            logger.warning("replica %d's compute node's Stats did not answer: %s", i, exc.code())
            return None
        tokens += stats.tokens_out
        preemptions.update(dict(stats.preemptions))
    return {"tokens_out": tokens, "preemptions": dict(preemptions)}


def wait_idle(stack: Stack, timeout_s: float, poll_s: float = 0.5) -> float:
    """Seconds until every replica's compute node runs and queues no turn (a level's timed-out turns may
    still be running there: the next level must not start behind them). RuntimeError after timeout_s,
    naming what was left."""
    import grpc

    start = time.perf_counter()
    while True:
        left = []
        for i in range(stack.replicas):
            try:
                st = stack.compute_stats(i, timeout_s=30)
            except grpc.RpcError as exc:
                left.append(f"replica {i}'s Stats: {exc.code()}")
                continue
            if st.num_requests_running or st.num_requests_waiting:
                left.append(f"replica {i}: {st.num_requests_running} running, {st.num_requests_waiting} waiting")
        waited = time.perf_counter() - start
        if not left:
            return waited
        if waited > timeout_s:
            raise RuntimeError(f"the compute node was not idle {timeout_s:.0f} s after the level before: "
                               + "; ".join(left))
        time.sleep(poll_s)


def warm_up(base_url: str, token: str, max_tokens: int, system: str) -> str:
    """The served model's name, after one request (the first forward pays for lazy setup)."""
    async def go() -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            model = await model_name(session, base_url, token)
            await chat(session, base_url, token, model, messages_of(system, [], "Hello, who are you?"),
                       min(max_tokens, 32))
            return model
    return asyncio.run(go())
