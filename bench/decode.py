"""`kvtb bench decode`: tokens/s of batched greedy decode with the real model, paged runner vs transformers.

For each batch size, B sequences of --context-tokens tokens (different texts) are prefilled
(untimed) twice: into our paged model runner (KV in a shared-memory pool, block tables of shuffled
block ids) and into transformers' LlamaForCausalLM with its own DynamicCache (every sequence has
the same length, so the batch needs no padding). Then --rounds rounds each time --steps decode
steps of one, then of the other, every step one forward over the whole batch: the two run side by
side, under the same load. Reports tokens/s (best round, median beside it) per batch size, the
ratio to the first batch size of each, and the share of sequences whose greedy tokens equal
transformers' (batched float math may differ in the last bits). Where the compiled attention kernel
is built (compute_node._attention), a second paged runner over its own pool attends with torch
over gathered blocks instead, in the same rounds: paged_vs_paged_torch is what the kernel gives.

What per-sequence sampling costs a step: at each step of the paged runner, its logits are also
sampled by compute_node.sampling with every parameter of vLLM's on for every row (temperature,
top_k, top_p, min_p, the three penalties, a logit bias, logprobs with the top 5), each row with its
own seed, as the engine does; the greedy choice is still what is decoded (so the replies stay
comparable), and the sampler accepts it. `sampled_step_vs_greedy_step` is (forward + full sampling)
over (forward + argmax), both timed in the same steps.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
import uuid

import torch

from bench import stats
from bench.results import add_common_args, finish, format_table, new_result, progress_for, setup_logging

logger = logging.getLogger(__name__)

TEXT = ("The history of bread begins with wild grains ground between stones, mixed with water "
        "and baked on hot embers; over centuries bakers learned to keep a sourdough starter. ")
KINDS = ("paged", "paged_torch", "transformers")  # paged_torch: only when the kernel is built


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench decode", description=__doc__.splitlines()[0])
    add_common_args(parser, "decode")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32], help="batch sizes (default 1 8 16 32)")
    parser.add_argument("--context-tokens", type=int, default=256, help="tokens per sequence before decoding (default 256)")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per timed round (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per batch size and runner (default 3)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed decode steps first (default 2)")
    parser.add_argument("--block-tokens", type=int, default=32, help="tokens per KV block (default 32)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch threads (default 0: all cores)")
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or min(args.context_tokens, args.steps, args.rounds, args.block_tokens) < 1:
        parser.error("batch sizes, --context-tokens, --steps, --rounds and --block-tokens must be positive")
    return args


def prompts(tokenizer, batch: int, tokens: int) -> list[list[int]]:
    """`batch` different token sequences of exactly `tokens` tokens."""
    return [tokenizer.encode(f"Story {i}, part {i * 7 % 13}: " + TEXT * (tokens // 20 + 1))[:tokens]
            for i in range(batch)]


FULL_SAMPLING = dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02, presence_penalty=0.5,
                     frequency_penalty=0.5, repetition_penalty=1.1, logit_bias={13: 1.0, 28: -1.0},
                     logprobs=True, top_logprobs=5)


def full_samplers(ids: list[list[int]], vocab_size: int) -> list:
    """One sampler per sequence with every sampling parameter on, each with its own seed."""
    from compute_node.sampling import SamplingParams, SequenceSampler
    return [SequenceSampler(SamplingParams(seed=i, **FULL_SAMPLING), vocab_size, seq) for i, seq in enumerate(ids)]


class PagedDecode:
    """Greedy decode of a batch with our paged model runner; with samplers, also the time to sample each
    step's logits with them (greedy_s and sampling_s: the argmax's time and theirs)."""

    def __init__(self, runner, ids: list[list[int]], blocks_per_seq: int, samplers: list | None = None):
        from compute_node.model_runner import SeqRun
        self.SeqRun, self.runner, self.samplers = SeqRun, runner, samplers
        self.greedy_s = self.sampling_s = 0.0
        order = torch.randperm(runner.pool.shape[0], generator=torch.Generator().manual_seed(len(ids))).tolist()
        self.tables = [order[s * blocks_per_seq:(s + 1) * blocks_per_seq] for s in range(len(ids))]
        self.last = [runner.greedy(runner.step([SeqRun(seq, 0, t)]))[0] for seq, t in zip(ids, self.tables)]
        self.length = len(ids[0])
        self.out = [[t] for t in self.last]

    def steps(self, n: int) -> float:
        """Seconds for n greedy decode steps (the sampling measured beside them left out)."""
        start, sampling = time.perf_counter(), 0.0
        for _ in range(n):
            runs = [self.SeqRun([t], self.length, table) for t, table in zip(self.last, self.tables)]
            logits = self.runner.step(runs)
            picked = time.perf_counter()
            self.last = self.runner.greedy(logits)
            if self.samplers is not None:
                sampling += self._sample(logits, time.perf_counter() - picked)
            self.length += 1
            for seq, t in zip(self.out, self.last):
                seq.append(t)
        return time.perf_counter() - start - sampling

    def _sample(self, logits, greedy_s: float) -> float:
        """Sample the step's logits with every parameter on, as the engine would; the seconds it took."""
        from compute_node.sampling import sample
        begin = time.perf_counter()
        sample(logits, self.samplers)
        for sampler, token in zip(self.samplers, self.last):
            sampler.accept(token)
        spent = time.perf_counter() - begin
        self.greedy_s += greedy_s
        self.sampling_s += spent
        return spent


