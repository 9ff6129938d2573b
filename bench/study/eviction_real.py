"""The eviction study's real check: one capacity replayed through the real services, against the replay.

A small trace of the same distributions (think times compressed, sessions started less often,
requests cut to REAL_WINDOW tokens and replies to REAL_MAX_OUTPUT) goes through the storage node,
the agent and the compute node (bench.stack) under each policy asked for, REPEATS times, each
repeat in a fresh stack (the agent's eviction thread and out-of-order PUTs make a block differ
from run to run: the claim is judged over the repeats). Each repeat's hit rate is set beside the
replay's (bench.cache_replay) at the capacity the agent really had (its watermarks over the
stored block's bytes).
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

from bench import cache_replay as cr
from bench import conversation_trace as ct
from bench import scaled
from bench.progress import Progress
from bench.results import data_dir
from bench.stack import Stack, bench_config
from bench.study.report import run_part

REAL_WINDOW = 2048           # the real check's requests are cut to this (prefill time on CPU) ...
REAL_MAX_OUTPUT = 8          # ... and their replies to this (decode time)
REAL_THINK_SCALE = 1 / 50    # and their think times compressed, sessions started less often, so that a
REAL_SESSION_SCALE = 1 / 4   # short trace has follow-ups (a whole hour's mix needs thousands of requests)
VOCAB_RANGE = (1000, 40000)  # token ids drawn for a block (SmolLM2's vocabulary is 49,152)


def check_turns(args, bt: int) -> list[ct.Turn]:
    """The real check's small trace: the same distributions, think times compressed and sessions
    started less often (REAL_THINK_SCALE, REAL_SESSION_SCALE), requests cut to
    REAL_WINDOW tokens and replies to REAL_MAX_OUTPUT."""
    p = ct.CONVERSATION
    params = dataclasses.replace(p, think_mu=p.think_mu + math.log(REAL_THINK_SCALE),
                                 session_rate_per_s=p.session_rate_per_s * REAL_SESSION_SCALE)
    turns = ct.synthetic_conversations(args.real_requests, args.seed + 1, bt, params)
    out = []
    for t in turns:
        r = ct.fit_window(t.request, bt, REAL_WINDOW)
        r = dataclasses.replace(r, output_length=min(r.output_length, REAL_MAX_OUTPUT))
        out.append(dataclasses.replace(t, request=r))
    return out


def block_ids(hash_id: int, bt: int, seed: int) -> list[int]:
    """A block's token ids: drawn by a generator seeded with its id (equal ids, equal tokens)."""
    rng = random.Random(f"{seed}:{hash_id}")
    return [rng.randrange(*VOCAB_RANGE) for _ in range(bt)]


def prompt_ids(request, bt: int, seed: int) -> list[int]:
    ids: list[int] = []
    for h in request.hash_ids:
        ids += block_ids(h, bt, seed)
    return ids[:request.input_length]


