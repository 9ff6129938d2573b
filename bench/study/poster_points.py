"""The poster study's points: each (workload, block size, share, strategy) run `repeats` times on a compute
node restarted with its pool, each repeat paired with a repeat of the same batch on a pool that never runs
out (the ample baseline, same turn policy). `repeat_row` and `point_row` are pure; `Points` runs them.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

from bench.progress import Progress
from bench.study import overhead as ov
from bench.study.poster_runner import Runner, Workload
from bench.study.report import run_part

# strategy -> (the compute node's preemption, the turns' policy)
STRATEGIES = {"recompute": ("recompute", "resident"), "swap-host": ("swap-host", "resident"),
              "swap-storage": ("swap", "triggered")}
# the per-repeat quantities a point reports as their mean across repeats
MEANS = ("makespan_s", "ample_makespan_s", "extra_e2e_s", "extra_e2e_frac", "cpu_s", "ample_cpu_s", "extra_cpu_s",
         "extra_cpu_frac", "engine_total_s", "engine_recompute_s", "engine_swap_s", "engine_blocking_s",
         "evicted_tokens", "recomputed_tokens", "reused_tokens", "preemption_count", "tokens_per_s")


def repeat_row(batch: Mapping, ample: Mapping) -> dict:
    """One repeat of a point: the batch at a tight pool beside its paired batch on an ample pool."""
    c = batch["counters"]
    return {**batch, "ample_makespan_s": ample["makespan_s"], "ample_cpu_s": ample["cpu_s"],
            "ample_preemptions": ample["preemptions"], "ample_throughput": ample.get("throughput", []),
            "evicted_tokens": sum(batch["preempted_tokens"].values()),
            "preemption_count": sum(batch["preemptions"].values()),
            # counted apart: tokens computed again, and tokens found in the prefix cache (0 with it off)
            "recomputed_tokens": int(c.get("preempt_recompute_tokens", 0)),
            "reused_tokens": int(c.get("prefix_cache_hits", 0)),
            **ov.extra_e2e(batch["makespan_s"], ample["makespan_s"]),
            **ov.extra_cpu(batch["cpu_s"], ample["cpu_s"])}


def point_row(reps: Sequence[Mapping], meta: Mapping) -> dict:
    """A point: its settings, the mean of each quantity across its repeats, the mean counters, the repeats."""
    if not reps:
        raise ValueError("a point needs at least one repeat")
    n = len(reps)
    counters = {k: sum(float(r["counters"].get(k, 0)) for r in reps) / n for k in ov.ENGINE_FIELDS}
    return {**meta, **{k: sum(float(r[k]) for r in reps) / n for k in MEANS}, "counters": counters,
            "n_repeats": n, "repeats": [dict(r) for r in reps]}


def _max_context(w: Workload) -> int:
    return max(256, w.input_tokens + w.output_tokens + 64)


class Points:
    """Each point run once (its repeats together) and remembered; failures recorded, never dropped.

    planned: (workload, block size, share, strategies) of every point the sweeps will ask for, so that one
    compute node start per block size runs every baseline the study needs at it. kept: points and baselines
    an earlier sitting finished (bench.study.poster_journal), not run again; on_done(key, value) is told of
    each one this sitting finishes (a failure is not)."""

    def __init__(self, study: dict, runner: Runner, progress: Progress, repeats: int,
                 planned: Sequence[tuple[Workload, int, float, tuple[str, ...]]],
                 kept: Mapping[tuple, dict] | None = None,
                 on_done: Callable[[tuple, dict], None] | None = None):
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.study, self.runner, self.progress, self.repeats = study, runner, progress, repeats
        self.done: dict[tuple, dict | None] = dict(kept or {})
        self.on_done = on_done
        self.policies: dict[tuple[Workload, int], set[str]] = {}  # (workload, block size) -> baseline policies
        for w, bt, _, strategies in planned:
            self.policies.setdefault((w, bt), set()).update(STRATEGIES[s][1] for s in strategies)

    def baseline(self, w: Workload, block_tokens: int) -> dict | None:
        """The policies' batches on a pool that never runs out, `repeats` each. One start per block size runs
        every workload of the study at that block size (a pool larger than one needs changes nothing)."""
        key = ("ample", w, block_tokens)
        if key not in self.done:
            same = [x for (x, bt) in self.policies if bt == block_tokens and ("ample", x, bt) not in self.done]
            same = same if w in same else [w, *same]
            pool = max(ov.need_tokens(x.requests, x.input_tokens, x.output_tokens, block_tokens) for x in same)
            pool += 4 * block_tokens
            seqs, context = max(x.requests for x in same), max(_max_context(x) for x in same)
            for x in same:
                def run(x=x):
                    self.runner.configure(pool, block_tokens, "recompute", seqs, context)
                    out = {"pool_tokens": pool}
                    for policy in sorted(self.policies.get((x, block_tokens), {"resident"})):
                        out[policy] = []
                        for i in range(self.repeats):
                            out[policy].append(self.runner.batch(x, policy, f"ample-{policy}-{uuid.uuid4().hex[:6]}",
                                                                 repeat=i))
                            self.progress.update(note=f"ample {x.name} bt{block_tokens} {policy} #{i + 1}")
                    return out
                self._finish(("ample", x, block_tokens), run_part(self.study, f"ample {x.name} bt{block_tokens}", run))
        return self.done[key]

    def point(self, w: Workload, block_tokens: int, share: float, strategy: str) -> dict | None:
        key = (w, block_tokens, share, strategy)
        if key not in self.done:
            self._finish(key, run_part(self.study, f"{strategy} {w.name} bt{block_tokens} share {share}",
                                       lambda: self._run(w, block_tokens, share, strategy)))
        return self.done[key]

    def _finish(self, key: tuple, value: dict | None) -> None:
        self.done[key] = value
        if value is not None and self.on_done is not None:
            self.on_done(key, value)

    def _run(self, w: Workload, block_tokens: int, share: float, strategy: str) -> dict:
        base = self.baseline(w, block_tokens)
        preemption, policy = STRATEGIES[strategy]
        if base is None or policy not in base:
            raise RuntimeError(f"its ample baseline ({policy}) failed or did not run")
        pool = ov.pool_for_share(share, w.requests, w.input_tokens, w.output_tokens, block_tokens)
        self.runner.configure(pool, block_tokens, preemption, w.requests, _max_context(w))
        reps = []
        for i in range(self.repeats):
            batch = self.runner.batch(w, policy, f"{strategy}-{uuid.uuid4().hex[:6]}", repeat=i)
            reps.append(repeat_row(batch, base[policy][i]))
            self.progress.update(note=f"{strategy} {w.name} bt{block_tokens} {share:.0%} #{i + 1}")
        need = ov.need_tokens(w.requests, w.input_tokens, w.output_tokens, block_tokens)
        return point_row(reps, {"strategy": strategy, "policy": policy, "preemption": preemption,
                                "workload": w.name, "block_tokens": block_tokens, "share": share,
                                "pool_tokens": pool, "actual_share": pool / need})


def trim_baseline(base: dict | None) -> dict | None:
    """A baseline as the results JSON keeps it (no per-token series)."""
    if base is None:
        return None
    keep = ("makespan_s", "cpu_s", "mean_e2e_s", "tokens_per_s", "preemptions")
    return {"pool_tokens": base["pool_tokens"],
            **{p: [{k: b[k] for k in keep} for b in v] for p, v in base.items() if p != "pool_tokens"}}
