"""Trigger-to-fire of the standing PUTs (`kvtb bench smartnic`'s first figures): from the compute node's
counter store to the agent issuing the block's PUT.

The agent runs in this process; a child process plays the compute node over a pool registered with
it (small blocks: what is timed is the trigger, not the data). As the engine does, the child writes
a block's token ids and descriptor, stamps the descriptor with CLOCK_MONOTONIC just before it
stores the block's PUT trigger counter, and reuses a block only once its PUT ended; the agent times
each fire from that stamp (its own kvtb:trigger_to_fire_seconds does the same), so nothing is timed
in the process that waits. Two scenes in one run:

- idle: one block at a time, at random gaps of 0.2 to 3 ms, the machine otherwise quiet;
- load: a decode. Each step the child computes for `step_ms` (matrix products on every core, as a
  forward of the compute node does) and then stores the blocks the step filled (0 to `burst` at
  once), while the agent's data path is storing the earlier ones on the storage node.

Then the watcher's own CPU, as a share of one core (its thread's run time, /proc's schedstat): warm
(the last store less than the agent's `watcher_warm_ms` ago: it polls every `watcher_poll_us`) and
idle (no store for longer: it backs off to `watcher_max_sleep_us`). The ceilings (TRIGGER_CEILINGS)
are the issue's: p50 at most 50 µs and p99 at most 500 µs, in both scenes.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import struct
import time
import uuid
from pathlib import Path

import numpy as np

from bench.stats import percentile
from hostmem import descriptor
from hostmem.bell import Bell
from hostmem.block_hash import block_hash, salt_for
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_to_proto
from hostmem.region import Region
from smartnic.agent import Agent

LAYOUT = KvLayout(num_blocks=64, num_layers=2, num_kv_heads=2, block_tokens=16, head_dim=16)  # 8 KiB blocks
USER, TENANT, KEY = "bench-trigger", "default", "bench"
TRIGGER_CEILINGS = {f"trigger_to_fire_{scene}_{p}_us": limit for scene in ("idle", "load")
                    for p, limit in (("p50", 50.0), ("p99", 500.0))}


@dataclasses.dataclass(frozen=True)
class Scene:
    """What the stand-in compute node does: gaps between single stores, or decode steps and bursts."""

    name: str
    stores: int
    gap_s: tuple[float, float] = (0.0002, 0.003)  # idle: a random gap before each store
    step_s: float = 0.0                           # load: compute this long, then store a burst
    burst: int = 0


def _compute(name: str, size: int, scene: Scene, context: str, seed: int, queue, cpus: tuple[int, ...] = ()) -> None:
    """Child process: the compute node's side of `scene` (on `cpus`, the placement's compute CPUs; (): any);
    puts [(block, generation, stamp ns)] on queue."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    L = LAYOUT
    region = Region.attach(name, size, L.counter_offset, L.counter_count)
    writer, rng, bell = descriptor.Writer(region.buffer), random.Random(seed), Bell(L, region.counters)
    counters, salt, ids = region.counters, salt_for(TENANT, USER), np.zeros(L.block_tokens, dtype="<u4")
    a = np.random.default_rng(seed).standard_normal((384, 384), dtype=np.float32)
    token_ids = np.frombuffer(region.buffer, dtype="<u4", count=L.num_blocks * L.block_tokens,
                              offset=L.token_ids_offset).reshape(L.num_blocks, L.block_tokens)
    done_at = [sum(map(int, counters[L.put_done(b)])) for b in range(L.num_blocks)]  # PUT-done total when free
    stamps, n, block = [], 0, 0

    def store() -> None:
        nonlocal n, block
        deadline = time.monotonic() + 30
        while sum(map(int, counters[L.put_done(block)])) < done_at[block]:  # its last PUT has not ended
            if time.monotonic() > deadline:
                raise TimeoutError(f"block {block}'s PUT did not end")
            time.sleep(0.0002)
        ids[:] = np.arange(n * L.block_tokens, (n + 1) * L.block_tokens) % 49152
        token_ids[block] = ids
        generation, record = int(counters[L.put_trigger(block), 0]) + 1, L.descriptor_range(block)[0]
        writer.write(record, generation, 0, L.block_tokens, block_hash(b"", ids.tobytes(), salt), b"", TENANT, USER,
                     context)
        writer.stamp(record)
        counters[L.put_trigger(block), 0] = generation  # the flag write
        bell.ring()
        stamps.append((block, generation, struct.unpack_from("<Q", region.buffer, record + descriptor.STAMP_OFFSET)[0]))
        done_at[block] += 1
        n, block = n + 1, (block + 1) % L.num_blocks

    try:
        while n < scene.stores:
            if scene.step_s:  # a decode step on every core, then the blocks it filled
                end = time.perf_counter() + scene.step_s
                while time.perf_counter() < end:
                    a = np.tanh(a @ a)
                for _ in range(min(rng.randint(0, scene.burst), scene.stores - n)):
                    store()
            else:
                time.sleep(rng.uniform(*scene.gap_s))
                store()
        queue.put(stamps)
    finally:
        region.close()


