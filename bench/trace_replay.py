"""Replaying a Mooncake-format trace through the OpenAI API: the prompts, checked, and the replay at the trace's times.

Every request is a single-turn chat (no session header) of its user (`TracePlan.users`, from
bench.mooncake.users_of: users share no prefix): a system message padded so that the chat
template's head is whole blocks, then the request's blocks as text (bench.trace_prompts).
Before the replay each prompt is encoded by the compute node's own chat template (EncodeChat) and
compared with its blocks' ids, so a hit measured is a trace prefix. The cached tokens the API
reports, less the head's, are the trace's blocks served from the cache; the ideal is
bench.mooncake.ideal_blocks per user. Each request's hit counts at most its own ideal (what it
could have reused) in `prefix_hit_vs_ideal`; hits beyond it are reported apart.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp

from bench import mooncake
from bench.mooncake import TraceRequest
from bench.openai_client import Reply, chat, messages_of
from bench.stats import ratio, summarize
from bench.trace_prompts import BlockText, check_prompt, pad_words, split_template

logger = logging.getLogger(__name__)

SYSTEM = "Repeat the list of words."
EncodeChat = Callable[[str, str], list[int]]  # (system, user message) -> the template's ids
IDEAL = ("the trace's ideal: per request, its leading full blocks whose whole prefix an earlier request "
         "of the same user sent (users share nothing: KV is salted per user), never the whole prompt; "
         "reached by a cache of unbounded capacity that has stored every earlier block when the request arrives. A cache "
         "misses below it when the pool and storage hold less than the users' working set (blocks evicted), "
         "when a request arrives before the blocks it reuses were stored (requests overlap), or when a "
         "restore fails (recomputed). Each request's hit counts at most its own ideal.")


@dataclasses.dataclass
class TracePlan:
    """What will be sent: per request its prompt, and the trace's ideal."""

    requests: list[TraceRequest]
    block_tokens: int
    system: str
    head_tokens: int
    prompts: list[str]
    ideal_blocks: list[int]
    mismatches: list[str]
    users: list[int] = dataclasses.field(default_factory=list)  # each request's user (empty: all one user's)

    def user(self, i: int) -> int:
        return self.users[i] if self.users else 0


def prepare(requests: Sequence[TraceRequest], text: BlockText, encode: Callable[[str], list[int]],
            encode_chat: EncodeChat, users: Sequence[int] | None = None) -> TracePlan:
    """The prompts, the system message that makes the head whole blocks, and each prompt checked;
    users: each request's user (default: all one user's), the ideal reckoned per user."""
    bt = text.block_tokens
    marker_text = text.block(-1)
    marker = encode(marker_text)
    head, _ = split_template(encode_chat(SYSTEM, marker_text), marker)
    system = SYSTEM + text.block(-2, pad_words(len(head), bt))  # one token per word
    head, tail = split_template(encode_chat(system, marker_text), marker)
    if len(head) % bt:
        raise RuntimeError(f"the chat template's head is {len(head)} tokens, not whole blocks of {bt}")
    prompts, mismatches = [], []
    for i, r in enumerate(requests):
        prompts.append(text.prompt(r))
        wrong = check_prompt(encode_chat(system, prompts[-1]), head, text.expected_ids(r, encode), tail)
        if wrong:
            mismatches.append(f"request {i}: {wrong}")
    users = list(users) if users is not None else []
    return TracePlan(list(requests), bt, system, len(head), prompts,
                     mooncake.ideal_blocks(requests, bt, users or None), mismatches, users)


@dataclasses.dataclass
class Sent:
    """One replayed request: when it was due and sent (s from the replay's start), and its reply."""

    index: int
    due_s: float
    sent_s: float = 0.0
    reply: Reply | None = None
    error: str = ""


async def _one(session, base_url: str, token: str, model: str, plan: TracePlan, i: int, due_s: float,
               begin: float, max_new_tokens: int) -> Sent:
    sent = Sent(i, due_s)
    await asyncio.sleep(max(0.0, begin + due_s - time.perf_counter()))
    sent.sent_s = time.perf_counter() - begin
    r = plan.requests[i]
    max_tokens = max(1, min(r.output_length, max_new_tokens))
    try:
        sent.reply = await chat(session, base_url, token, model, messages_of(plan.system, [], plan.prompts[i]),
                                max_tokens)
    except Exception as exc:  # noqa: BLE001 - reported per request
        sent.error = f"{type(exc).__name__}: {exc}"
        logger.warning("trace request %d failed: %s", i, sent.error)
    return sent


async def replay(base_url: str, token: str | Sequence[str], model: str, plan: TracePlan, speedup: float,
                 max_new_tokens: int) -> tuple[list[Sent], float]:
    """Every request at its timestamp (from the first, divided by speedup), as its user (token: one
    for all, or the bearer token of each user of plan.users); outcomes and wall time (s)."""
    t0 = plan.requests[0].timestamp_ms if plan.requests else 0.0
    tokens = [token] if isinstance(token, str) else list(token)
    begin = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        sent = await asyncio.gather(*(
            _one(session, base_url, tokens[plan.user(i) % len(tokens)], model, plan, i,
                 (r.timestamp_ms - t0) / 1e3 / speedup, begin, max_new_tokens)
            for i, r in enumerate(plan.requests)))
    return list(sent), time.perf_counter() - begin


def figures(plan: TracePlan, sent: Sequence[Sent]) -> dict:
    """Hit tokens against the ideal, per request and in all; TTFT; how late requests were sent."""
    bt, rows = plan.block_tokens, []
    for s in sent:
        r, rep = plan.requests[s.index], s.reply
        hit = max(0, rep.cached_tokens - plan.head_tokens) if rep else 0
        rows.append({"index": s.index, "user": plan.user(s.index), "blocks": len(r.hash_ids),
                     "input_tokens": r.input_length, "ideal_tokens": plan.ideal_blocks[s.index] * bt,
                     "hit_tokens": hit,
                     "cached_tokens": rep.cached_tokens if rep else 0,
                     "prompt_tokens": rep.prompt_tokens if rep else 0,
                     "ttft_s": rep.ttft_s if rep else None, "late_s": s.sent_s - s.due_s, "error": s.error})
    ok = [row for row in rows if not row["error"]]
    ideal, hit = sum(r["ideal_tokens"] for r in ok), sum(r["hit_tokens"] for r in ok)
    capped = sum(min(r["hit_tokens"], r["ideal_tokens"]) for r in ok)  # each at most what it could reuse
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {"requests": len(rows), "failed": len(rows) - len(ok), "users": len({r["user"] for r in rows}),
            "ideal": IDEAL, "ideal_tokens": ideal, "hit_tokens": hit,
            "hit_over_ideal_tokens": capped, "hit_beyond_ideal_tokens": hit - capped,
            "requests_below_ideal": sum(1 for r in ok if r["hit_tokens"] < r["ideal_tokens"]),
            "prefix_hit_vs_ideal": ratio(capped, ideal), "trace_tokens": sum(r["input_tokens"] for r in ok),
            "ideal_share": ratio(ideal, sum(r["input_tokens"] for r in ok)),
            "hit_share": ratio(capped, sum(r["input_tokens"] for r in ok)),
            "cached_share_of_prompt": ratio(sum(r["cached_tokens"] for r in ok), prompt),
            "seen_id_share": mooncake.seen_id_share(plan.requests),
            "ttft_s": summarize([r["ttft_s"] for r in ok]) if ok else None,
            "late_s": summarize([r["late_s"] for r in rows]) if rows else None,
            "head_tokens": plan.head_tokens, "prompt_mismatches": plan.mismatches, "per_request": rows}
