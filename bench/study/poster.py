"""`kvtb study poster`: the recompute-vs-swap poster's Figs 2-6 on the batching engine with the real model.

Three strategies for a pool that runs out, each a compute node setting (`preemption`):
`recompute` (the victim's blocks are freed, it prefills again), `swap-host` (its blocks are copied
into the compute node's host swap tier and back: vLLM's CPU swap space, the poster's "swap") and
`swap-storage` (the paper's way: preemption `swap` under policy `triggered`: its blocks are stored
by triggered PUTs to the storage node and come back by GETs). `recompute` and `swap-host` run
turns under policy `resident` (nothing offloaded, as in vLLM); `swap-storage` under `triggered`.

A point is a batch of N requests issued at once (threads, straight to the compute node through the
agent, greedy, ignore_eos) on a compute node restarted with the point's pool, block size and
preemption (the storage node, the agent and the frontend of the one Stack stay up). Overhead is
measured two ways (bench.study.overhead): the batch's makespan against the same batch on a pool
that never runs out under the same policy, and the engine's own counters of preemption work.
While a batch runs, the node's Stats are polled every 0.25 s (KV usage) and every streamed token
is timed (throughput): Fig 6.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import scaled
from bench.progress import Progress
from bench.results import plot_lines, services_dir
from bench.study import overhead as ov
from bench.study.report import add_study_args, check_profile, claim, main_of, new_study, run_part, unmeasured

logger = logging.getLogger(__name__)

# strategy -> (the compute node's preemption, the turns' policy)
STRATEGIES = {"recompute": ("recompute", "resident"), "swap-host": ("swap-host", "resident"),
              "swap-storage": ("swap", "triggered")}
POLICIES = ("resident", "triggered")  # the baselines: one per policy the strategies use
POLL_S = 0.25
THROUGHPUT_BIN_S = 1.0  # Fig 6's throughput: tokens per POLL_S bin, averaged over this


@dataclasses.dataclass(frozen=True)
class Workload:
    requests: int
    input_tokens: int
    output_tokens: int

    @property
    def name(self) -> str:
        return f"{self.requests}x{self.input_tokens}+{self.output_tokens}"


@dataclasses.dataclass(frozen=True)
class Mode:
    """One mode's sizes. fig5: the poster's 32 requests of 1,500 + 1,024 tokens, scaled; fig4: batch 16."""

    fig5: Workload
    shares: tuple[float, ...]            # Figs 3, 5 (and 6 at the smallest)
    block_tokens: int                    # the default block size
    block_sizes: tuple[int, ...]         # Fig 2, at fig2_share
    fig2_share: float
    fig4_batch: int
    fig4_lengths: tuple[tuple[int, int], ...]  # (input, output) per point, at fig4_share
    fig4_share: float


MODES = {
    "full": Mode(Workload(32, 192, 128), (0.12, 0.2, 0.3, 0.4, 0.5, 0.7), 16, (8, 16, 32, 64, 128), 0.3,
                 16, ((48, 32), (96, 64), (192, 128), (384, 256)), 0.3),
    "quick": Mode(Workload(16, 48, 24), (0.2, 0.45), 16, (16, 64), 0.2,
                  16, ((24, 12), (48, 24)), 0.2),
    # smoke: one point (every strategy and the ample baselines): a compute node restart costs ~15 s here
    "smoke": Mode(Workload(4, 16, 16), (0.5,), 8, (8,), 0.5, 4, ((16, 16),), 0.5),
}


# -- one point -------------------------------------------------------------------------------------------

def prompts(base: list[int], workload: Workload) -> list[list[int]]:
    """N distinct prompts of exactly input_tokens tokens each (the base repeated, a few ids made distinct)."""
    reps = -(-workload.input_tokens // len(base))
    out = []
    for i in range(workload.requests):
        ids = (base * reps)[:workload.input_tokens]
        for k in range(1, min(4, len(ids))):
            ids[k] = 1000 + 97 * i + k
        out.append(ids)
    return out


class Runner:
    """The Stack's compute node, restarted per configuration; batches sent through the agent."""

    def __init__(self, stack, smoke_model: str | None, progress: Progress, dilation: float = 1.0):
        self.stack, self.smoke_model, self.progress = stack, smoke_model, progress
        self.dilation = dilation  # under a hardware profile: every time below is virtual (wall / D)
        self.pacing: list[dict] = []  # the compute node's pacer snapshots, one per run of it
        self.warm_pacing: dict | None = None  # its snapshot after the warm-up turn
        self.config: tuple | None = None
        self.restarts_s: list[float] = []
        self.base_prompt: list[int] | None = None
        self.channel = stack.agent_channel()
        self.stub = stack.compute_stub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def configure(self, pool_tokens: int, block_tokens: int, preemption: str, max_num_seqs: int,
                  max_context: int) -> None:
        """Restart the compute node with these settings (unless it runs them already), warmed up."""
        config = (pool_tokens, block_tokens, preemption, max_num_seqs, max_context)
        if config == self.config:
            return
        proc = next(p for p in self.stack.deployment.procs if p.name == "compute")
        self.keep_pacing()
        proc.stop()
        proc.env.update({"KVTB_COMPUTE_POOL_TOKENS": str(pool_tokens), "KVTB_COMPUTE_BLOCK_TOKENS": str(block_tokens),
                         "KVTB_COMPUTE_PREEMPTION": preemption, "KVTB_COMPUTE_MAX_NUM_SEQS": str(max_num_seqs),
                         "KVTB_COMPUTE_MAX_CONTEXT_TOKENS": str(max_context)})
        self.config = None
        started = time.monotonic()
        proc.start(timeout_s=600)
        self.config = config
        self._wait_ready()
        self.restarts_s.append(time.monotonic() - started)
        logger.info("compute node restarted with %s in %.1f s", config, self.restarts_s[-1])
        if self.base_prompt is None:
            from bench.turns import context_prompt
            self.base_prompt = context_prompt(self.stub, 96)
        warm = self.base_prompt[:min(len(self.base_prompt), block_tokens * 2)]
        self._turn("warm", f"warm-{uuid.uuid4().hex[:6]}", warm, 2, "resident", [])
        self.warm_pacing = self._compute_pacing() if self.dilation != 1.0 else None

    def keep_pacing(self) -> None:
        """Under a profile: the compute node's pacer snapshot since its warm-up turn (a fresh node's first
        steps pay its start-up, and are no batch's), kept before a restart forgets it."""
        if self.dilation == 1.0 or self.config is None:
            return
        from scale.dilation import since
        snap = self._compute_pacing()
        if snap:
            self.pacing.append(since(snap, self.warm_pacing))

    def _compute_pacing(self) -> dict | None:
        import json
        try:
            text = self.stack.compute_stats().pacing_json
            return json.loads(text) if text else None
        except Exception as exc:  # noqa: BLE001 - reported as a gap
            logger.warning("the compute node's pacing stats: %s", exc)
            return None

    def _wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the agent forwards turns to the restarted node (its registration is in)."""
        from kvtb_proto import compute_pb2
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.stub.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)
                return
            except Exception:  # noqa: BLE001 - not registered yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _turn(self, user: str, context: str, ids: list[int], n: int, policy: str, times: list[float]) -> float:
        from kvtb_proto import compute_pb2
        request = compute_pb2.TurnRequest(request_id=uuid.uuid4().hex, user_id=user, context_id=context,
                                          token_ids=ids, max_new_tokens=n, policy=policy, ignore_eos=True)
        got = 0
        record = None
        for event in self.stub.Generate(request, timeout=1800 * self.dilation):
            if event.WhichOneof("event") == "token":
                times.append(self.now())
                got += 1
            elif event.WhichOneof("event") == "record":
                record = event.record
        if record is None or got != n:
            raise RuntimeError(f"turn {context}: {got} of {n} tokens, record {record is not None}")
        return self.now()

    def now(self) -> float:
        """The batch's clock: wall time, or virtual time (wall / D) under a hardware profile."""
        return time.perf_counter() / self.dilation

    def stats(self) -> dict:
        from kvtb_proto import compute_pb2
        msg = self.stub.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)
        out = {name: getattr(msg, name) for name in ov.ENGINE_FIELDS}
        out.update(kv_cache_usage_perc=msg.kv_cache_usage_perc, num_requests_running=msg.num_requests_running,
                   num_requests_waiting=msg.num_requests_waiting, preemptions=dict(msg.preemptions),
                   preempted_tokens=dict(msg.preempted_tokens))
        return out

    def batch(self, workload: Workload, policy: str, tag: str) -> dict:
        """N requests issued at once; makespan, per-request e2e, token times, Stats samples, counters."""
        ids = prompts(self.base_prompt, workload)
        before = self.stats()
        cpu_before = self.stack.cpu_seconds()
        times: list[list[float]] = [[] for _ in ids]
        ends: list[float | None] = [None] * len(ids)
        errors: list[BaseException] = []
        samples: list[tuple[float, float, int, int]] = []
        stop = threading.Event()

        def poll(start: float) -> None:
            while not stop.wait(POLL_S):
                try:
                    s = self.stats()
                    samples.append((self.now() - start, float(s.get("kv_cache_usage_perc", 0.0)),
                                    int(s.get("num_requests_running", 0)), int(s.get("num_requests_waiting", 0))))
                except Exception:  # noqa: BLE001 - a missed sample is only a gap in Fig 6
                    pass

        def one(i: int) -> None:
            try:
                ends[i] = self._turn(f"p{i}", f"{tag}-{i}", ids[i], workload.output_tokens, policy, times[i])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        start = self.now()
        poller = threading.Thread(target=poll, args=(start,), daemon=True)
        poller.start()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        poller.join()
        if errors:
            raise RuntimeError(f"{len(errors)} of {len(ids)} requests failed: {errors[0]}")
        cpu_s = ov.cpu_delta(cpu_before, self.stack.cpu_seconds())
        after = self.stats()
        end = max(ends)
        token_times = sorted(t - start for ts in times for t in ts)
        delta = ov.counter_delta(before, after)
        if self.dilation != 1.0:  # the engine's seconds are wall seconds: virtual under a profile
            delta = {k: v / self.dilation if k.endswith("_s") else v for k, v in delta.items()}
        return {"makespan_s": end - start, "cpu_s": cpu_s, "e2e_s": [e - start for e in ends],
                "mean_e2e_s": sum(e - start for e in ends) / len(ends),
                "tokens": len(token_times), "tokens_per_s": len(token_times) / (end - start),
                "preemptions": _delta_map(before.get("preemptions"), after.get("preemptions")),
                "preempted_tokens": _delta_map(before.get("preempted_tokens"), after.get("preempted_tokens")),
                "counters": delta, **ov.engine_overhead(delta),
                "throughput": ov.throughput_series([start + t for t in token_times], start, end, POLL_S),
                "usage": [(t, u) for t, u, _, _ in samples], "running": [(t, r, w) for t, _, r, w in samples]}


