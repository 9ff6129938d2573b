"""`kvtb bench soak`: two agents' worth of Stores and Retrieves on one storage node for minutes; its stalls.

One storage node process (fsync on, the deployment's fabric security: bench.stack.start_storage) and
two hosts in this process, each `fabric.nodes.StorageNodes` with the agent's settings (queue depth
128, fabric timeout 5 s, reconnect 1 s, a GET timeout of 3 s) and its own host NQN (replica 0's and
replica 1's agents). For `--seconds` each host keeps `--window` commands in flight, as the agent's
PUT and GET paths do: Stores of KV-chunk-sized values (`--sizes`, at most `--mib-per-s` a host),
whole-value GETs in data PDUs with the guard check skipped (the agent's GET), head reads of many keys
in one range command (the agent's miss path), and Deletes that keep each host's working set under
`--working-set-mib` (the agent's eviction). A failure is reported to StorageNodes, as the agent does:
a timeout makes it reconnect.

Measured per host: each command's time from submit to completion (max, p99) by opcode, its failures
by kind, and its longest silence: the longest time it had commands outstanding and got no completion
at all (the issue's "stopped answering for 8 s"). From the node: every stall it logged (a fabric
thread busy or a command outstanding over 1 s, with what it waited on; a slow group commit or Flush)
and its longest command (the log line at its stop).

Target (`floors`, ceilings): the longest silence of either host under 2 s, and no command that
succeeded took over 5 s (the agent's fabric timeout).
"""
from __future__ import annotations

import argparse
import collections
import logging
import random
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np

from bench.results import add_common_args, data_dir, floors, format_table, new_result, run_bench, run_part
from bench.stack import start_storage
from bench.stats import percentile
from fabric import status as st
from fabric.auth import FabricSecurity
from fabric.client import FabricError
from fabric.nodes import StorageNodes
from kvtb.credentials import replica_nqns
from kvtb_proto import nvmeof_pb2 as pb
from smartnic.settings import SmartNicSettings

logger = logging.getLogger(__name__)

MIB = 1 << 20
NSID = 1
NODE = "s0"
SILENCE_CEILING_S = 2.0
SLOWEST_CEILING_S = 5.0
STALL_LINE = re.compile(r"stall:|stall over:|group commit of \d+ ops took|fdatasync of a Flush took|reply to a departed host")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench soak", description=__doc__.splitlines()[0])
    add_common_args(parser, "soak")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long both hosts run (default 10 min)")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[256 << 10, 1 << 20, 4 << 20], help="value sizes in bytes, comma-separated")
    parser.add_argument("--window", type=int, default=128, help="commands each host keeps in flight (the agent's queue depth)")
    parser.add_argument("--mib-per-s", type=float, default=100.0, help="MiB each host stores a second, at most")
    parser.add_argument("--working-set-mib", type=int, default=512, help="MiB each host keeps stored")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.working_set_mib = min(args.seconds, 10.0), min(args.working_set_mib, 64)
    return args


