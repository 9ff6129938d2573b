"""`kvtb bench followup`: a follow-up's TTFT on the replica that served the first turn, on another
replica, and recomputed, side by side in one run of a two-replica stack.

Two replicas (agent and compute node pairs, `kvtb up --replicas 2`) share the storage nodes. Each
turn is sent straight to one replica's agent as the operator (its ComputeNode service: the turn
passes that agent's match-action table, steps 5-7, as the frontend's would), so which replica
serves it is pinned, whatever the frontend's routing. For each history length and round, a
conversation's first turn runs on replica A, then its follow-up (the history, the reply, a short new
message) is timed on each path, the order rotating per round:

- `same`: back on A, whose pool still holds the prefix (policy `resident`: the prefix cache);
- `same_storage`: back on A under the product's policy `triggered`, which releases the KV from the
  pool once stored (step 4), so A restores it from what its own agent stored;
- `other`: on B under `triggered`: B's agent has never seen the conversation and finds its blocks by
  asking the storage nodes (they were written by A's agent), then restores them;
- `recompute`: the same tokens as `other` on B under `recompute` (nothing stored, nothing reused:
  the whole history prefilled again, as for a user with no stored KV).

The paths are the frontend's TurnSummary.kv_origin pool, storage_same, storage_other and recompute
(`KV_ORIGIN`). Each path has its own user (blocks are named by owner and content), fresh in each
round and length. A and B swap every round, so that neither compute node (each on its own share of
the cores) always serves the same paths. Every follow-up's record is checked against its path
(`path_problem`): a follow-up whose KV did not come from where its path says is flagged, left out
of the figures and reported as failed, never counted. Histories are whole blocks
(bench.ttft.whole_blocks_prompt), so the pool and a restore hold the same prefix.

Ratios per history: other / same, other / same_storage (the price of asking the storage nodes),
recompute / other, of the median client TTFT.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.results import (
    add_common_args,
    data_dir,
    fail,
    failed_text,
    format_table,
    new_result,
    plot_lines,
    plots,
    progress_for,
    ratios_text,
    run_bench,
)
from bench.stack import Stack, bench_config
from bench.stats import ratio, summarize
from bench.ttft import BLOCK_TOKENS, whole_blocks_prompt
from bench.turns import encode, follow_up_ids, generate

logger = logging.getLogger(__name__)

HISTORIES = (256, 1024, 2048)
SMOKE_HISTORIES = (64, 160)
PATHS = ("same", "same_storage", "other", "recompute")
# the policy of a path's first turn and follow-up; where the follow-up runs (A: the first turn's replica)
POLICY = {"same": "resident", "same_storage": "triggered", "other": "triggered", "recompute": "recompute"}
ON_FIRST = {"same": True, "same_storage": True, "other": False, "recompute": False}
# each path's name in the frontend's TurnSummary.kv_origin, where the KV of a turn it routed came from
KV_ORIGIN = {"same": "pool", "same_storage": "storage_same", "other": "storage_other",
             "recompute": "recompute"}
BUILT = ("same", "same_storage", "other")   # paths whose first turn leaves KV behind
# ratio name -> (numerator path, denominator path), of median client TTFT
RATIOS = {"other_vs_same": ("other", "same"), "other_vs_same_storage": ("other", "same_storage"),
          "same_storage_vs_same": ("same_storage", "same"), "recompute_vs_other": ("recompute", "other")}
REPLICAS = 2


class WrongPath(RuntimeError):
    """A follow-up's KV did not come from where its path says."""


# -- the checks and figures (pure) ----------------------------------------------------------------------

def replica_name(i: int) -> str:
    """The replica name an agent puts in TurnRecord.replica (its `replica` setting)."""
    return f"replica-{i}"