def model_block_bytes(model_dir: str, bt: int) -> int:
    """A stored block's payload from the model's config (fp32 K and V of every layer, and the ids)."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_token = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * 4
    return bt * (per_token + 4)


def real_policy(args, policy: str, turns: list[ct.Turn], cap: int, services: Path, model_dir: str,
                bt: int, progress: Progress, rep: int = 0) -> dict:
    """One policy through the real services, in a fresh stack (repeat `rep`): per request, the blocks
    the agent restored. The compute
    node runs one torch thread: on a busy 2-core host, OpenMP threads that wait for each other at
    every parallel region made a turn take 20 s (REFERENCES.md: vLLM binds its threads for this)."""
    from bench.turns import generate

    est = model_block_bytes(model_dir, bt)
    high = int((cap + 0.5) * est)
    low = int((cr.low_of(cap, args.low_watermark) + 0.5) * est)
    smartnic = {"capacity_high_bytes": high, "capacity_low_bytes": low, "eviction_policy": "lru",
                "admission": "on_reuse" if policy == "on_reuse" else "always", "eviction_interval_s": 0.05}
    config = bench_config(pool_tokens=2 * REAL_WINDOW + 256, max_context_tokens=REAL_WINDOW + 64, users=1,
                          smartnic=smartnic, compute={"model_cache_dir": model_dir, "torch_threads": 1})
    hits, failed = [], 0
    with Stack(services / f"real-{policy}-{rep + 1}", config, keep_data=args.keep_data,
               placement=args.placement) as stack:
        with stack.agent_channel() as channel:
            stub = stack.compute_stub(channel)
            generate(stub, "warm-up", "warm-up", block_ids(-1, bt, args.seed)[:16], 2, "recompute")
            for t in turns:
                r = t.request
                turn = generate(stub, "u0", t.context, prompt_ids(r, bt, args.seed), max(1, r.output_length),
                                ignore_eos=True)
                hits.append(int(turn.record.blocks_restored))
                failed += int(turn.record.blocks_failed)
                progress.update()
        stats = stack.agent_stats()
        if args.profile_obj is not None:
            args.pacing += scaled.stack_pacing(stack)
    block_bytes = stats.bytes_stored / stats.chunks if stats.chunks else est
    return {"policy": policy, "repeat": rep + 1, "agent": smartnic, "hits_per_request": hits, "hits": sum(hits),
            "blocks_failed": failed, "block_bytes": block_bytes, "estimated_block_bytes": est,
            "capacity_blocks": int(high // block_bytes), "low_blocks": int(low // block_bytes),
            "puts": round(stats.bytes_put / block_bytes), "puts_skipped": int(stats.puts_skipped),
            "evictions": dict(stats.evictions_by_reason), "stored_blocks_at_end": int(stats.chunks)}


def scaled_real_part(study: dict, args, bt: int, progress: Progress) -> dict:
    """The real part, under --profile at D (the trace and its replays are counts, not times: they need
    none). Its services pace every modeled operation; the agent's idle timer counts virtual seconds."""
    if args.profile_obj is None:
        return real_part(study, args, bt, progress)
    dilation, how, warmup = scaled.choose_dilation(args.profile_obj, args.dilation_value, args.smoke, 1)
    scaled.apply(args.profile_obj.name, dilation)
    study["settings"]["profile"], study["settings"]["dilation"] = args.profile_obj.name, dilation
    try:
        return real_part(study, args, bt, progress)
    finally:
        scaled.clear()
        study["scale"] = scaled.record(args.profile_obj, dilation, args.pacing, how)
        study["scale"]["warmup"] = warmup


def real_part(study: dict, args, bt: int, progress: Progress) -> dict:
    turns = check_turns(args, bt)
    accesses = cr.accesses_of([t.request for t in turns], bt, [t.context for t in turns])
    ws = cr.working_set(accesses)
    cap = max(1, round(args.real_capacity * ws))
    out: dict[str, Any] = {"trace": ct.summary(turns, bt), "working_set_blocks": ws,
                           "fraction": args.real_capacity, "capacity_blocks_asked": cap,
                           "think_scale": REAL_THINK_SCALE, "session_rate_scale": REAL_SESSION_SCALE,
                           "window": REAL_WINDOW, "max_output": REAL_MAX_OUTPUT,
                           "lookups": sum(a.lookup for a in accesses), "repeats": args.real_repeats,
                           "runs": {p: [] for p in args.real_policies}}
    out["ideal_hit_rate"] = cr.ideal(accesses).hit_rate
    study["results"]["real"] = out
    with data_dir(args, "eviction-real") as services:
        if args.smoke:
            from bench.study.tiny_model import make_tiny_model
            model_dir = str(make_tiny_model(services / "tiny-model"))
        else:
            from compute_node.settings import ComputeSettings
            model_dir = ComputeSettings().model_cache_dir
        for rep in range(args.real_repeats):
            for policy in args.real_policies:
                def one(policy=policy, rep=rep):
                    real = real_policy(args, policy, turns, cap, services, model_dir, bt, progress, rep)
                    out["runs"][policy].append(against_replay(real, accesses, out["lookups"]))
                run_part(study, f"real {policy} repeat {rep + 1}", one)
    return out


def against_replay(real: dict, accesses: list[cr.Access], lookups: int) -> dict:
    """One real run with its hit rate and the replay's at the capacity the agent had beside it."""
    sim = cr.replay(accesses, real["policy"], real["capacity_blocks"], low_blocks=real["low_blocks"])
    real["hit_rate"] = real["hits"] / lookups if lookups else 0.0
    real["simulated"] = sim.to_json()
    pairs = zip(real["hits_per_request"], sim.hits_per_request)
    real["requests_differing"] = sum(1 for a, b in pairs if a != b)
    return real
