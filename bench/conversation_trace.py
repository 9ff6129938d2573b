"""A synthetic conversation trace shaped like Mooncake's FAST'25 one, and reading real ones (pure).

The synthetic trace is drawn, seeded, from distributions of the Mooncake FAST'25 conversation
workload (kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl; the paper's Table 2:
12,031 requests in one hour, mean input 12,035 tokens, mean output 343, cache ratio 40 %, 512-token
hash blocks). The paper publishes only those means; the shapes below were measured by us on the
released file (`CONVERSATION`'s comments give each figure), sessions inferred from shared prefixes
(a request continues the latest earlier request it shares two or more leading blocks with; block 0
is a system prompt every request shares):

- sessions start as a Poisson process (2.08 a second: 7,373 inferred sessions in 3,537 s);
- turns per session: the trace's own histogram (69 % one turn, mean 1.63, up to 43);
- a first turn's input: lognormal, that of the trace's first turns (median 4,950 tokens), at least
  one token past the shared system block (the file's shortest input is 891 tokens);
- a follow-up's input: the previous input, the previous reply and a new message whose length is
  the trace's quantiles of that growth (median 23 tokens, 90th percentile 4,267);
- replies: the trace's output-length quantiles (median 350, max 2,000);
- think time (previous request to follow-up): lognormal (median 131 s, 90th percentile 462 s);
- block ids as Mooncake's: block 0 is shared by every request; a follow-up repeats its previous
  request's full input blocks (what 82 % of the trace's follow-ups do: the blocks of the reply and
  after are new ids) and gets fresh ids for the rest.

Lengths are drawn in Mooncake's units (512-token blocks, a 128k window) and then scaled by
block_tokens / 512 (bench.mooncake.scale): with the testbed's 32-token blocks, 1/16, so the 128k
window becomes this model's 8,192 tokens and a request keeps its number of blocks. A session ends
when its next turn would not fit the window. Users only name contexts (the Mooncake trace has no
user field; sessions are dealt to users round-robin over a Zipf popularity): ids are global, as
Mooncake's are.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench import mooncake
from bench.mooncake import MOONCAKE_BLOCK_TOKENS, TraceError, TraceRequest
from compute_node.settings import ComputeSettings

MOONCAKE_WINDOW = 131072  # the conversation trace's longest input is 126,195 tokens
MODEL_WINDOW = 8192       # SmolLM2-135M's


@dataclasses.dataclass(frozen=True)
class ConversationParams:
    """The synthetic trace's distributions, in Mooncake's units (tokens of the original trace)."""

    session_rate_per_s: float = 2.08        # 7,373 sessions / 3,537 s
    # turns per session: counts of 1..15 turns among the 7,373 inferred sessions (16+ turns: 20 sessions)
    turn_counts: tuple[int, ...] = (5114, 1311, 464, 200, 117, 55, 27, 26, 10, 16, 5, 2, 4, 2, 5, 15)
    max_turns: int = 43
    first_input_mu: float = 8.509           # ln tokens of first turns (median 4,950; mean 10,765)
    first_input_sigma: float = 1.265
    # quantiles (10, 25, 50, 75, 90, 99 %) of a follow-up's new message: input - previous input - reply
    new_message_q: tuple[float, ...] = (1, 7, 23, 425, 4267, 17091)
    # quantiles (10, 25, 50, 75, 90, 99 %) of the output length (max 2,000; mean 343)
    output_q: tuple[float, ...] = (24, 156, 350, 472, 597, 1120)
    output_max: int = 2000
    think_mu: float = 4.878                 # ln seconds from a request to its follow-up (median 131 s)
    think_sigma: float = 0.978
    window_tokens: int = MOONCAKE_WINDOW
    sessions_per_user_zipf: float = 1.2     # users: only names (see the module doc)


CONVERSATION = ConversationParams()
QUANTILE_LEVELS = (0.10, 0.25, 0.50, 0.75, 0.90, 0.99)


@dataclasses.dataclass(frozen=True)
class Turn:
    """A request of the trace and where it belongs (user, session, its turn in the session)."""

    request: TraceRequest
    user: int
    session: int
    turn: int

    @property
    def context(self) -> str:
        return f"s{self.session}"


def quantile_draw(rng: random.Random, q: Sequence[float], lo: float, hi: float,
                  levels: Sequence[float] = QUANTILE_LEVELS) -> float:
    """A draw from the piecewise-linear inverse CDF through (0, lo), (levels, q) and (1, hi)."""
    xs, ys = [0.0, *levels, 1.0], [lo, *q, hi]
    u = rng.random()
    i = max(1, bisect.bisect_right(xs, u))
    i = min(i, len(xs) - 1)
    f = (u - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + f * (ys[i] - ys[i - 1])


def _turns(rng: random.Random, p: ConversationParams) -> int:
    k = rng.choices(range(1, len(p.turn_counts) + 1), weights=p.turn_counts)[0]
    return rng.randint(k, p.max_turns) if k == len(p.turn_counts) else k


def synthetic_conversations(n: int, seed: int = 0, block_tokens: int = ComputeSettings.block_tokens,
                            params: ConversationParams = CONVERSATION) -> list[Turn]:
    """n requests (the first n by arrival) of sessions drawn from `params`, scaled to block_tokens
    (see the module doc). Deterministic for a seed."""
    if n < 1:
        raise ValueError("need at least one request")
    rng = random.Random(seed)
    p, src = params, MOONCAKE_BLOCK_TOKENS
    next_id = 1  # 0: the system prompt's block

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        next_id += count
        return list(range(next_id - count, next_id))

    users = max(1, n // 3)
    cum = list(itertools.accumulate(1.0 / k ** p.sessions_per_user_zipf for k in range(1, users + 1)))
    out: list[tuple[float, int, int, int, TraceRequest]] = []
    t, session = 0.0, 0
    # sessions start until one starts after the n-th arrival so far (no later one can come before it)
    while True:
        if len(out) >= n and session % 32 == 0 and t > sorted(r[0] for r in out)[n - 1]:
            break
        t += rng.expovariate(p.session_rate_per_s)
        user = rng.choices(range(users), cum_weights=cum)[0]
        now, prev = t, None
        for k in range(_turns(rng, p)):
            out_len = max(1, round(quantile_draw(rng, p.output_q, 1, p.output_max)))
            if prev is None:
                n_in = max(1, round(math.exp(rng.gauss(p.first_input_mu, p.first_input_sigma))))
                n_in = min(max(n_in, src + 1), p.window_tokens - out_len)  # past the system prompt's block
                ids = [0] + fresh(max(0, -(-n_in // src) - 1))
            else:
                now += math.exp(rng.gauss(p.think_mu, p.think_sigma))
                grow = max(1, round(quantile_draw(rng, p.new_message_q, 1, 4 * p.new_message_q[-1])))
                n_in = prev.input_length + prev.output_length + grow
                if n_in + out_len > p.window_tokens:
                    break
                keep = list(prev.hash_ids[:prev.input_length // src])
                ids = keep + fresh(-(-n_in // src) - len(keep))
            prev = TraceRequest(round(now * 1000.0), n_in, out_len, tuple(ids))
            out.append((now, user, session, k, prev))
        session += 1
    out.sort(key=lambda r: r[0])
    turns = scale_turns([Turn(r, user, s, k) for _, user, s, k, r in out[:n]], src, block_tokens)
    window = p.window_tokens * block_tokens // src  # rounding in scale may pass it by a token or so
    return [dataclasses.replace(t, request=fit_window(t.request, block_tokens, window)) for t in turns]


def scale_turns(turns: Sequence[Turn], source_block_tokens: int, block_tokens: int) -> list[Turn]:
    """Lengths scaled from the trace's block size to block_tokens (bench.mooncake.scale)."""
    scaled = mooncake.scale([t.request for t in turns], source_block_tokens, block_tokens)
    return [dataclasses.replace(t, request=r) for t, r in zip(turns, scaled)]