def _delta_map(before: dict | None, after: dict | None) -> dict:
    before, after = before or {}, after or {}
    return {k: int(after[k]) - int(before.get(k, 0)) for k in after if int(after[k]) - int(before.get(k, 0))}


class Points:
    """Each point run once and remembered (sweeps share their common points); failures recorded."""

    def __init__(self, study: dict, runner: Runner, progress: Progress):
        self.study, self.runner, self.progress = study, runner, progress
        self.done: dict[tuple, dict | None] = {}
        self.workloads: dict[int, list[Workload]] = {}  # block size -> the workloads run at it

    def plan(self, m: Mode) -> None:
        for w, bt, _ in plan(m):
            if w not in self.workloads.setdefault(bt, []):
                self.workloads[bt].append(w)

    def baseline(self, w: Workload, block_tokens: int) -> dict | None:
        """Both policies' batches on a pool that never runs out. One start per block size runs every
        workload of the study at that block size (a pool larger than one needs changes nothing)."""
        key = ("ample", w, block_tokens)
        if key not in self.done:
            same = [x for x in self.workloads.get(block_tokens, [w]) if ("ample", x, block_tokens) not in self.done]
            same = same if w in same else [w, *same]
            pool = max(ov.need_tokens(x.requests, x.input_tokens, x.output_tokens, block_tokens) for x in same)
            pool += 4 * block_tokens
            seqs = max(x.requests for x in same)
            context = max(_max_context(x) for x in same)
            for x in same:
                def run(x=x):
                    self.runner.configure(pool, block_tokens, "recompute", seqs, context)
                    out = {"pool_tokens": pool}
                    for policy in POLICIES:
                        out[policy] = self.runner.batch(x, policy, f"ample-{policy}-{uuid.uuid4().hex[:6]}")
                        self.progress.update(note=f"ample {x.name} bt{block_tokens} {policy}")
                    return out
                self.done[("ample", x, block_tokens)] = run_part(self.study, f"ample {x.name} bt{block_tokens}", run)
        return self.done[key]

    def point(self, w: Workload, block_tokens: int, share: float, strategy: str) -> dict | None:
        key = (w, block_tokens, share, strategy)
        if key not in self.done:
            def run():
                base = self.baseline(w, block_tokens)
                if base is None:
                    raise RuntimeError("its ample baseline failed")
                preemption, policy = STRATEGIES[strategy]
                pool = ov.pool_for_share(share, w.requests, w.input_tokens, w.output_tokens, block_tokens)
                self.runner.configure(pool, block_tokens, preemption, w.requests, _max_context(w))
                row = self.runner.batch(w, policy, f"{strategy}-{uuid.uuid4().hex[:6]}")
                need = ov.need_tokens(w.requests, w.input_tokens, w.output_tokens, block_tokens)
                row.update({"strategy": strategy, "policy": policy, "preemption": preemption, "workload": w.name,
                            "block_tokens": block_tokens, "share": share, "pool_tokens": pool,
                            "actual_share": pool / need, "ample_makespan_s": base[policy]["makespan_s"],
                            "ample_preemptions": base[policy]["preemptions"],
                            "evicted_tokens": sum(row["preempted_tokens"].values()),
                            "ample_cpu_s": base[policy]["cpu_s"],
                            **ov.extra_e2e(row["makespan_s"], base[policy]["makespan_s"]),
                            **ov.extra_cpu(row["cpu_s"], base[policy]["cpu_s"])})
                self.progress.update(note=f"{strategy} {w.name} bt{block_tokens} {share:.0%}")
                return row
            self.done[key] = run_part(self.study, f"{strategy} {w.name} bt{block_tokens} share {share}", run)
        return self.done[key]


