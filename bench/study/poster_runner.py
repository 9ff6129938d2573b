"""The poster study's runner: the Stack's compute node restarted per configuration, batches of requests
issued at once through the agent, the node's Stats polled while they run (I/O; the definitions are in
bench.study.overhead and bench.study.poster_fig6)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid

from bench.progress import Progress
from bench.study import overhead as ov

logger = logging.getLogger(__name__)

POLL_S = 0.25
# The study runs the compute node with its prefix cache off: a sequence resumed after a recompute preemption
# would otherwise find its own freed blocks and recompute only what was reused since (issue 43: 137 of 553
# evicted tokens recomputed at block 16, 587 of 587 at 64). vLLM of the poster's time had no prefix cache.
PREFIX_CACHE = "false"


@dataclasses.dataclass(frozen=True)
class Workload:
    requests: int
    input_tokens: int
    output_tokens: int

    @property
    def name(self) -> str:
        return f"{self.requests}x{self.input_tokens}+{self.output_tokens}"


def prompts(base: list[int], workload: Workload, repeat: int = 0) -> list[list[int]]:
    """N distinct prompts of exactly input_tokens tokens each (the base repeated, a few ids made distinct),
    distinct again in each repeat."""
    reps = -(-workload.input_tokens // len(base))
    out = []
    for i in range(workload.requests):
        ids = (base * reps)[:workload.input_tokens]
        for k in range(1, min(4, len(ids))):
            ids[k] = 1000 + 97 * (i + repeat * workload.requests) + k
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
                         "KVTB_COMPUTE_MAX_CONTEXT_TOKENS": str(max_context),
                         "KVTB_COMPUTE_PREFIX_CACHE": PREFIX_CACHE})
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

    def pacing_so_far(self) -> list[dict]:
        """Under a profile: the compute node's pacer snapshots of this run so far (each finished run of it,
        and the running one's since its warm-up), without forgetting anything."""
        if self.dilation == 1.0 or self.config is None:
            return list(self.pacing)
        from scale.dilation import since
        snap = self._compute_pacing()
        return self.pacing + ([since(snap, self.warm_pacing)] if snap else [])

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

    def batch(self, workload: Workload, policy: str, tag: str, repeat: int = 0) -> dict:
        """N requests issued at once; makespan, per-request e2e, token times, Stats samples, counters."""
        ids = prompts(self.base_prompt, workload, repeat)
        before = self.stats()
        cpu_before = self.stack.cpu_seconds()
        times: list[list[float]] = [[] for _ in ids]
        ends: list[float | None] = [None] * len(ids)
        errors: list[BaseException] = []
        samples: list[tuple[float, float, int, int, int]] = []  # (t, usage, running, waiting, preemptions)
        stop = threading.Event()

        def poll(start: float) -> None:
            while not stop.wait(POLL_S):
                try:
                    s = self.stats()
                    samples.append((self.now() - start, float(s.get("kv_cache_usage_perc", 0.0)),
                                    int(s.get("num_requests_running", 0)), int(s.get("num_requests_waiting", 0)),
                                    sum((s.get("preemptions") or {}).values()) - preempted))
                except Exception:  # noqa: BLE001 - a missed sample is only a gap in Fig 6
                    pass

        def one(i: int) -> None:
            try:
                ends[i] = self._turn(f"p{i}", f"{tag}-{i}", ids[i], workload.output_tokens, policy, times[i])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        preempted = sum((before.get("preemptions") or {}).values())
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
                "samples": [list(x) for x in samples]}


def _delta_map(before: dict | None, after: dict | None) -> dict:
    before, after = before or {}, after or {}
    return {k: int(after[k]) - int(before.get(k, 0)) for k in after if int(after[k]) - int(before.get(k, 0))}