def _split(agent: Agent) -> tuple[int, int]:
    counts = agent.snapshot()  # (the fast path's process's figures are forwarded to the agent's)
    return counts.get("fire_seen_ns_total", 0), counts.get("fire_issue_ns_total", 0)


def _run_scene(agent: Agent, region: Region, scene: Scene, seed: int, cpus: tuple[int, ...] = ()) -> dict:
    """Run one scene against the registered pool; its latencies in µs and their percentiles."""
    fired: dict[tuple[int, int], tuple[int, int]] = {}
    hook = lambda reg, block, gen, store_ns, fire_ns: fired.__setitem__((block, gen), (store_ns, fire_ns))
    agent.engine.on_block_fire.append(hook)
    context = f"trigger-{scene.name}-{uuid.uuid4().hex[:8]}"
    split_before = _split(agent)
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_compute, args=(region.name, region.size, scene, context, seed, queue, cpus))
        child.start()
        stamps = queue.get(timeout=600)
        child.join()
        deadline = time.monotonic() + 60
        while len(fired) < len(stamps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(stamps) - len(fired)} of {len(stamps)} stores never fired")
            time.sleep(0.001)
        _wait_puts(region)
    finally:
        agent.engine.on_block_fire.remove(hook)
    agent.drop_context(USER, context)
    if not (all(fired[(b, g)][0] == s for b, g, s in stamps)):
        raise RuntimeError("the agent timed from another stamp than the store's")
    latencies = [(fired[(b, g)][1] - s) / 1000 for b, g, s in stamps]
    seen, issue = (after - before for after, before in zip(_split(agent), split_before))
    return {"stores": len(stamps), "p50_us": percentile(latencies, 50), "p99_us": percentile(latencies, 99),
            # the mean fire split: store -> seen by a poll (the wake-up), seen -> PUT issued (check, hand-off)
            "mean_seen_us": seen / 1000 / len(stamps), "mean_issue_us": issue / 1000 / len(stamps),
            "max_us": max(latencies), "mean_us": float(np.mean(latencies)),
            "refused": agent.stats.snapshot()[1].get("errors", {}).get("descriptor_refused", 0)}


def _wait_puts(region: Region, timeout_s: float = 60.0) -> None:
    """Until every block's PUT-done total has caught up with its trigger (all PUTs ended)."""
    L, deadline = LAYOUT, time.monotonic() + timeout_s
    while any(sum(region.read_counter(L.put_done(b))) < region.read_counter(L.put_trigger(b))[0]
              for b in range(L.num_blocks)):
        if time.monotonic() > deadline:
            raise TimeoutError("PUTs did not end")
        time.sleep(0.005)


def thread_cpu_ns(native_id: int, pid: str = "self") -> int:
    """A thread's time on a CPU so far, in ns (/proc/PID/task/ID/schedstat)."""
    return int(Path(f"/proc/{pid}/task/{native_id}/schedstat").read_text().split()[0])


def watcher_thread(agent: Agent) -> tuple[str, int] | None:
    """(pid, thread id) of the thread that polls the pools' triggers: the agent's own watcher, or, with the
    fast path in a process of its own, that process's watcher (as it said when it started)."""
    if agent.fastpath is None:
        return "self", agent.engine._thread.native_id  # the compiled poller's waits run on it too
    return str(agent.fastpath.pid), agent.fastpath.watcher_tid


def watcher_cpu(agent: Agent, window_s: float = 1.0) -> dict:
    """The watcher thread's share of one core, warm (right after a store) and idle (past warm_ms)."""
    found = watcher_thread(agent)
    if found is None or not Path(f"/proc/{found[0]}/task/{found[1]}/schedstat").exists():
        return {}
    pid, tid = found
    warm_s = agent.engine.warm_s

    def share() -> float:
        start, t0 = thread_cpu_ns(tid, pid), time.perf_counter()
        time.sleep(window_s)
        return (thread_cpu_ns(tid, pid) - start) / 1e9 / (time.perf_counter() - t0)

    warm = share() if window_s < warm_s else None  # called right after a scene's last store
    time.sleep(max(0.0, warm_s - window_s) + 0.2)
    return {"warm_core_share": warm, "idle_core_share": share(), "warm_s": warm_s,
            "poll_us": agent.engine.poll_s * 1e6, "max_sleep_us": agent.engine.max_sleep_s * 1e6,
            "compiled": agent.fastpath.compiled if agent.fastpath is not None else
            any(reg.standing.poller is not None for reg in agent.regions.all() if reg.standing),
            "fastpath": agent.settings.fastpath, "busy_poll": agent.settings.watcher_busy_poll}


