"""Compute freed, measured as compute: a decode beside each policy's offload, its TBT and the host's CPU.

The whole stack runs as processes (storage node, agent, compute node with the model, frontend: `kvtb up`'s
Deployment, bench.stack.Stack). A sample is one greedy decode of `decode_tokens` tokens through the agent
(as the frontend sends it) under one policy, its blocks (BLOCK_TOKENS tokens) leaving the pool as they
fill: `resident` (nothing leaves: the baseline), `cpu` (the engine thread copies, seals, stores and waits
for each block's acknowledgement) and `triggered` (the engine thread writes a descriptor and a counter;
the agent stores the block). The policies take turns in an order that rotates each round
(bench.offload.policy_order) after one warm-up turn each (connections and handshakes made before the clock).

Per sample: the decode's mean time between tokens (its record's tbt_ms), the bytes and blocks it offloaded,
and the CPU time each serving process used meanwhile (the compute node, the agent, the storage node; the
frontend idles: turns go to the agent). The offload's host CPU is a sample's CPU minus the resident
sample's of the same round (the decode's own compute cancels), per GB offloaded.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

from bench.offload import POLICIES, policy_order, warm_up_tokens
from bench.stats import ratio

BLOCK_TOKENS = 8
PROMPT = "Tell me a long story about a baker who travels the world."
DECODE_TOKENS = {"full": 256, "quick": 96, "smoke": 12}
REPEATS = {"full": 5, "quick": 3, "smoke": 1}
SERVING = ("compute", "smartnic", "storage")  # the serving processes whose CPU time counts


def serving_cpu(seconds: dict[str, float]) -> dict[str, float]:
    """A Stack.cpu_seconds() reading as {compute, smartnic, storage} (storage nodes summed)."""
    out = {s: 0.0 for s in SERVING}
    for name, value in seconds.items():
        service = name.split("-")[0]
        if service in out:
            out[service] += value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def offload_cpu_s_per_gb(sample: dict, baseline: dict) -> float | None:
    """The host CPU seconds (every serving process) a sample used beyond its round's resident sample, per GB
    it offloaded; None when it offloaded nothing (pure)."""
    if not sample["bytes"]:
        return None
    extra = sum(sample["cpu_s"].values()) - sum(baseline["cpu_s"].values())
    return extra / (sample["bytes"] / 1e9)


def tbt_ratio(rounds: dict[int, dict[str, dict]], num: str, den: str) -> list[float]:
    """Per round, TBT of policy num / policy den (pure)."""
    return [ratio(r[num]["tbt_ms"], r[den]["tbt_ms"]) for _, r in sorted(rounds.items()) if num in r and den in r]


def by_round(samples: list[dict]) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for s in samples:
        out.setdefault(s["round"], {})[s["policy"]] = s
    return out


def measure(directory: Path, mode: str, progress, keep_data: bool = False) -> dict:
    """Warm-up, then REPEATS[mode] rounds of one decode per policy; the samples and settings."""
    from bench.stack import Stack, bench_config
    from bench.turns import encode, generate

    decode_tokens, repeats = DECODE_TOKENS[mode], REPEATS[mode]
    compute = {"block_tokens": BLOCK_TOKENS}
    if mode == "smoke":
        from bench.study.paper_turn import cached_tiny_model
        compute["model_cache_dir"] = str(cached_tiny_model())
    config = bench_config(users=1, max_new_tokens=decode_tokens, pool_tokens=4096, max_context_tokens=1024,
                          compute=compute)
    samples: list[dict] = []
    with Stack(directory / "decode", config, policy="triggered", keep_data=keep_data) as stack:
        with stack.agent_channel() as channel:
            stub = stack.compute_stub(channel)
            prompt = encode(stub, PROMPT, False)
            for policy in POLICIES:  # connections and handshakes before the clock
                generate(stub, f"warm-{policy}", f"warm-{uuid.uuid4().hex[:8]}", prompt,
                         warm_up_tokens(len(prompt), BLOCK_TOKENS), policy, timeout_s=900, ignore_eos=True)
            progress.update(note="decode warm-up")
            for round_ in range(repeats):
                for policy in policy_order(round_):
                    before, t0 = serving_cpu(stack.cpu_seconds()), time.perf_counter()
                    r = generate(stub, f"causes-{policy}-{round_}", f"{policy}-{uuid.uuid4().hex[:8]}", prompt,
                                 decode_tokens, policy, timeout_s=900, ignore_eos=True).record
                    cpu = delta(serving_cpu(stack.cpu_seconds()), before)
                    samples.append({"policy": policy, "round": round_, "tbt_ms": r.tbt_ms,
                                    "wall_s": time.perf_counter() - t0, "bytes": r.bytes_offloaded,
                                    "blocks": r.chunks_offloaded, "stall_ms": r.offload_stall_ms, "cpu_s": cpu})
                progress.update(note=f"decode round {round_ + 1}")
    return {"samples": samples, "decode_tokens": decode_tokens, "prompt_tokens": len(prompt),
            "block_tokens": BLOCK_TOKENS, "repeats": repeats, "policies": list(POLICIES),
            "model": "tiny random (smoke)" if mode == "smoke" else "SmolLM2-135M-Instruct"}