def _max_context(w: Workload) -> int:
    return max(256, w.input_tokens + w.output_tokens + 64)


def plan(m: Mode) -> list[tuple[Workload, int, float]]:
    """Every (workload, block size, share) the sweeps need, in order, once."""
    out = [(m.fig5, m.block_tokens, s) for s in m.shares]
    out += [(m.fig5, b, m.fig2_share) for b in m.block_sizes]
    out += [(Workload(m.fig4_batch, i, o), m.block_tokens, m.fig4_share) for i, o in m.fig4_lengths]
    return list(dict.fromkeys(out))


def count_runs(m: Mode) -> int:
    """Progress steps: one per batch (a baseline is two)."""
    points = plan(m)
    bases = {(w, b) for w, b, _ in points}
    return len(points) * len(STRATEGIES) + 2 * len(bases)


# -- the sweeps ------------------------------------------------------------------------------------------

def sweep(points: Points, m: Mode) -> dict:
    res: dict[str, Any] = {"fig5": {}, "fig2": {}, "fig4": {}}
    for share in m.shares:
        res["fig5"][str(share)] = {s: points.point(m.fig5, m.block_tokens, share, s) for s in STRATEGIES}
    for bt in m.block_sizes:
        res["fig2"][str(bt)] = {s: points.point(m.fig5, bt, m.fig2_share, s) for s in STRATEGIES}
    for i, o in m.fig4_lengths:
        w = Workload(m.fig4_batch, i, o)
        res["fig4"][str(i + o)] = {s: points.point(w, m.block_tokens, m.fig4_share, s) for s in STRATEGIES}
    res["ample"] = {f"{k[1].name} bt{k[2]}": _trim(v) for k, v in points.done.items() if k[0] == "ample"}
    return res