def path_problem(path: str, record: Any, replica: str) -> str:
    """Why a follow-up's record (a TurnRecord, or anything with its fields) is not the path's, '' when
    it is: same: found in the pool, nothing restored; same_storage: restored, all of it from its own
    agent's stores; other: restored, some of it found on the storage nodes; recompute: nothing reused.
    A record naming another replica than `replica` ran elsewhere."""
    r = record
    ran = getattr(r, "replica", "")
    if ran and ran != replica:
        return f"ran on {ran}, not {replica}"
    if path == "same":
        ok = r.tokens_cached > 0 and r.blocks_restored == 0 and r.kv_source == "resident"
        want = "tokens_cached > 0, nothing restored (kv_source resident)"
    elif path == "same_storage":
        ok = r.blocks_restored > 0 and r.blocks_restored_other == 0 and r.kv_source == "restored"
        want = "blocks_restored > 0, none of them another replica's (kv_source restored)"
    elif path == "other":
        ok = r.blocks_restored_other > 0 and r.kv_source == "restored"
        want = "blocks_restored_other > 0 (kv_source restored)"
    elif path == "recompute":
        ok = r.tokens_reused == 0 and r.tokens_cached == 0 and r.blocks_restored == 0
        want = "nothing reused"
    else:
        raise ValueError(f"unknown path {path!r}: one of {PATHS}")
    if ok:
        return ""
    return (f"{path}: expected {want}; got kv_source {r.kv_source!r}, tokens_cached {r.tokens_cached}, "
            f"tokens_reused {r.tokens_reused}, blocks_restored {r.blocks_restored}, "
            f"blocks_restored_other {r.blocks_restored_other}"
            + (f", fallback {r.fallback_reason!r}" if getattr(r, "fallback_reason", "") else ""))


def sample(path: str, ttft_s: float, record: Any, replica: str, round_: int) -> dict:
    """One follow-up: its client TTFT, what the record says, and its problem ('' when on its path)."""
    return {"round": round_, "replica": replica, "record_replica": getattr(record, "replica", ""),
            "ttft_s": ttft_s, "engine_ttft_ms": record.ttft_ms,
            "kv_source": record.kv_source, "tokens_cached": record.tokens_cached,
            "tokens_reused": record.tokens_reused, "tokens_prefilled": record.tokens_prefilled,
            "prompt_tokens": record.tokens_reused + record.tokens_prefilled,
            "blocks_restored": record.blocks_restored, "blocks_restored_other": record.blocks_restored_other,
            "problem": path_problem(path, record, replica)}


def path_figures(samples: Sequence[dict]) -> dict:
    """A path's figures over its follow-ups on their path (the flagged ones counted apart, never in)."""
    good = [s for s in samples if not s["problem"]]
    return {"runs": len(samples), "flagged": len(samples) - len(good),
            "ttft_s": summarize([s["ttft_s"] for s in good]) if good else None,
            "engine_ttft_ms": summarize([s["engine_ttft_ms"] for s in good]) if good else None}


def history_ratios(figures: dict[str, dict]) -> dict[str, float]:
    """RATIOS of one history's median client TTFT, each where both of its paths have a figure."""
    out = {}
    for name, (top, bottom) in RATIOS.items():
        a, b = (figures.get(top) or {}).get("ttft_s"), (figures.get(bottom) or {}).get("ttft_s")
        if a and b:
            out[name] = ratio(a["p50"], b["p50"])
    return out


def add_ratios(result: dict) -> None:
    """<ratio>_<history tokens> for every history measured."""
    for n, row in result["results"].get("histories", {}).items():
        for name, value in history_ratios(row.get("paths") or {}).items():
            result["ratios"][f"{name}_{n}"] = value


def flag_problems(result: dict, history: int, samples: dict[str, list[dict]]) -> list[str]:
    """Every flagged follow-up of a history, recorded as failed (part '<n> tokens'); returns them."""
    problems = [f"round {s['round']}: {s['problem']}" for path in PATHS for s in samples.get(path, ())
                if s["problem"]]
    if problems:
        fail(result, f"{history} tokens", WrongPath("; ".join(problems)))
    return problems


# -- the run (I/O) ---------------------------------------------------------------------------------------

def rotated(round_: int) -> tuple[str, ...]:
    """The paths in the order of this round: each one goes first in turn."""
    k = round_ % len(PATHS)
    return PATHS[k:] + PATHS[:k]


