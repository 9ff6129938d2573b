"""`kvtb bench ttft`: follow-up time to first token after a long context: resident, restored, recomputed.

One compute node serves all three policies (TurnRequest.policy). For each context size the
first turn is run once under `resident` and once under `triggered` (its KV then lives only in
storage); then one follow-up per policy continues it with a short new message, the policies in
turn (the order rotates, so that no policy always runs right after the background work of
another), so the three are measured side by side; each repetition builds the context anew.
A `triggered` follow-up is prefetched by the agent from storage (steps 5-7); a `recompute`
follow-up prefills the whole transcript again. TTFT is timed by the client from the call to the
first token.

Resident and restored do the same work: each context (the first message, chat template included)
is a whole number of blocks (`whole_blocks_prompt`: the size rounded to blocks of the compute
node's block_tokens, filler text padded to it), so the first turn leaves only full blocks, which
the pool keeps (`resident`) and storage brings back (`triggered`); a partial tail block, which
the pool does not keep for reuse but a restore brings back, would have `resident` re-prefill
it. Both follow-ups' reused tokens are recorded (`tokens_reused`) and compared (`same_reuse`).
Every follow-up's `kv_source` is checked in every run: `restored` under triggered, `resident`
under resident, `recomputed` under recompute; a size with a mismatch (or one that raised) is
reported failed with its error (`failed`, and its row), and gives no ratio.

Each CPU placement of `--placements` (default `shared nic` on 2 CPUs or more: bench.placements)
gets a stack of its own in the same run, started in it, and the whole measurement; the result
keeps the first placement's figures under the usual keys, every placement's in
`results.by_placement` and as `<ratio>@<placement>`, and compares the key figures (restore /
resident, the restored follow-up's TTFT) as `<figure>@nic_vs_shared`.

In the same stack, `--prefill-sizes` new prompts are prefilled side by side (bench.prefill): tokens/s
by prompt length, each against the smallest, and against what exact attention allows.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench import prefill, scaled
from bench.placements import add_placements_arg, chosen, run_placements, tables
from bench.results import (
    add_common_args,
    fail,
    failed_text,
    failure_of,
    floors,
    format_table,
    new_result,
    plot_lines,
    plots,
    progress_for,
    ratios_text,
    run_bench,
    services_dir,
)
from bench.stack import Stack, bench_config
from bench.stats import crossover, mean, ratio, summarize
from bench.turns import FILLER, context_prompt, encode, follow_up_ids, generate
from compute_node.settings import ComputeSettings
from hostmem.kv_dtype import KV_DTYPES

logger = logging.getLogger(__name__)

SIZES = (32, 64, 128, 256, 512, 1024, 2048, 3584)
SMOKE_SIZES = (64, 160)
POLICIES = ("resident", "triggered", "recompute")
BUILT = ("resident", "triggered")   # policies whose first turn leaves KV behind
# Our floor, not the paper's: the paper gives no TTFT figure (its 19-23x is the speedup of a KV transfer,
# triggered against CPU-centric, Sec. V-B, Figs 6-7); on restoring against recomputing it says only that a
# restore leaves "only the new prompt" to process (Sec. I). 19x is the bar this testbed set itself.
FLOORS = {"recompute_vs_restore_2048": 19.0}
CEILINGS = {"restore_vs_resident_2048": 1.1}        # a layer-wise restore hides its transfer under the forward
# One user per policy: blocks are named by (tenant, user) and content, so two policies of one user
# would share the pool's cached blocks (and `triggered` releasing its blocks would drop `resident`'s).
USERS = {policy: f"u{i}" for i, policy in enumerate(POLICIES)}
# where each policy's follow-up KV must come from (recompute: nothing reused; its context is new to
# the node, which then says "none", or known, "recomputed")
EXPECTED_SOURCE = {"resident": ("resident",), "triggered": ("restored",), "recompute": ("none", "recomputed")}
BLOCK_TOKENS = ComputeSettings().block_tokens  # the compute node's (the stack's config keeps the default)


class KvSourceMismatch(RuntimeError):
    """A follow-up's KV did not come from where its policy says it must."""