class TransformersDecode:
    """Greedy decode of a batch with transformers and its DynamicCache."""

    @torch.inference_mode()
    def __init__(self, model, ids: list[list[int]]):
        from transformers import DynamicCache
        self.model = model
        self.cache = DynamicCache(config=model.config)
        x = torch.tensor(ids)  # [B, context]
        logits = model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        self.last = logits.argmax(-1)  # [B]
        self.out = [[t] for t in self.last.tolist()]

    @torch.inference_mode()
    def steps(self, n: int) -> float:
        """Seconds for n decode steps."""
        start = time.perf_counter()
        for _ in range(n):
            logits = self.model(input_ids=self.last[:, None], cache=self.cache, use_cache=True).logits[:, -1]
            self.last = logits.argmax(-1)
            for seq, t in zip(self.out, self.last.tolist()):
                seq.append(t)
        return time.perf_counter() - start


def measure(runners: dict, model, ids: list[list[int]], args, blocks_per_seq: int, progress) -> dict:
    """Every decoder over one batch (the paged runners by name, and transformers), their timed rounds
    interleaved."""
    vocab = model.config.vocab_size
    decoders = {kind: PagedDecode(runner, ids, blocks_per_seq, full_samplers(ids, vocab) if kind == "paged" else None)
                for kind, runner in runners.items()}
    decoders["transformers"] = TransformersDecode(model, ids)
    for d in decoders.values():
        d.steps(args.warmup_steps)
    paged = decoders["paged"]
    paged.greedy_s = paged.sampling_s = 0.0
    rates = {k: [] for k in decoders}
    for _ in range(args.rounds):
        for kind, d in decoders.items():
            rates[kind].append(len(ids) * args.steps / d.steps(args.steps))
            progress.update(1)
    same = sum(a == b for a, b in zip(decoders["paged"].out, decoders["transformers"].out)) / len(ids)
    timed = args.rounds * args.steps
    step_s = sum(len(ids) * args.steps / r for r in rates["paged"]) / timed  # forward + argmax
    greedy_s, sampling_s = paged.greedy_s / timed, paged.sampling_s / timed
    row = {"identical_to_transformers": same, "step_ms": step_s * 1e3, "greedy_ms_per_step": greedy_s * 1e3,
           "sampling_ms_per_step": sampling_s * 1e3,
           "sampled_step_vs_greedy_step": stats.ratio(step_s - greedy_s + sampling_s, step_s)}
    for kind in decoders:
        row |= {f"{kind}_tokens_per_s": max(rates[kind]), f"{kind}_tokens_per_s_median": stats.median(rates[kind]),
                f"{kind}_rounds_tokens_per_s": rates[kind]}
    return row


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from compute_node.llama import pool_shape
    from compute_node.model_loader import load_model
    from compute_node.model_runner import ModelRunner
    from compute_node.paged_attention import kernel_built
    from compute_node.settings import ComputeSettings
    from hostmem.region import Region

    threads = args.torch_threads or os.cpu_count()
    torch.set_num_threads(threads)
    model, tokenizer = load_model(ComputeSettings().model_cache_dir, threads, reference=True)
    per_seq = -(-(args.context_tokens + args.warmup_steps + args.rounds * args.steps) // args.block_tokens)
    shape = pool_shape(model.config, max(args.batches) * per_seq, args.block_tokens)
    kv_bytes = 4 * torch.Size(shape).numel()
    # the paged runners, each over its own pool: "paged" as the compute node runs (the kernel where it
    # is built), and beside it "paged_torch" with torch's attention when the kernel is there
    kernels = {"paged": True, **({"paged_torch": False} if kernel_built() else {})}
    regions = [Region.create(f"kvtb-bench-decode-{os.getpid()}-{uuid.uuid4().hex[:6]}", kv_bytes + 16, kv_bytes, 1)
               for _ in kernels]
    progress = progress_for(args, (1 + len(kernels)) * args.rounds * len(args.batches), "decode")
    started = time.monotonic()
    rows = {}
    try:
        # pool: [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32, in a region
        pools = [torch.frombuffer(r.buffer, dtype=torch.float32, count=kv_bytes // 4).view(shape)
                 for r in regions]
        runners = {kind: ModelRunner(model, pool, attention_kernel=kernel)
                   for (kind, kernel), pool in zip(kernels.items(), pools)}
        for batch in args.batches:
            ids = prompts(tokenizer, batch, args.context_tokens)
            rows[batch] = measure(runners, model, ids, args, per_seq, progress)
        del pools, runners
    finally:
        progress.close()
        for r in regions:
            r.close()
    result = new_result("decode", {"batches": args.batches, "context_tokens": args.context_tokens,
                                   "steps": args.steps, "rounds": args.rounds, "warmup_steps": args.warmup_steps,
                                   "block_tokens": args.block_tokens, "torch_threads": threads,
                                   "attention": "kernel" if kernel_built() else "torch"})
    result["results"] = {"batches": {str(b): r for b, r in rows.items()}, "seconds": time.monotonic() - started}
    result["ratios"] = ratios(rows)
    finish(args, result, render(result))
    return 0


def ratios(rows: dict[int, dict]) -> dict[str, float]:
    """Each runner's tokens/s at each batch size over its own at the first; paged over transformers."""
    first = min(rows)
    out = {}
    for b, r in rows.items():
        for kind in (k for k in KINDS if f"{k}_tokens_per_s" in r):
            r[f"{kind}_vs_first"] = stats.ratio(r[f"{kind}_tokens_per_s"], rows[first][f"{kind}_tokens_per_s"])
            if b != first:
                out[f"{kind}_tokens_per_s_{b}_vs_{first}"] = r[f"{kind}_vs_first"]
        r["paged_vs_transformers"] = stats.ratio(r["paged_tokens_per_s"], r["transformers_tokens_per_s"])
        out[f"paged_vs_transformers_{b}"] = r["paged_vs_transformers"]
        out[f"sampled_step_vs_greedy_step_{b}"] = r["sampled_step_vs_greedy_step"]
        if "paged_torch_tokens_per_s" in r:
            r["paged_vs_paged_torch"] = stats.ratio(r["paged_tokens_per_s"], r["paged_torch_tokens_per_s"])
            out[f"paged_vs_paged_torch_{b}"] = r["paged_vs_paged_torch"]
    return out


def render(result: dict) -> str:
    """The readable table."""
    s = result["settings"]
    rows = [[b, round(r["paged_tokens_per_s"], 1), round(r["paged_tokens_per_s_median"], 1),
             round(r["paged_vs_first"], 2), round(r["transformers_tokens_per_s"], 1),
             round(r["transformers_tokens_per_s_median"], 1), round(r["transformers_vs_first"], 2),
             round(r["paged_vs_transformers"], 2), round(r["identical_to_transformers"], 2),
             round(r["paged_torch_tokens_per_s"], 1) if "paged_torch_tokens_per_s" in r else "-",
             round(r["paged_vs_paged_torch"], 2) if "paged_vs_paged_torch" in r else "-",
             round(r["step_ms"], 1), round(r["sampling_ms_per_step"], 2), round(r["sampled_step_vs_greedy_step"], 2)]
            for b, r in result["results"]["batches"].items()]
    title = (f"greedy decode after {s['context_tokens']}-token contexts, {s['rounds']} rounds of {s['steps']} steps "
             f"(tokens/s: best round, median), blocks of {s['block_tokens']} tokens, {s['torch_threads']} torch threads, "
             f"paged attention by {s.get('attention', 'torch')}:")
    return "\n".join([
        title,
        format_table(["batch", "paged tok/s", "median", "x first", "transformers tok/s", "median", "x first",
                             "paged/transformers", "identical", "paged, torch attention tok/s",
                             "paged/torch attention", "step ms", "full sampling ms", "sampled/greedy step"],
                     rows)])


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