class Host:
    """One agent's traffic to the node: a window of commands in flight, each timed, failures reported."""

    def __init__(self, name: str, nqn: str, address: str, args: argparse.Namespace, seed: int):
        agent = SmartNicSettings()
        self.name, self.args = name, args
        self.get_timeout_s = agent.get_timeout_s
        self.nodes = StorageNodes([(NODE, address)], nqn, agent.queue_depth, agent.fabric_timeout_s,
                                  agent.reconnect_interval_s,
                                  security=FabricSecurity.for_host(agent.fabric_security, "", nqn))
        self.rng = random.Random(seed)
        self.pool = np.random.default_rng(seed).integers(0, 256, max(args.sizes) + 64, dtype=np.uint8)
        self.window = threading.Semaphore(args.window)
        self.lock = threading.Lock()
        self.took: dict[str, list[float]] = collections.defaultdict(list)  # op -> seconds, succeeded
        self.failed: collections.Counter[str] = collections.Counter()     # "op: kind" -> count
        self.slowest: tuple[float, str] = (0.0, "")
        self.stored: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> bytes
        self.stored_bytes = 0
        self.outstanding = 0
        self.last_answer = time.monotonic()
        self.silence: tuple[float, float] = (0.0, 0.0)  # (longest seconds, when it began, since start)
        self.started = time.monotonic()
        self.next_key = 0

    # -- the workload
    def run(self, deadline: float) -> None:
        budget_at = time.monotonic()  # store pacing: the time the next store's bytes are due
        while time.monotonic() < deadline:
            if not self.window.acquire(timeout=1.0):
                continue
            client = self.nodes.client(NODE)
            if client is None:
                self.window.release()
                self._fail("any", "storage_unavailable")
                time.sleep(0.05)
                continue
            op = self._choose()
            try:
                if op == "store":
                    size = self.rng.choice(self.args.sizes)
                    budget_at = max(budget_at, time.monotonic() - 1.0) + size / (self.args.mib_per_s * MIB)
                    time.sleep(max(0.0, budget_at - time.monotonic()))
                    self._store(client, size)
                elif op == "get":
                    self._get(client)
                elif op == "heads":
                    self._heads(client)
                else:
                    self._delete(client)
            except FabricError as exc:  # a closed client: the command never left
                self.window.release()
                self._fail(op, type(exc).__name__)

    def _choose(self) -> str:
        with self.lock:
            have = len(self.stored)
            over = self.stored_bytes > self.args.working_set_mib * MIB
        if over:
            return "delete"
        if have < 4:
            return "store"
        return self.rng.choices(("store", "get", "heads"), (5, 4, 1))[0]

    def _store(self, client, size: int) -> None:
        key = b"%s-%d" % (self.name.encode(), self.next_key)
        self.next_key += 1
        offset = self.rng.randrange(0, 64)
        value = memoryview(self.pool)[offset:offset + size]
        capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=NSID, key=key,
                                    value_length=size)
        self._track("store", client.submit(capsule, [value]), lambda: self._stored(key, size))

    def _get(self, client) -> None:
        with self.lock:
            key = self.rng.choice(list(self.stored)[-256:])
        capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=NSID, key=key,
                                    skip_guard_check=True, data_pdu_bytes=1 << 20, lease_ms=3000)
        self._track("get", client.submit(capsule, timeout_s=self.get_timeout_s, on_data=lambda o, f: None))

    def _heads(self, client) -> None:
        with self.lock:
            keys = self.rng.sample(list(self.stored), min(64, len(self.stored)))
        capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE_RANGES, namespace_id=NSID,
                                    skip_guard_check=True,
                                    ranges=[pb.ValueRange(key=k, offset=0, length=4096) for k in keys])
        self._track("heads", client.submit(capsule, timeout_s=self.get_timeout_s))

    def _delete(self, client) -> None:
        with self.lock:
            if not self.stored:
                self.window.release()
                return
            key, size = self.stored.popitem(last=False)
            self.stored_bytes -= size
        capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_DELETE, namespace_id=NSID, key=key)
        self._track("delete", client.submit(capsule))

    def _stored(self, key: bytes, size: int) -> None:
        with self.lock:
            self.stored[key] = size
            self.stored_bytes += size

    def _track(self, op: str, future, on_ok=None) -> None:
        start = time.monotonic()
        with self.lock:
            self.outstanding += 1

        def done(f) -> None:
            now = time.monotonic()
            took = now - start
            self.window.release()
            try:
                completion = f.result()
                error = None if completion.ok else st.status_name(completion.response.status_code_type,
                                                                  completion.response.status_code)
            except Exception as exc:  # noqa: BLE001 - every failure is counted by kind
                error, completion = type(exc).__name__, None
                self.nodes.report_failure(NODE, exc)  # a timeout reconnects, as the agent does
            with self.lock:
                self.outstanding -= 1
                if completion is not None:  # an answer, whatever its status, ends a silence
                    self.last_answer = now
                if error is None or error == "key does not exist":
                    self.took[op].append(took)
                    if took > self.slowest[0]:
                        self.slowest = (took, op)
                if error is not None:
                    self.failed[f"{op}: {error}"] += 1
            if error is None and on_ok is not None:
                on_ok()
        future.add_done_callback(done)

    def _fail(self, op: str, kind: str) -> None:
        with self.lock:
            self.failed[f"{op}: {kind}"] += 1

    def watch(self, now: float) -> None:
        """Called every 50 ms: the longest time with commands outstanding and no answer."""
        with self.lock:
            if not self.outstanding:
                self.last_answer = now
                return
            quiet = now - self.last_answer
            if quiet > self.silence[0]:
                self.silence = (quiet, self.last_answer - self.started)

    def summary(self) -> dict:
        with self.lock:
            ops = {op: {"count": len(t), "p50_ms": percentile(t, 50) * 1e3, "p99_ms": percentile(t, 99) * 1e3,
                        "max_ms": max(t) * 1e3} for op, t in sorted(self.took.items()) if t}
            return {"ops": ops, "failed": dict(self.failed), "slowest_s": self.slowest[0],
                    "slowest_op": self.slowest[1], "longest_silence_s": self.silence[0],
                    "silence_began_s": self.silence[1], "stored_mib": self.stored_bytes / MIB}