def _trim(base: dict | None) -> dict | None:
    if base is None:
        return None
    return {"pool_tokens": base["pool_tokens"],
            **{p: {k: base[p][k] for k in ("makespan_s", "cpu_s", "mean_e2e_s", "tokens_per_s", "preemptions")}
               for p in POLICIES}}


# -- claims (pure) -----------------------------------------------------------------------------------------

# What the claims are judged on: the engine's own time in preemption work. The extra e2e and the extra CPU
# time are reported beside it, but on 2 cores shared with other work both swung by minutes between batches
# minutes apart (torch's threads spin when descheduled, so CPU time inflates with the others' load too).
METRIC = "engine_total_s"


def _series(rows: dict, strategy: str, key: str = METRIC) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for x, by in rows.items():
        row = (by or {}).get(strategy)
        if row:
            xs.append(float(x))
            ys.append(row[key])
    return xs, ys


def _fmt(xs, ys, unit="s engine") -> str:
    return ", ".join(f"{x:g}: {y:+.2f} {unit}" for x, y in zip(xs, ys))


def _both(row: dict) -> str:
    return (f"{row[METRIC]:.2f} s engine (extra {row['extra_e2e_s']:+.1f} s e2e, "
            f"{row['extra_cpu_s']:+.1f} s CPU)")