def whole_blocks(tokens: int, block_tokens: int) -> int:
    """tokens rounded to the nearest whole number of blocks (at least one)."""
    return max(1, round(tokens / block_tokens)) * block_tokens


def whole_blocks_prompt(encode_text, tokens: int, block_tokens: int) -> list[int]:
    """A first message of exactly whole_blocks(tokens) tokens, template included: the most filler
    words that fit (by bisection), then one-token words to fill up. encode_text(text) -> ids.
    ValueError when it cannot be hit (the template alone is longer, or padding will not land)."""
    target = whole_blocks(tokens, block_tokens)
    words = FILLER.split()

    def text(n: int, pad: int = 0) -> str:
        return " ".join([*(words[i % len(words)] for i in range(n)), *["ok"] * pad])

    lo, hi = 0, 2 * target
    while lo < hi:  # the most filler words whose message is at most target tokens
        mid = (lo + hi + 1) // 2
        if len(encode_text(text(mid))) <= target:
            lo = mid
        else:
            hi = mid - 1
    ids, pad = encode_text(text(lo)), 0
    for _ in range(8):
        if len(ids) == target:
            return ids
        pad = max(0, pad + target - len(ids))
        ids = encode_text(text(lo, pad))
    raise ValueError(f"no first message of exactly {target} tokens (got {len(ids)}): blocks of "
                     f"{block_tokens} tokens cannot be filled whole")


