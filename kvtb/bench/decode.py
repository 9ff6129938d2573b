"""`kvtb bench decode`: tokens/s of batched greedy decode with the real model, paged runner vs transformers.

For each batch size, B sequences of --context-tokens tokens (different texts) are prefilled
(untimed), then --steps decode steps run, each one forward over the whole batch: once with our
paged model runner (KV in a shared-memory pool, block tables of shuffled block ids) and once with
transformers' LlamaForCausalLM over a batch with its own DynamicCache, side by side in one run.
Reports tokens/s per batch size, the ratio to batch 1 of each, and the share of sequences whose
greedy tokens equal transformers' (batched float math may differ in the last bits).
"""
from __future__ import annotations

import argparse
import logging
import os
import time
import uuid

import torch

from kvtb.bench import output, stats
from kvtb.bench.common import add_common_args, new_result, progress_for

logger = logging.getLogger(__name__)

TEXT = ("The history of bread begins with wild grains ground between stones, mixed with water "
        "and baked on hot embers; over centuries bakers learned to keep a sourdough starter. ")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench decode", description=__doc__.splitlines()[0])
    add_common_args(parser, "decode")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32], help="batch sizes (default 1 8 16 32)")
    parser.add_argument("--context-tokens", type=int, default=256, help="tokens per sequence before decoding (default 256)")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per batch size (default 32)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed decode steps first (default 2)")
    parser.add_argument("--block-tokens", type=int, default=32, help="tokens per KV block (default 32)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch threads (default 0: all cores)")
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or args.context_tokens < 1 or args.steps < 1 or args.block_tokens < 1:
        parser.error("batch sizes, --context-tokens, --steps and --block-tokens must be positive")
    return args


def prompts(tokenizer, batch: int, tokens: int) -> list[list[int]]:
    """`batch` different token sequences of exactly `tokens` tokens."""
    out = []
    for i in range(batch):
        ids = tokenizer.encode(f"Story {i}, part {i * 7 % 13}: " + TEXT * (tokens // 20 + 1))
        out.append(ids[:tokens])
    return out


def paged_decode(runner, ids: list[list[int]], args, pool_blocks: int) -> tuple[float, list[list[int]]]:
    """(tokens/s, greedy tokens per sequence) of batched decode with the paged runner."""
    from compute_node.model_runner import SeqRun
    bt = args.block_tokens
    per_seq = -(-(args.context_tokens + args.warmup_steps + args.steps) // bt)
    order = torch.randperm(pool_blocks, generator=torch.Generator().manual_seed(len(ids))).tolist()
    tables = [order[s * per_seq:(s + 1) * per_seq] for s in range(len(ids))]
    last = [runner.greedy(runner.step([SeqRun(seq, 0, table)]))[0] for seq, table in zip(ids, tables)]
    out = [[t] for t in last]
    length = args.context_tokens
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            start = time.perf_counter()
        last = runner.greedy(runner.step([SeqRun([t], length, table) for t, table in zip(last, tables)]))
        length += 1
        for seq, t in zip(out, last):
            seq.append(t)
    return len(ids) * args.steps / (time.perf_counter() - start), out


@torch.inference_mode()
def transformers_decode(model, ids: list[list[int]], args) -> tuple[float, list[list[int]]]:
    """(tokens/s, greedy tokens per sequence) of transformers' batched decode with a DynamicCache."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    x = torch.tensor(ids)  # [B, context]: every sequence has the same length, no padding needed
    last = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)
    out = [[t] for t in last.tolist()]
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            start = time.perf_counter()
        logits = model(input_ids=last[:, None], cache=cache, use_cache=True).logits[:, -1]
        last = logits.argmax(-1)
        for seq, t in zip(out, last.tolist()):
            seq.append(t)
    return len(ids) * args.steps / (time.perf_counter() - start), out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from compute_node.llama import pool_shape
    from compute_node.model_loader import load_model
    from compute_node.model_runner import ModelRunner
    from compute_node.settings import ComputeSettings
    from smartnic.region import Region

    threads = args.torch_threads or os.cpu_count()
    torch.set_num_threads(threads)
    model, tokenizer = load_model(ComputeSettings().model_cache_dir, threads)
    per_seq = -(-(args.context_tokens + args.warmup_steps + args.steps) // args.block_tokens)
    shape = pool_shape(model.config, max(args.batches) * per_seq, args.block_tokens)
    kv_bytes = 4 * int(torch.Size(shape).numel())
    region = Region.create(f"kvtb-bench-decode-{os.getpid()}-{uuid.uuid4().hex[:6]}", kv_bytes + 16, kv_bytes, 1)
    progress = progress_for(args, 2 * len(args.batches), "decode")
    rows = {}
    try:
        # pool: [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32, in the region
        pool = torch.frombuffer(region.buffer, dtype=torch.float32, count=kv_bytes // 4).view(shape)
        runner = ModelRunner(model, pool)
        for batch in args.batches:
            ids = prompts(tokenizer, batch, args.context_tokens)
            paged, paged_out = paged_decode(runner, ids, args, shape[0])
            progress.update(1)
            reference, ref_out = transformers_decode(model, ids, args)
            progress.update(1)
            same = sum(a == b for a, b in zip(paged_out, ref_out)) / batch
            rows[batch] = {"paged_tokens_per_s": paged, "transformers_tokens_per_s": reference,
                           "identical_to_transformers": same}
        del pool, runner
    finally:
        progress.close()
        region.close()
    result = new_result("decode", {"batches": args.batches, "context_tokens": args.context_tokens,
                                   "steps": args.steps, "warmup_steps": args.warmup_steps,
                                   "block_tokens": args.block_tokens, "torch_threads": threads})
    result["results"] = {str(b): r for b, r in rows.items()}
    base = rows[args.batches[0]]
    for b, r in rows.items():
        r["paged_vs_first"] = stats.ratio(r["paged_tokens_per_s"], base["paged_tokens_per_s"])
        r["transformers_vs_first"] = stats.ratio(r["transformers_tokens_per_s"], base["transformers_tokens_per_s"])
        r["paged_vs_transformers"] = stats.ratio(r["paged_tokens_per_s"], r["transformers_tokens_per_s"])
        if b != args.batches[0]:
            result["ratios"][f"paged_tokens_per_s_{b}_vs_{args.batches[0]}"] = r["paged_vs_first"]
            result["ratios"][f"transformers_tokens_per_s_{b}_vs_{args.batches[0]}"] = r["transformers_vs_first"]
    output.write_json(args.out, "decode.json", result)
    if args.json:
        output.emit_json(result)
    else:
        print(render(result))
    return 0


def render(result: dict) -> str:
    """The readable table."""
    s = result["settings"]
    rows = [[b, round(r["paged_tokens_per_s"], 1), round(r["paged_vs_first"], 2),
             round(r["transformers_tokens_per_s"], 1), round(r["transformers_vs_first"], 2),
             round(r["paged_vs_transformers"], 2), round(r["identical_to_transformers"], 2)]
            for b, r in result["results"].items()]
    return "\n".join([
        f"greedy decode of {s['steps']} steps after {s['context_tokens']}-token contexts, "
        f"blocks of {s['block_tokens']} tokens, {s['torch_threads']} torch threads:",
        output.format_table(["batch", "paged tok/s", "x first", "transformers tok/s", "x first", "paged/transformers",
                             "identical"], rows)])


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