def add_claims(study: dict) -> None:
    res = study["results"]
    f2, f4, f5 = res.get("fig2", {}), res.get("fig4", {}), res.get("fig5", {})
    why_cpu = ("judged on the engine's own preemption time (the extra e2e and CPU time swing by minutes with "
               "the other work on these 2 cores); here the 'GPU memory' is host memory too: a swap is a memcpy "
               "inside one process (no PCIe), while recompute runs a 135M model on the CPU")
    if study.get("settings", {}).get("profile"):  # under a profile the costs are the profile's, in virtual time
        why_cpu = ("judged on the engine's own preemption time, in virtual time: a swap-host copy costed as the "
                   f"profile's PCIe copy of the virtual model's KV, recompute as its GPU's prefill "
                   f"(profile `{study['settings']['profile']}`)")

    # Fig 2: block size
    xs, rec = _series(f2, "recompute")
    if len(xs) >= 2:
        mean = sum(rec) / len(rec)
        spread = (max(rec) - min(rec)) / mean if mean > 0 else 0.0
        claim(study, "Fig. 2", "Recompute: block size has minimal effect on its overhead",
              f"recompute by block size ({_fmt(xs, rec)}); spread {spread:.0%} of its mean",
              spread <= 0.25, "minimal taken as a spread within 25% of the mean; " + why_cpu)
    else:
        claim(study, "Fig. 2", "Recompute: block size has minimal effect on its overhead", unmeasured(study, "fig2"),
              None, "fewer than two block sizes measured")
    for strategy in ("swap-host", "swap-storage"):
        xs, ys = _series(f2, strategy)
        if len(xs) >= 2:
            t = ov.trend(xs, ys)
            claim(study, "Fig. 2", f"Swap: the overhead decreases with increasing block size ({strategy})",
                  f"{strategy} extra by block size: {_fmt(xs, ys)} (trend {t})", t == "down",
                  ("bigger blocks mean fewer copies (host) or fewer GETs (storage) per evicted token; "
                   if strategy == "swap-storage" else "a host swap copies whole blocks with one fancy-indexed memcpy "
                   "per victim, so the per-block cost is small; ") + "timings on a shared 2-core machine are noisy")
        else:
            claim(study, "Fig. 2", f"Swap: the overhead decreases with increasing block size ({strategy})",
                  unmeasured(study, "fig2"), None, "fewer than two block sizes measured")
    claim(study, "Fig. 2", "Swap: more efficient for large block sizes with pinned memory",
          "not applicable: no GPU and no pinned memory here; the host tier copies block extents with memcpy",
          None, "pinned (page-locked) memory speeds up GPU-host DMA over PCIe, which this testbed does not have")

    # Fig 3: evicted tokens (from Fig 5's runs)
    pts = {s: [] for s in STRATEGIES}
    for by in f5.values():
        for s, row in (by or {}).items():
            if row:
                pts[s].append((row["evicted_tokens"], row[METRIC]))
    measured = "; ".join(f"{s}: " + ", ".join(f"{int(x)} tok: {y:.2f} s engine" for x, y in sorted(v))
                         for s, v in pts.items())
    trends = {s: ov.trend([x for x, _ in v], [y for _, y in v]) for s, v in pts.items() if len(v) >= 2}
    if trends:
        claim(study, "Fig. 3", "The overhead increases with increasing the number of recomputed/swapped tokens",
              f"{measured} (trends {trends})", all(t == "up" for t in trends.values()),
              "Fig. 3 is drawn from Fig. 5's runs: each run's evicted tokens (the engine's preempted_tokens) "
              "against its overhead; " + why_cpu)
    else:
        claim(study, "Fig. 3", "The overhead increases with increasing the number of recomputed/swapped tokens",
              unmeasured(study, "fig5"), None, "fewer than two runs per strategy")
    most = {s: max(v) for s, v in pts.items() if v}
    if "recompute" in most and "swap-host" in most:
        r, h = most["recompute"], most["swap-host"]
        claim(study, "Fig. 3", "Swap has lower overhead when more tokens are evicted in an overflow",
              f"at the most evictions: swap-host {h[1]:.2f} s engine ({int(h[0])} tokens) vs recompute {r[1]:.2f} s "
              f"({int(r[0])} tokens)", h[1] < r[1], why_cpu)
    else:
        claim(study, "Fig. 3", "Swap has lower overhead when more tokens are evicted in an overflow",
              unmeasured(study, "fig5"), None, "no run of both strategies")

    # Fig 4: sequence length at batch 16
    trends4 = {}
    for s in STRATEGIES:
        xs, ys = _series(f4, s)
        if len(xs) >= 2:
            trends4[s] = (ov.trend(xs, ys), _fmt(xs, ys))
    if trends4:
        claim(study, "Fig. 4", "The overhead increases with increasing the sequence length",
              "; ".join(f"{s}: {v[1]} ({v[0]})" for s, v in trends4.items()),
              all(v[0] == "up" for v in trends4.values()), "sequence length = input + output tokens; " + why_cpu)
    else:
        claim(study, "Fig. 4", "The overhead increases with increasing the sequence length", unmeasured(study, "fig4"),
              None, "fewer than two lengths measured")
    longest = max(f4, key=float) if f4 else None
    by = f4.get(longest) or {}
    if by.get("recompute") and by.get("swap-host"):
        r, h = by["recompute"][METRIC], by["swap-host"][METRIC]
        claim(study, "Fig. 4", "Swap performs better than recompute for long sequences (lower overhead)",
              f"at {longest} tokens: swap-host {_both(by['swap-host'])} vs recompute {_both(by['recompute'])}"
              + (f", swap-storage {_both(by['swap-storage'])}" if by.get("swap-storage") else ""),
              h < r, why_cpu)
    else:
        claim(study, "Fig. 4", "Swap performs better than recompute for long sequences (lower overhead)",
              unmeasured(study, "fig4"), None, "the longest length did not run for both")

    # Fig 5: memory available
    lows = {}
    for s in STRATEGIES:
        xs, ys = _series(f5, s)
        if len(xs) >= 2:
            low = [(x, y) for x, y in zip(xs, ys) if x <= 0.4 + 1e-9]
            lows[s] = (ov.trend([x for x, _ in low], [y for _, y in low]) if len(low) >= 2 else "n/a", _fmt(xs, ys),
                       xs[ys.index(min(ys))])
    if lows:
        claim(study, "Fig. 5", "Overhead decreases with increasing the avail. memory (<= 40%)",
              "; ".join(f"{s}: {v[1]} (<= 40%: {v[0]})" for s, v in lows.items()),
              all(v[0] == "down" for v in lows.values()) if all(v[0] != "n/a" for v in lows.values()) else None,
              "available memory = the pool as a share of what every request needs at its longest at once; " + why_cpu)
        claim(study, "Fig. 5", "Recompute/Swap get the lowest overhead when avail. memory is 30% or 50%",
              "; ".join(f"{s}: lowest at {v[2]:.0%}" for s, v in lows.items()),
              all(abs(v[2] - 0.3) < 0.051 or abs(v[2] - 0.5) < 0.051 for v in lows.values()),
              f"shares measured: {', '.join(f'{x:.0%}' for x in sorted({x for s in STRATEGIES for x in _series(f5, s)[0]}))}"
              "; a minimum at 30-50% needs shares on both sides of it (full mode measures 12-70%); more memory "
              "means fewer preemptions, but the engine's time per recomputed or copied token also changes with "
              "the batch it lands in, so with few shares the lowest falls where that noise puts it")
    else:
        for text in ("Overhead decreases with increasing the avail. memory (<= 40%)",
                     "Recompute/Swap get the lowest overhead when avail. memory is 30% or 50%"):
            claim(study, "Fig. 5", text, unmeasured(study, "fig5"), None, "fewer than two shares measured")

    # Fig 6: usage and throughput over time at the tightest share
    f6 = res.get("fig6", {})
    for s, text in (("recompute", "Recompute: KV usage decreases when eviction happens and increases when evicted "
                                  "requests are resumed; throughput rises periodically"),
                    ("swap-host", "Swap: KV usage decreases when eviction happens and increases when evicted requests "
                                  "are resumed; sharp throughput increases from waiting requests' prompts")):
        row = f6.get(s)
        if row:
            sw = row["swings"]
            claim(study, "Fig. 6", text,
                  f"at {row['share']:.0%}: {row['preemptions']} preemptions, KV usage drops {sw['drops']} / rises "
                  f"{sw['rises']} times (samples every {POLL_S} s, peak {sw['peak']:.0%}); throughput "
                  f"{row['tput_min']:.1f}-{row['tput_max']:.1f} tokens/s per {POLL_S} s bin",
                  bool(row["preemptions"]) and sw["drops"] > 0 and sw["rises"] > 0,
                  "usage is the node's kv_cache_usage_perc polled over gRPC; throughput counts streamed tokens")
        else:
            claim(study, "Fig. 6", text, unmeasured(study, "fig5"), None, "the tightest run did not complete")