def run_round(stubs: Sequence, prompt: list[int], history: int, round_: int, max_new: int) -> dict[str, dict]:
    """One round of one history: the first turns on A (untimed), then every path's follow-up, timed."""
    a, b = round_ % REPLICAS, (round_ + 1) % REPLICAS
    user = {p: f"{p}-{history}-{round_}" for p in PATHS}   # nothing one path stored is another's
    firsts = {p: generate(stubs[a], user[p], f"{user[p]}-ctx", prompt, 1, POLICY[p]) for p in BUILT}
    message = f"Question {round_ + 1}: in one word, where does the conversation live?"
    asked = {p: follow_up_ids(stubs[a], prompt, firsts[p], message) for p in BUILT}
    asked["recompute"] = asked["other"]   # the same tokens, nothing stored
    out = {}
    for path in rotated(round_):
        on = a if ON_FIRST[path] else b
        turn = generate(stubs[on], user[path], f"{user[path]}-ctx", asked[path], max_new, POLICY[path])
        out[path] = sample(path, turn.ttft_s, turn.record, replica_name(on), round_)
    return out


def run_history(result: dict, stubs: Sequence, history: int, rounds: int, max_new: int,
                done: Callable[[], None]) -> dict:
    """Every round of one history; its paths' samples and figures, and its flagged follow-ups."""
    prompt = whole_blocks_prompt(lambda text: encode(stubs[0], text, False), history, BLOCK_TOKENS)
    samples: dict[str, list[dict]] = {p: [] for p in PATHS}
    for r in range(rounds):
        for path, s in run_round(stubs, prompt, history, r, max_new).items():
            samples[path].append(s)
        done()
    problems = flag_problems(result, history, samples)
    return {"history_tokens": len(prompt), "paths": {p: path_figures(samples[p]) for p in PATHS},
            "samples": samples, "flagged": problems}


def warm_up(stubs: Sequence) -> None:
    """A short first turn and follow-up on every replica under every policy, untimed."""
    prompt = whole_blocks_prompt(lambda text: encode(stubs[0], text, False), 64, BLOCK_TOKENS)
    for i, stub in enumerate(stubs):
        for policy in sorted(set(POLICY.values())):
            user = f"warm-up-{policy}-{i}"
            first = generate(stub, user, user, prompt, 1, policy)
            generate(stub, user, user, follow_up_ids(stub, prompt, first, "Hi?"), 2, policy)


def measure(args: argparse.Namespace, config: dict, services: Path, result: dict, progress) -> None:
    """Every history in one two-replica stack."""
    if args.smoke:
        from bench.study.tiny_model import make_tiny_model
        config["compute"]["model_cache_dir"] = str(make_tiny_model(services / "tiny-model"))
    with Stack(services / "stack", config, keep_data=args.keep_data, replicas=REPLICAS) as stack:
        result["settings"]["stack"] = stack.config
        result["results"]["replica_cpus"] = stack.service_cpus()
        channels = [stack.replica_channel(i) for i in range(REPLICAS)]
        try:
            stubs = [stack.compute_stub(ch) for ch in channels]
            warm_up(stubs)
            rows = result["results"]["histories"] = {}
            for n in args.histories:
                try:
                    rows[str(n)] = run_history(result, stubs, n, args.rounds, args.max_new_tokens,
                                               lambda: progress.update(note=f"{n} tokens"))
                except Exception as exc:  # noqa: BLE001 - a failed history is reported with its error
                    rows[str(n)] = {"failed": fail(result, f"{n} tokens", exc)["error"]}
        finally:
            for ch in channels:
                ch.close()
    add_ratios(result)