def infer_sessions(requests: Sequence[TraceRequest], min_shared: int = 2) -> list[Turn]:
    """Turns of a trace without sessions (Mooncake's JSONL): a request continues the latest earlier
    request it shares at least min_shared leading blocks with, else it starts a session. User 0."""
    latest: dict[tuple[int, ...], int] = {}
    session_of: list[int] = []
    turn_of: list[int] = []
    sessions = 0
    for i, r in enumerate(requests):
        parent = None
        for j in range(len(r.hash_ids), min_shared - 1, -1):
            parent = latest.get(r.hash_ids[:j])
            if parent is not None:
                break
        if parent is None:
            session_of.append(sessions)
            turn_of.append(0)
            sessions += 1
        else:
            session_of.append(session_of[parent])
            turn_of.append(turn_of[parent] + 1)
        for j in range(min_shared, len(r.hash_ids) + 1):
            latest[r.hash_ids[:j]] = i
    return [Turn(r, 0, s, k) for r, s, k in zip(requests, session_of, turn_of)]


def load_mooncake(path: str | Path, block_tokens: int = ComputeSettings.block_tokens, source_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                  limit: int = 0) -> list[Turn]:
    """A Mooncake-format JSONL trace (bench.mooncake's parser), its first `limit` requests (0: all),
    sessions inferred, lengths scaled from source_block_tokens to block_tokens and capped to the
    model's window (a request past it is cut to the window, its reply first)."""
    requests = mooncake.load_trace(path)
    if limit:
        requests = requests[:limit]
    if not requests:
        raise TraceError(f"{path}: no requests")
    mooncake.check_blocks(requests, source_block_tokens)
    turns = scale_turns(infer_sessions(requests), source_block_tokens, block_tokens)
    return [dataclasses.replace(t, request=fit_window(t.request, block_tokens)) for t in turns]