def fig6(res: dict) -> dict:
    f5 = res.get("fig5", {})
    if not f5:
        return {}
    tight = min(f5, key=float)
    out = {}
    for s, row in (f5[tight] or {}).items():
        if not row:
            continue
        tput = [v for _, v in row["throughput"]]
        out[s] = {"share": row["actual_share"], "preemptions": sum(row["preemptions"].values()),
                  "swings": ov.usage_swings([u for _, u in row["usage"]]),
                  "tput_min": min(tput, default=0.0), "tput_max": max(tput, default=0.0)}
    return out


def add_ratios(study: dict) -> None:
    f5 = study["results"].get("fig5", {})
    if not f5:
        return
    tight = min(f5, key=float)
    by = {s: r for s, r in (f5[tight] or {}).items() if r}
    r = study["ratios"]
    for s, row in by.items():
        r[f"extra_e2e_frac_{s}_at_{tight}"] = row["extra_e2e_frac"]
        r[f"extra_cpu_frac_{s}_at_{tight}"] = row["extra_cpu_frac"]
        r[f"engine_s_{s}_at_{tight}"] = row["engine_total_s"]
    if by.get("recompute") and by.get("swap-host") and by["swap-host"]["extra_e2e_s"] > 0:
        r[f"recompute_vs_swap_host_extra_e2e_at_{tight}"] = by["recompute"]["extra_e2e_s"] / by["swap-host"]["extra_e2e_s"]
    if by.get("recompute") and by.get("swap-host") and by["swap-host"]["extra_cpu_s"] > 0:
        r[f"recompute_vs_swap_host_extra_cpu_at_{tight}"] = by["recompute"]["extra_cpu_s"] / by["swap-host"]["extra_cpu_s"]
    if by.get("recompute") and by.get("swap-host") and by["swap-host"]["engine_total_s"] > 0:
        r[f"recompute_vs_swap_host_engine_s_at_{tight}"] = (by["recompute"]["engine_total_s"]
                                                            / by["swap-host"]["engine_total_s"])
    if by.get("swap-storage") and by.get("swap-host"):
        r[f"swap_storage_out_s_at_{tight}"] = by["swap-storage"]["counters"]["preempt_swap_out_s"]
        r[f"swap_host_out_s_at_{tight}"] = by["swap-host"]["counters"]["preempt_swap_out_s"]
        r[f"swap_storage_wait_s_at_{tight}"] = by["swap-storage"]["counters"]["preempt_swap_wait_s"]


def headline_rows(study: dict) -> list[dict]:
    """Rows of the README's headline table: {question, measured, target}."""
    f5 = study.get("results", {}).get("fig5", {})
    target = "the poster: swap below recompute when many tokens are evicted (Fig. 3) and for long sequences (Fig. 4)"
    if not f5:
        failed = [f["error"] for f in study.get("failed", [])]
        return [{"question": "Preemption overhead at a tight pool: recompute / swap-host / swap-storage, extra e2e",
                 "measured": f"failed: {failed[0]}" if failed else "did not run", "target": target}]
    tight = min(f5, key=float)
    by = f5[tight] or {}
    w = next((r["workload"] for r in by.values() if r), "?")
    cells = [f"{by[s]['extra_e2e_s']:+.1f} s ({by[s]['extra_e2e_frac']:+.0%})" if by.get(s) else "failed"
             for s in STRATEGIES]
    cpu = [f"{by[s]['extra_cpu_s']:+.1f} s ({by[s]['extra_cpu_frac']:+.0%})" if by.get(s) else "failed"
           for s in STRATEGIES]
    eng = [f"{by[s]['engine_total_s']:.2f} s" if by.get(s) else "failed" for s in STRATEGIES]
    return [{"question": f"Preemption overhead, pool {float(tight):.0%} of what {w} need: recompute / swap-host / "
                         "swap-storage, extra end to end (poster Fig. 5)",
             "measured": " / ".join(cells), "target": target},
            {"question": "The same, extra CPU time of the serving processes (it swings with the others' load too)",
             "measured": " / ".join(cpu), "target": target},
            {"question": "The same, the engine's own time in preemption work (recompute; swap copies and waits)",
             "measured": " / ".join(eng), "target": "the poster: recompute's compute vs swap's I/O"}]


# -- plots -----------------------------------------------------------------------------------------------