# -- options, the table, the plot --------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench followup", description=__doc__.splitlines()[0])
    add_common_args(parser, "followup")
    parser.add_argument("--histories", type=int, nargs="+",
                        help=f"history lengths in tokens, rounded to whole blocks (default {HISTORIES}; "
                             f"--smoke {SMOKE_HISTORIES})")
    parser.add_argument("--rounds", type=int, help="follow-ups per history and path (default 4; --smoke 2)")
    parser.add_argument("--max-new-tokens", type=int, default=2,
                        help="tokens per follow-up reply (default 2)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="each compute node's torch threads (default 0: one per CPU of its share)")
    args = parser.parse_args(argv)
    args.histories = sorted(set(args.histories or (SMOKE_HISTORIES if args.smoke else HISTORIES)))
    if args.rounds is None:
        args.rounds = 2 if args.smoke else 4
    if min(args.rounds, args.max_new_tokens, *args.histories) < 1:
        parser.error("--histories, --rounds and --max-new-tokens must be positive")
    return args


def _ms(figures: dict | None) -> str:
    return "-" if not figures or not figures.get("ttft_s") else f"{figures['ttft_s']['p50'] * 1e3:.1f}"


def table(result: dict) -> str:
    """One row per history: each path's median TTFT, the ratios, the flagged follow-ups."""
    head = ["history", "tokens", "same ms", "same_storage ms", "other ms", "recompute ms", "other/same",
            "other/same_storage", "recompute/other", "flagged"]
    rows = []
    for n, row in result["results"].get("histories", {}).items():
        if "paths" not in row:
            rows.append([n, "-", f"failed: {row.get('failed', 'not measured')[:200]}", *[""] * 7])
            continue
        r = {name: result["ratios"].get(f"{name}_{n}") for name in RATIOS}
        rows.append([n, row["history_tokens"], *(_ms(row["paths"][p]) for p in PATHS),
                     *("-" if r[k] is None else f"{r[k]:.2f}" for k in
                       ("other_vs_same", "other_vs_same_storage", "recompute_vs_other")),
                     sum(row["paths"][p]["flagged"] for p in PATHS)])
    s = result["settings"]
    failed = failed_text(result)
    return (f"follow-up TTFT on two replicas, median of {s['rounds']} rounds (client side); same: back on "
            f"the first turn's replica, its pool holding the prefix; same_storage: back there, restored from "
            f"its own stores (policy triggered); other: the other replica, restored from what the first "
            f"stored; recompute: nothing stored. Every follow-up's record checked against its path; "
            f"flagged ones are not counted.\n{format_table(head, rows)}\n\n{ratios_text(result['ratios'])}"
            + (f"\n\n{failed}" if failed else ""))


def plot(result: dict, out: Path) -> Path | None:
    rows = [row for row in result["results"].get("histories", {}).values() if "paths" in row]
    series = {}
    for path in PATHS:
        pts = [(row["history_tokens"], row["paths"][path]["ttft_s"]["p50"] * 1e3) for row in rows
               if row["paths"][path]["ttft_s"]]
        if pts:
            series[path] = ([x for x, _ in pts], [y for _, y in pts])
    if not series:
        return None
    return plot_lines(out / "followup.png", series, title="Follow-up TTFT by replica path",
                      xlabel="history tokens", ylabel="TTFT (ms, median)", logx=True, logy=True)


def run(args: argparse.Namespace) -> dict:
    settings = {"histories": args.histories, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                "torch_threads": args.torch_threads, "block_tokens": BLOCK_TOKENS, "replicas": REPLICAS,
                "paths": {p: {"policy": POLICY[p], "replica": "first turn's" if ON_FIRST[p] else "the other",
                              "kv_origin": KV_ORIGIN[p]} for p in PATHS},
                "model": "tiny random Llama (smoke)" if args.smoke else "SmolLM2-135M", "smoke": args.smoke}
    result = new_result("followup", settings)
    config = bench_config(pool_tokens=32768, max_context_tokens=max(4096, *args.histories) + 256, users=1,
                          compute={"torch_threads": args.torch_threads})
    try:
        with progress_for(args, len(args.histories) * args.rounds, "followup") as progress, \
                data_dir(args, "followup") as services:
            measure(args, config, services, result, progress)
    except Exception as exc:  # noqa: BLE001 - the services failed: reported with what was measured
        fail(result, "services", exc)
    result["plots"] = plots(plot(result, Path(args.out)))
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