def measure_watcher(agent: Agent, samples: int, step_ms: float = 20.0, burst: int = 4,
                    compute_cpus: tuple[int, ...] = ()) -> dict:
    """Both scenes over one registered pool, then the watcher's CPU, with the agent's watcher as it is set
    now (agent.engine.compiled); figures in µs."""
    L = LAYOUT
    region = Region.create(f"kvtb-bench-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset, L.counter_count)
    reg = agent.register(region.name, region.size, KEY, L.counter_offset, L.counter_count, layout_to_proto(L),
                         owner="bench")
    try:
        idle = _run_scene(agent, region, Scene("idle", samples), seed=1, cpus=compute_cpus)
        load = _run_scene(agent, region, Scene("load", samples, step_s=step_ms / 1000, burst=burst), seed=2,
                          cpus=compute_cpus)
        cpu = watcher_cpu(agent)
    finally:
        agent.deregister(reg.region_id, KEY)
        region.close()
    return {"idle": idle, "load": load, "watcher_cpu": cpu, "step_ms": step_ms, "burst": burst,
            "block_bytes": L.block_bytes, "p50_us": idle["p50_us"], "p99_us": idle["p99_us"]}


def measure(agent: Agent, samples: int, step_ms: float = 20.0, burst: int = 4,
            compute_cpus: tuple[int, ...] = ()) -> dict:
    """measure_watcher() with the agent's watcher as configured (the figures), and, when that is the
    agent's own compiled poller, again with the Python poll beside it (`python_poll`): what the doorbell
    changes. compute_cpus: where the stand-in compute node runs (the placement's compute CPUs)."""
    result = measure_watcher(agent, samples, step_ms, burst, compute_cpus)
    if (result["watcher_cpu"] or {}).get("compiled") and agent.fastpath is None:
        agent.engine.compiled = False
        try:
            result["python_poll"] = measure_watcher(agent, samples, step_ms, burst, compute_cpus)
        finally:
            agent.engine.compiled = True
    return result


def cpu_ratio(t: dict) -> float | None:
    """The Python poll's warm CPU / the compiled poller's, measured in the same run (None: not both)."""
    python = (t.get("python_poll") or {}).get("watcher_cpu") or {}
    compiled = (t.get("watcher_cpu") or {}).get("warm_core_share")
    if not python.get("warm_core_share") or not compiled:
        return None
    return python["warm_core_share"] / compiled


def figures(t: dict) -> dict[str, float]:
    """The figures the ceilings apply to: trigger_to_fire_{idle,load}_{p50,p99}_us."""
    return {f"trigger_to_fire_{scene}_{p}_us": t[scene][f"{p}_us"] for scene in ("idle", "load")
            for p in ("p50", "p99")}


def split(scene: dict) -> str:
    """"; mean A µs to be seen, B µs to issue" where the scene measured it."""
    if "mean_seen_us" not in scene:
        return ""
    return f"; mean {scene['mean_seen_us']:.0f} µs to be seen, {scene['mean_issue_us']:.0f} µs to issue"


def text(t: dict) -> str:
    """Each scene's percentiles and the watcher's CPU (and the same with the Python poll, when measured)."""
    scenes = "; ".join(f"{s} p50 {t[s]['p50_us']:.0f} µs, p99 {t[s]['p99_us']:.0f} µs, max {t[s]['max_us']:.0f} µs "
                       f"({t[s]['stores']} stores{split(t[s])})" for s in ("idle", "load"))
    cpu = t.get("watcher_cpu") or {}
    share = lambda key, c=cpu: "-" if c.get(key) is None else f"{c[key] * 100:.1f}%"
    kind = "compiled poller, doorbell" if cpu.get("compiled") else "Python poll"
    out = (f"trigger-to-fire (counter store -> PUT issued): {scenes}\n"
           f"watcher CPU ({kind}), share of a core: warm {share('warm_core_share')}, "
           f"idle {share('idle_core_share')}")
    python = t.get("python_poll")
    if python:
        pc = python.get("watcher_cpu") or {}
        out += (f"\nthe same with the Python poll: idle p50 {python['idle']['p50_us']:.0f} µs, "
                f"p99 {python['idle']['p99_us']:.0f} µs; load p50 {python['load']['p50_us']:.0f} µs, "
                f"p99 {python['load']['p99_us']:.0f} µs; CPU warm {share('warm_core_share', pc)}, "
                f"idle {share('idle_core_share', pc)}")
    return out