def make_plots(study: dict, out: Path) -> list:
    res, paths = study["results"], []
    for fig, key, xlabel, title, logx in (
            ("fig2", "fig2", "block size (tokens)", "Fig. 2: overhead by block size", True),
            ("fig4", "fig4", "sequence length (input + output tokens), batch 16", "Fig. 4: overhead by sequence length",
             False),
            ("fig5", "fig5", "KV memory available (share of what the batch needs)", "Fig. 5: overhead by KV memory",
             False)):
        rows = res.get(key, {})
        series = {}
        for s in STRATEGIES:
            xs, ys = _series(rows, s, "extra_e2e_s")
            if xs:
                series[f"{s} (extra e2e)"] = (xs, ys)
            xs, ys = _series(rows, s, "extra_cpu_s")
            if xs:
                series[f"{s} (extra CPU)"] = (xs, ys)
            xs, ys = _series(rows, s, "engine_total_s")
            if xs:
                series[f"{s} (engine)"] = (xs, ys)
        if series:
            paths.append(plot_lines(out / f"{fig}.png", series, title=title, xlabel=xlabel, ylabel="overhead (s)",
                                    logx=logx))
    f5 = res.get("fig5", {})
    series = {}
    for by in f5.values():
        for s, row in (by or {}).items():
            if row:
                series.setdefault(s, []).append((row["evicted_tokens"], row[METRIC]))
    if series:
        paths.append(plot_lines(out / "fig3.png", {s: ([x for x, _ in sorted(v)], [y for _, y in sorted(v)])
                                                   for s, v in series.items()},
                                title="Fig. 3: overhead by evicted tokens (Fig. 5's runs)",
                                xlabel="tokens evicted (preempted KV tokens)", ylabel="engine time in preemption work (s)"))
    if f5:
        tight = f5[min(f5, key=float)] or {}
        usage = {s: ([t for t, _ in r["usage"]], [u * 100 for _, u in r["usage"]]) for s, r in tight.items() if r}
        tput = {}
        for s, r in tight.items():
            if r:
                series = ov.rebin(r["throughput"], max(1, round(THROUGHPUT_BIN_S / POLL_S)))
                tput[s] = ([t for t, _ in series], [v for _, v in series])
        if usage:
            paths.append(plot_lines(out / "fig6_kv_usage.png", usage, title="Fig. 6: KV cache usage over time",
                                    xlabel="time (s)", ylabel="KV cache usage (%)"))
        if tput:
            paths.append(plot_lines(out / "fig6_throughput.png", tput, title="Fig. 6: throughput over time",
                                    xlabel="time (s)", ylabel=f"tokens/s (mean over {THROUGHPUT_BIN_S:g} s)"))
    return paths


# -- the command -----------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study poster", description=__doc__.splitlines()[0])
    add_study_args(parser, "poster")
    parser.add_argument("--torch-threads", type=int, default=0, help="the compute node's torch threads (0: all)")
    args = parser.parse_args(argv)
    args.profile_obj = check_profile(parser, args, "poster")
    return args


def intro_text(m: Mode, mode: str) -> str:
    w = m.fig5
    return f"""The recompute-vs-swap poster (vLLM, Yarn-Llama-2-7B, A100 40 GB) asks what preemption costs when
the KV cache runs out: recompute the victim's KV later, or swap it to host memory and back. Here the
batching engine of the compute node (SmolLM2-135M on CPU, fp32 KV in a shared-memory pool standing in
for GPU memory) runs three strategies: `recompute`, `swap-host` (a host swap tier inside the compute
node: vLLM's CPU swap space, the poster's swap) and `swap-storage` (the paper's way: preemption `swap`
under policy `triggered`, triggered PUTs to the storage node and GETs back).

Scaled to this model and machine ({mode} mode): the poster's 32 requests of 1,500 input + 1,024 output
tokens become {w.requests} requests of {w.input_tokens} + {w.output_tokens} issued at once (Figs 3, 5, 6);
Fig. 4's batch 16 becomes {m.fig4_batch} requests at lengths {', '.join(f'{i}+{o}' for i, o in m.fig4_lengths)}
(pool {m.fig4_share:.0%} of their need); Fig. 2's block sizes are {', '.join(map(str, m.block_sizes))} tokens
at {m.fig2_share:.0%}; KV memory available is the pool as a share of what every request needs at its
longest at once ({', '.join(f'{s:.0%}' for s in m.shares)}); Fig. 6 is the tightest share. Fig. 3 is drawn
from Fig. 5's runs (each run's evicted tokens, x, against its overhead, y).

Overhead is reported two ways: the extra end-to-end time (the batch's makespan against the same batch on a
pool that never runs out, same policy) and the engine's own time in preemption work (forward time on
recomputed tokens; the host tier's copies; for swap-storage the swapped sequences' waits for their GETs).
Beside the first, the extra CPU time of the serving processes (compute node, agent, storage node) over
the same batch. The claims are judged on the engine's own time: on 2 cores shared with other work a
batch's wall time swung by minutes with the others' load, and its CPU time with it (torch's threads
spin when descheduled), while the engine's counters measure the preemption work itself.
The storage node, the agent and the frontend stay up; the compute node is restarted per point and warmed
up. Timings on a 2-core machine shared with other work are noisy: one batch per point."""