def fit_window(r: TraceRequest, block_tokens: int, window: int = MODEL_WINDOW) -> TraceRequest:
    """A request cut to fit the model's window: its reply shortened first, then its input (whole blocks)."""
    if r.input_length + r.output_length <= window:
        return r
    out_len = max(1, min(r.output_length, window - r.input_length))
    n_in = min(r.input_length, window - out_len)
    blocks = -(-n_in // block_tokens)
    return dataclasses.replace(r, input_length=n_in, output_length=out_len, hash_ids=r.hash_ids[:blocks])


def dump(turns: Iterable[Turn]) -> str:
    """The Mooncake JSONL of turns (extra fields `user` and `session`, which Mooncake readers ignore)."""
    lines = []
    for t in turns:
        r = t.request
        lines.append(r.to_json()[:-1] + f', "user": {t.user}, "session": {t.session}}}')
    return "".join(line + "\n" for line in lines)


def summary(turns: Sequence[Turn], block_tokens: int) -> dict:
    """What the trace is: requests, sessions, users, lengths, span, the ideal block share."""
    reqs = [t.request for t in turns]
    ins, outs = [r.input_length for r in reqs], [r.output_length for r in reqs]
    ideal = mooncake.ideal_blocks(reqs, block_tokens)
    looked = sum(min((r.input_length - 1) // block_tokens, len(r.hash_ids)) for r in reqs)
    follow = [t for t in turns if t.turn > 0]
    return {"requests": len(reqs), "sessions": len({t.session for t in turns}),
            "users": len({t.user for t in turns}), "follow_ups": len(follow),
            "mean_input_tokens": sum(ins) / len(ins), "median_input_tokens": sorted(ins)[len(ins) // 2],
            "max_input_tokens": max(ins), "mean_output_tokens": sum(outs) / len(outs),
            "span_s": (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0,
            "distinct_blocks": len({h for r in reqs for h in r.hash_ids}),
            "ideal_block_share": sum(ideal) / looked if looked else 0.0}