def soak(path: Path, args: argparse.Namespace) -> dict:
    nqns = [replica_nqns(i)[0] for i in range(2)]  # replica 0's and replica 1's agents
    node = start_storage(path, "soak", namespaces="key_value", namespace_size_bytes=8 << 30,
                         allowed_hosts='{"%s": "*", "%s": "*"}' % tuple(nqns))
    hosts: list[Host] = []
    try:
        address = node.addresses["fabric"]
        hosts = [Host(f"agent{i}", nqn, address, args, seed=i) for i, nqn in enumerate(nqns)]
        for host in hosts:
            host.nodes.start(connect_timeout_s=5.0)
        deadline = time.monotonic() + args.seconds
        threads = [threading.Thread(target=h.run, args=(deadline,), name=f"soak-{h.name}", daemon=True)
                   for h in hosts]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            for host in hosts:
                host.watch(now)
            time.sleep(0.05)
        settle = time.monotonic() + 10.0
        while any(h.outstanding for h in hosts) and time.monotonic() < settle:
            for host in hosts:
                host.watch(time.monotonic())
            time.sleep(0.05)
    finally:
        for host in hosts:
            host.nodes.close()
        node.signal(signal.SIGTERM)  # a clean stop: the node logs its longest command
        try:
            node.proc.wait(30)
        finally:
            node.stop()
    log = Path(node.log_path).read_text(errors="replace").splitlines() if Path(node.log_path).exists() else []
    stalls = [line for line in log if STALL_LINE.search(line)]
    longest = next((line for line in reversed(log) if "the longest command took" in line), "")
    match = re.search(r"the longest command took ([0-9.]+) s", longest)
    return {"hosts": {h.name: h.summary() for h in hosts},
            "node": {"stall_lines": len(stalls), "stalls": stalls[:40],
                     "longest_command_s": float(match.group(1)) if match else None,
                     "longest_command": longest.split("the longest command took", 1)[-1].strip() if longest else ""}}


def table(result: dict) -> str:
    got = result["results"].get("soak")
    if not got:
        return "soak failed (see failed)"
    head = ["host", "op", "count", "p50 ms", "p99 ms", "max ms"]
    rows = [[name, op, o["count"], o["p50_ms"], o["p99_ms"], o["max_ms"]]
            for name, h in got["hosts"].items() for op, o in h["ops"].items()]
    lines = [format_table(head, rows), ""]
    for name, h in got["hosts"].items():
        lines.append(f"{name}: longest silence {h['longest_silence_s']:.2f} s (from {h['silence_began_s']:.0f} s), "
                     f"slowest answered {h['slowest_s']:.2f} s ({h['slowest_op']}), failed {h['failed'] or 'none'}")
    node = got["node"]
    lines.append(f"node: longest command {node['longest_command'] or '?'}; {node['stall_lines']} stall lines logged")
    lines += [f"  {s}" for s in node["stalls"][:10]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    result = new_result("soak", {"seconds": args.seconds, "sizes": args.sizes, "window": args.window,
                                 "mib_per_s": args.mib_per_s, "working_set_mib": args.working_set_mib,
                                 "smoke": args.smoke})
    with data_dir(args, "soak") as path:
        got = run_part(result, "soak", lambda: soak(path, args))
    if got:
        result["results"]["soak"] = got
        hosts = got["hosts"].values()
        result["ratios"] = {"longest_silence_s": max(h["longest_silence_s"] for h in hosts),
                            "slowest_answered_s": max(h["slowest_s"] for h in hosts)}
        result["floors"] = floors(result["ratios"], {}, {"longest_silence_s": SILENCE_CEILING_S,
                                                         "slowest_answered_s": SLOWEST_CEILING_S})
    return result


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