def storage_note(study: dict) -> str:
    f5 = study["results"].get("fig5", {})
    if not f5:
        return ""
    tight = min(f5, key=float)
    by = f5[tight] or {}
    st, host = by.get("swap-storage"), by.get("swap-host")
    if not st:
        return ""
    c = st["counters"]
    text = (f"## Swap to storage (the paper's way)\n\nAt {float(tight):.0%}: swap-storage's swap-outs took "
            f"{c['preempt_swap_out_s'] * 1e3:.1f} ms of engine time in all, its swapped sequences waited "
            f"{c['preempt_swap_wait_s']:.2f} s in all for their GETs, extra e2e {st['extra_e2e_s']:+.2f} s. ")
    if host:
        text += (f"swap-host copied {host['counters']['swap_host_bytes_out'] / 2**20:.1f} MiB out in "
                 f"{host['counters']['preempt_swap_out_s'] * 1e3:.1f} ms and back in "
                 f"{host['counters']['preempt_swap_in_s'] * 1e3:.1f} ms. ")
    text += ("Under `triggered` every block is stored by a triggered PUT as it fills, so a swap-out only "
             "stores the victim's partial last block (and its full blocks stay pinned until their PUTs end); "
             "the cost is on the way back: GETs through the agent and the storage node, while the sequence "
             "waits outside the batch.")
    return text


def rows_table(study: dict) -> str:
    lines = ["## Points", "", "| figure | x | strategy | pool tokens | preemptions | evicted tokens | makespan s | "
             "ample s | extra e2e | extra CPU | engine s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fig in ("fig2", "fig4", "fig5"):
        for x, by in study["results"].get(fig, {}).items():
            for s, r in (by or {}).items():
                if r:
                    lines.append(f"| {fig} | {x} | {s} | {r['pool_tokens']} | {sum(r['preemptions'].values())} | "
                                 f"{r['evicted_tokens']} | {r['makespan_s']:.2f} | {r['ample_makespan_s']:.2f} | "
                                 f"{r['extra_e2e_s']:+.2f} s ({r['extra_e2e_frac']:+.0%}) | "
                                 f"{r['extra_cpu_s']:+.2f} s ({r['extra_cpu_frac']:+.0%}) | {r['engine_total_s']:.2f} |")
                else:
                    lines.append(f"| {fig} | {x} | {s} | failed | | | | | | | |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> tuple[dict, str, str, str]:
    from bench.stack import Stack, bench_config

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    m = MODES[mode]
    study = new_study("poster", args, {"mode": dataclasses.asdict(m), "strategies": STRATEGIES,
                                       "poll_s": POLL_S, "torch_threads": args.torch_threads})
    compute: dict[str, Any] = {"torch_threads": args.torch_threads, "block_tokens": m.block_tokens}
    smoke_model = None
    if args.smoke:
        from bench.study.paper import cached_tiny_model
        smoke_model = str(cached_tiny_model())
        compute["model_cache_dir"] = smoke_model
    config = bench_config(pool_tokens=4096, compute=compute)
    dilation, how, warmup = 1.0, "", None
    if args.profile_obj is not None:  # before the stack starts: its services inherit the profile and D
        dilation, how, warmup = scaled.choose_dilation(args.profile_obj, args.dilation_value, bool(args.smoke),
                                                       args.torch_threads)  # at the compute node's threads
        scaled.apply(args.profile_obj.name, dilation)
        study["settings"]["profile"], study["settings"]["dilation"] = args.profile_obj.name, dilation
    progress = Progress(count_runs(m), "poster", enabled=not args.json)
    with Stack(services_dir(args, "poster"), config, policy="triggered", keep_data=args.keep_data,
               placement=args.placement) as stack, progress:
        runner = Runner(stack, smoke_model, progress, dilation)
        try:
            points = Points(study, runner, progress)
            points.plan(m)
            study["results"] = sweep(points, m)
            study["results"]["compute_restarts_s"] = runner.restarts_s
            if args.profile_obj is not None:
                runner.keep_pacing()
                study["scale"] = scaled.record(args.profile_obj, dilation,
                                               runner.pacing + scaled.stack_pacing(stack, compute=False), how)
                study["scale"]["warmup"] = warmup
        finally:
            runner.close()
            if args.profile_obj is not None:
                scaled.clear()
    study["results"]["fig6"] = fig6(study["results"])
    add_claims(study)
    add_ratios(study)
    study["plots"] = make_plots(study, Path(args.out))
    body = "\n\n".join(t for t in (storage_note(study), rows_table(study)) if t)
    title = "The recompute-vs-swap poster, Figs 2-6"
    if args.profile_obj is not None:
        title += f", under the hardware profile `{args.profile_obj.name}` (virtual time)"
        body = scaled_note(study, args.profile_obj) + "\n\n" + body
    return study, title, intro_text(m, mode), body


def scaled_note(study: dict, profile) -> str:
    """What the scale model changes on this page."""
    rec = study.get("scale") or {}
    kinds = (rec.get("pacing") or {}).get("kinds", {})
    rows = "\n".join(f"| {k} | {v['ops']} | {v['violations']} | {v['worst_ratio']:.3g} |" for k, v in kinds.items())
    return (f"## Under the hardware profile `{profile.name}`\n\n{profile.description}\n\n"
            "Every engine step takes the roofline time of the virtual model's step on the profile's GPU, every "
            "swap-host copy the PCIe link's time for the virtual model's KV of the tokens moved, every "
            "triggered PUT and GET the NIC's, every store and retrieve the NVMe drive's, each dilated by D; "
            "the real SmolLM2 still computes every token. Makespans, engine seconds and throughput are virtual "
            "(wall / D); the extra CPU time is this machine's real CPU time and speaks for this machine only.\n\n"
            "| operation | paced | violations | worst real ÷ modeled |\n| --- | --- | --- | --- |\n" + rows)


main = main_of(parse_args, run)