def source_mismatches(kv_sources: dict[str, list[str]]) -> list[str]:
    """Follow-ups whose kv_source is not their policy's (EXPECTED_SOURCE): 'policy run i: got x'."""
    return [f"{policy} follow-up {i + 1}: kv_source {got!r}, "
            f"expected {' or '.join(map(repr, EXPECTED_SOURCE[policy]))}"
            for policy, sources in kv_sources.items() for i, got in enumerate(sources)
            if got not in EXPECTED_SOURCE[policy]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench ttft", description=__doc__.splitlines()[0])
    add_common_args(parser, "ttft")
    parser.add_argument("--sizes", type=int, nargs="+", help=f"context lengths in tokens (default {SIZES})")
    parser.add_argument("--reps", type=int, default=3, help="follow-ups per context and policy (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=2, help="tokens per follow-up reply")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="the compute node's torch threads (default 0: one per CPU of its placement's)")
    parser.add_argument("--prefill-sizes", type=int, nargs="*",
                        help=f"new prompts' lengths whose prefill tokens/s is measured (default {prefill.SIZES}; "
                             f"none: not measured)")
    parser.add_argument("--prefill-reps", type=int, default=2, help="rounds of every prefill size (default 2)")
    parser.add_argument("--kv-dtype", default="float32", choices=list(KV_DTYPES),
                        help="the compute node's KV pool dtype (compute.kv_dtype; default float32): what is "
                             "stored, moved and restored")
    add_placements_arg(parser)
    scaled.add_profile_args(parser)
    args = parser.parse_args(argv)
    args.profile_obj = scaled.check(parser, args)
    if args.prefill_sizes is None:
        args.prefill_sizes = list(prefill.SMOKE_SIZES if args.smoke else prefill.SIZES)
    args.placements = chosen(args.placements)
    args.sizes = args.sizes or list(SMOKE_SIZES if args.smoke else SIZES)
    if args.smoke:
        args.reps = min(args.reps, 2)
    if min(args.reps, args.prefill_reps, *args.sizes, *args.prefill_sizes) < 1:
        parser.error("sizes and repetitions must be positive")
    return args


def run_size(stub, size: int, reps: int, max_new: int, progress, block_tokens: int = BLOCK_TOKENS) -> dict:
    """Every policy's follow-ups after a context of `size` tokens rounded to whole blocks.

    Each repetition builds the context anew under `resident` and under `triggered` (untimed),
    then times one follow-up per policy that continues it exactly (the context, its reply, a
    new short message), as a returning user's turn does: so every follow-up sees a context of
    the same length, and whatever a policy kept of the first turn is all reusable. The row's
    `mismatches` lists follow-ups whose kv_source is not their policy's.
    """
    prompt = whole_blocks_prompt(lambda text: encode(stub, text, False), size, block_tokens)
    turns: dict[str, list] = {p: [] for p in POLICIES}
    for rep in range(reps):
        firsts = {p: generate(stub, USERS[p], f"{p}-{size}-{rep}", prompt, 1, p) for p in BUILT}
        progress.update(len(BUILT), note=f"{size} tokens built")
        message = f"Question {rep + 1}: in one word, where does the conversation live?"
        asked = {p: follow_up_ids(stub, prompt, firsts[p], message) for p in BUILT}
        asked["recompute"] = asked["triggered"]  # keeps nothing: a context of its own, the same tokens
        for policy in POLICIES[rep % 3:] + POLICIES[:rep % 3]:  # each policy goes first once
            context = f"{policy}-{size}-{rep}"
            turns[policy].append(generate(stub, USERS[policy], context, asked[policy], max_new, policy))
            progress.update(note=f"{size} tokens {policy}")
    policies = {p: summarize_turns(turns[p]) for p in POLICIES}
    reused = {p: policies[p]["tokens_reused"] for p in BUILT}
    return {"context_tokens": len(prompt), "whole_blocks": len(prompt) % block_tokens == 0,
            "block_tokens": block_tokens, "follow_up_tokens": len(asked["triggered"]), "policies": policies,
            "same_reuse": reused["resident"] == reused["triggered"],
            "mismatches": source_mismatches({p: policies[p]["kv_source"] for p in POLICIES})}


def run_sizes(result: dict, stub, sizes: list[int], reps: int, max_new: int, progress) -> dict:
    """run_size() of each size; a size that raises or whose kv_source does not match its policy is
    recorded in result["failed"] (part "<size> tokens") and has `failed` in its row."""
    rows = {}
    for n in sizes:
        try:
            row = run_size(stub, n, reps, max_new, progress)
        except Exception as exc:  # noqa: BLE001 - a failed size is reported with its error
            rows[str(n)] = {"failed": fail(result, f"{n} tokens", exc)["error"]}
            continue
        if row["mismatches"]:
            mismatch = KvSourceMismatch("; ".join(row["mismatches"]))
            row["failed"] = fail(result, f"{n} tokens", mismatch)["error"]
        rows[str(n)] = row
    return rows


def warm_up(stub) -> None:
    """One short context and a follow-up under each policy, untimed (first calls are slow)."""
    prompt = context_prompt(stub, 64)
    for policy in POLICIES:
        first = generate(stub, USERS[policy], f"warm-up-{policy}", prompt, 1, policy)
        generate(stub, USERS[policy], f"warm-up-{policy}", follow_up_ids(stub, prompt, first, "Hi?"), 2, policy)


def summarize_turns(turns: list) -> dict:
    """Client TTFT (s) and what the compute node did, per follow-up and summarized."""
    ttft = [t.ttft_s for t in turns]
    return {"ttft_s": summarize(ttft), "ttft_samples_s": ttft,
            "engine_ttft_ms": [t.record.ttft_ms for t in turns],
            "kv_source": [t.record.kv_source for t in turns],
            "fallback_reason": [t.record.fallback_reason for t in turns if t.record.fallback_reason],
            "tokens_prefilled": [t.record.tokens_prefilled for t in turns],
            "tokens_reused": [t.record.tokens_reused for t in turns],
            "bytes_restored": [t.record.bytes_restored for t in turns]}


def add_ratios(result: dict, model_config=None) -> None:
    """recompute_vs_restore_<n>, restore_vs_resident_<n>, the crossover, the prefill ratios (bench.prefill,
    against model_config's FLOPs: default the served model's) and the floors."""
    sizes, rec, res = [], [], []
    for size, row in result["results"]["sizes"].items():
        if "failed" in row:  # in result["failed"]: no ratio from a size whose runs are not what they claim
            continue
        med = {p: row["policies"][p]["ttft_s"]["p50"] for p in POLICIES}
        result["ratios"][f"recompute_vs_restore_{size}"] = ratio(med["recompute"], med["triggered"])
        result["ratios"][f"restore_vs_resident_{size}"] = ratio(med["triggered"], med["resident"])
        sizes.append(row["context_tokens"])  # what the context really holds, template included
        rec.append(med["recompute"])
        res.append(med["triggered"])
    result["results"]["crossover"] = (crossover(sizes, rec, res) if sizes
                                      else {"tokens": None, "where": "not_measured"})
    prefill_floor = {}
    if result["results"].get("prefill"):
        prefill_floor = prefill.add_ratios(result, model_config or prefill.model_config())
    result["floors"] = floors(result["ratios"], {**FLOORS, **prefill_floor}, CEILINGS)


def table(result: dict) -> str:
    rows = []
    for size, row in result["results"]["sizes"].items():
        if "policies" not in row or f"recompute_vs_restore_{size}" not in result["ratios"]:
            error = failure_of(result, f"{size} tokens") or row.get("failed") or "not measured"
            rows.append([size, row.get("context_tokens", "-"), f"failed: {error[:200]}", *[""] * 6])
            continue
        med = {p: row["policies"][p]["ttft_s"]["p50"] * 1e3 for p in POLICIES}
        reused = "/".join(str(round(mean(row["policies"][p]["tokens_reused"]))) for p in BUILT)
        rows.append([size, row["context_tokens"], f"{med['resident']:.1f}", f"{med['triggered']:.1f}",
                     f"{med['recompute']:.1f}", f"{result['ratios'][f'recompute_vs_restore_{size}']:.2f}",
                     f"{result['ratios'][f'restore_vs_resident_{size}']:.2f}", reused, "ok"])
    head = ["size", "tokens", "resident ms", "restored ms", "recompute ms", "recompute/restore",
            "restore/resident", "reused res/restored", "kv source"]
    cross = result["results"]["crossover"]
    where = (f"{cross['tokens']:.0f} tokens" if cross["tokens"] else
             {"below_smallest": f"below the smallest size measured ({cross.get('smallest')})",
              "above_largest": f"above the largest size measured ({cross.get('largest')})",
              "not_measured": "not measured (every size failed)"}[cross["where"]])
    failed = failed_text(result)
    return (f"follow-up TTFT, median of {result['settings']['reps']} (client side); contexts of whole "
            f"blocks; every follow-up's kv_source checked\n"
            f"{format_table(head, rows)}\n\ncrossover (recomputing as fast as restoring): {where}\n\n"
            + (f"{prefill.table(result)}\n\n" if result["results"].get("prefill") else "")
            + f"{ratios_text(result['ratios'])}" + (f"\n\n{failed}" if failed else ""))


def plot(result: dict, out) -> Path | None:
    """Each policy's median TTFT against the context, for every placement measured."""
    by = result["results"].get("by_placement") or {"": {"results": result["results"]}}
    series = {}
    for name, entry in by.items():
        measured = [row for row in (entry["results"].get("sizes") or {}).values() if "policies" in row]
        for policy in POLICIES:
            label = "restored (triggered)" if policy == "triggered" else policy
            xs = [row["context_tokens"] for row in measured]
            ys = [row["policies"][policy]["ttft_s"]["p50"] * 1e3 for row in measured]
            if xs:
                series[f"{label} ({name})" if len(by) > 1 else label] = (xs, ys)
    if not series:
        return None
    return plot_lines(out / "ttft.png", series, title="Follow-up TTFT after a context",
                      xlabel="context tokens", ylabel="TTFT (ms, median)", logx=True, logy=True)


def key_figures(sub: dict) -> dict[str, float]:
    """One placement's key figures, compared across placements: restore / resident and the restored
    follow-up's median TTFT (ms) at each size measured."""
    out = {}
    for size, row in (sub["results"].get("sizes") or {}).items():
        if f"restore_vs_resident_{size}" in sub["ratios"]:
            out[f"restore_vs_resident_{size}"] = sub["ratios"][f"restore_vs_resident_{size}"]
            out[f"restored_ttft_ms_{size}"] = row["policies"]["triggered"]["ttft_s"]["p50"] * 1e3
    return out


def measure(args: argparse.Namespace, config: dict, placement: str, sub: dict, progress,
            pacing: list[dict] | None = None) -> None:
    """Every size in one stack started in `placement`, into sub (results, ratios, failed); under a
    profile, the stack's pacers' snapshots into `pacing`."""
    with Stack(services_dir(args, f"ttft-{placement}"), config, keep_data=args.keep_data,
               placement=placement) as stack:
        sub["settings"]["stack"] = stack.config
        with stack.agent_channel() as channel:
            stub = stack.compute_stub(channel)
            warm_up(stub)
            sub["results"]["sizes"] = run_sizes(sub, stub, args.sizes, args.reps, args.max_new_tokens,
                                                progress)
            if args.prefill_sizes:
                sub["results"]["prefill"] = prefill.run_prefill(
                    sub, stub, args.prefill_sizes, args.prefill_reps, progress,
                    lambda n: whole_blocks_prompt(lambda text: encode(stub, text, False), n, BLOCK_TOKENS),
                    generate, USERS["recompute"])
        stats = stack.agent_stats()
        sub["results"]["agent_stats"] = {"hits": stats.hits, "misses": stats.misses}
        if pacing is not None:
            pacing += scaled.stack_pacing(stack)
    add_ratios(sub)


def report(result: dict) -> str:
    """Each placement's table, then the key figures side by side (under a profile: said first)."""
    line = scaled.scale_line(result.get("scale"))
    dtype = (result.get("settings") or {}).get("kv_dtype") or "float32"
    return (line + "\n\n" if line else "") + f"KV pool dtype: {dtype}\n\n" + tables(result, table)


def run(args: argparse.Namespace) -> dict:
    settings = {"sizes": args.sizes, "reps": args.reps, "max_new_tokens": args.max_new_tokens,
                "torch_threads": args.torch_threads, "block_tokens": BLOCK_TOKENS,
                "contexts": "whole blocks (size rounded to block_tokens)",
                "kv_source_checked": EXPECTED_SOURCE, "policies": list(POLICIES), "smoke": args.smoke,
                "placements": args.placements, "prefill_sizes": args.prefill_sizes,
                "prefill_reps": args.prefill_reps, "kv_dtype": args.kv_dtype}
    result = new_result("ttft", settings)
    longest = max(4096, *args.sizes, *args.prefill_sizes) + 256
    config = bench_config(pool_tokens=32768, max_context_tokens=longest, users=3,
                          compute={"torch_threads": args.torch_threads, "kv_dtype": args.kv_dtype})
    total = len(args.placements) * (len(args.sizes) * args.reps * (len(BUILT) + len(POLICIES))
                                    + len(args.prefill_sizes) * args.prefill_reps)
    dilation, how, warmup, pacing = 1.0, "", None, None
    if args.profile_obj is not None:  # before any stack starts: its services inherit the profile and D
        threads = 1 if "nic" in args.placements else args.torch_threads  # nic: the compute node has one core
        dilation, how, warmup = scaled.choose_dilation(args.profile_obj, args.dilation_value, args.smoke, threads)
        scaled.apply(args.profile_obj.name, dilation)
        result["settings"] |= {"profile": args.profile_obj.name, "dilation": dilation}
        pacing = []
    try:  # the follow-ups are timed by this process: on a virtual clock under a profile
        with progress_for(args, total, "ttft") as progress, scaled.virtual_clock(dilation):
            run_placements(result, args.placements,
                           lambda p, sub: measure(args, config, p, sub, progress, pacing), key_figures)
    finally:
        if args.profile_obj is not None:
            scaled.clear()
    if args.profile_obj is not None:
        result["scale"] = scaled.record(args.profile_obj, dilation, pacing, how) | {"warmup": warmup}
    result["plots"] = plots(plot(result, args.out))
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, report)
