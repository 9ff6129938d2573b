"""`kvtb bench abuse`: the storage node's bounds before authentication and on one request, measured.

Each part runs a storage node process of its own, with the deployment's fabric security (auth,
bench.stack.start_storage), on loopback (issue 31, item 2 and 3):

- reconnect: the node is killed and started again (same port and data) --repeats times without and
  as many with a Connect flood: --connections connections from --flood-source (default 127.0.0.1,
  the agent's own address, issue 42: the node's budget per address is then the agent's too), each
  sending --flood-repeat unauthenticated Connects as the agent's host NQN, queued while the node is
  down and sent as it comes up, then --flood-rate Connects a second more among them until the flood
  is closed. The agent gets by on its first-message proof (`fabric.first_proof`). The agent is
  `fabric.nodes.StorageNodes` with the agent's settings; it notices the node gone by a store that times out, as the agent would. Measured: the time from the
  new node being ready to the agent storing again, and the node's memory (RSS) before the kill,
  its peak until the flood is closed (kept --hold-s after the node is ready, at least until the agent
  stores), and --after-s after that. Quiet and flooded runs alternate, so a flooded run's "before"
  is a node that was never flooded.
- frames: --frames unauthenticated frames of --frame-mib MiB each, from 127.0.0.3, one connection
  each; the node's RSS before and its peak, then an authenticated store.
- ranges: a --value-mib MiB value stored by an authenticated host, then one range read of --ranges
  one-byte ranges spread over it, the same count adjacent (merged into one), and the node's
  max_ranges spread: each one's status and time.

Targets (`floors`): the flooded reconnection's median within 2x the quiet one's and the node's
memory within 256 MiB of before, during both the flood and the frames; the spread read refused with
"invalid field" within a second; the adjacent read and the store after the frames served.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from bench.flood import FLOOD_SOURCE, FRAMES_SOURCE, ConnectFlood, RssWatch, send_frame, vm_rss_bytes
from bench.results import (
    add_common_args,
    data_dir,
    fail,
    floors,
    format_table,
    new_result,
    run_bench,
    run_part,
)
from bench.stack import bench_client, start_storage
from bench.stats import median, ratio
from fabric import status as st
from fabric.auth import FabricSecurity
from fabric.client import FabricError, StorageStatusError
from fabric.nodes import StorageNodes
from kvtb.launch import ServiceProcess, free_port
from smartnic.settings import SmartNicSettings
from storage_node.settings import StorageSettings

logger = logging.getLogger(__name__)

MIB = 1 << 20
NSID = 1           # the node's key-value namespace
NODE = "s0"        # the agent's name for the node
START_TIMEOUT_S = 60.0
PARTS = ("reconnect", "frames", "ranges")
FLOORS = {"frames_store_after_ok": 1.0, "ranges_spread_refused_invalid_field": 1.0,
          "ranges_adjacent_served": 1.0}
CEILINGS = {"reconnect_p50_flooded_vs_quiet": 2.0,   # issue 31's targets
            "flood_rss_growth_mib": 256.0,
            "frames_rss_growth_mib": 256.0,
            "ranges_spread_answer_s": 1.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench abuse", description=__doc__.splitlines()[0])
    add_common_args(parser, "abuse")
    parser.add_argument("--connections", type=int, default=1100,
                        help="the Connect flood's connections (default 1,100, issue 31's)")
    parser.add_argument("--flood-repeat", type=int, default=1,
                        help="Connects each connection queues while the node is down (default 1)")
    parser.add_argument("--flood-rate", type=float, default=2000.0,
                        help="Connects a second the flood goes on sending after those, until it is closed "
                             "(default 2,000: over the node's budget per address, 300 messages a second; 0: none)")
    parser.add_argument("--flood-source", default=FLOOD_SOURCE,
                        help=f"the flood's source address, 127.0.0.x (default {FLOOD_SOURCE}, the agent's own; "
                             "127.0.0.2: an address of the attacker's own)")
    parser.add_argument("--repeats", type=int, default=3, help="restarts without and with the flood, each (default 3)")
    parser.add_argument("--hold-s", type=float, default=3.0,
                        help="the flood stays open at least this long after the node is ready (default 3)")
    parser.add_argument("--after-s", type=float, default=3.0,
                        help="the node's memory is read this long after the flood closed (default 3)")
    parser.add_argument("--reconnect-timeout-s", type=float, default=120.0,
                        help="a restart whose agent is not storing again by then failed (default 120)")
    parser.add_argument("--frames", type=int, default=3, help="unauthenticated big frames (default 3)")
    parser.add_argument("--frame-mib", type=int, default=1024, help="each big frame's size (default 1024)")
    parser.add_argument("--frame-settle-s", type=float, default=4.0,
                        help="the node's memory is watched this long after each frame (default 4)")
    parser.add_argument("--value-mib", type=int, default=200, help="the value the range reads read (default 200)")
    parser.add_argument("--ranges", type=int, default=4096, help="one-byte ranges in a read (default 4,096)")
    parser.add_argument("--read-timeout-s", type=float, default=300.0,
                        help="the range reads' client timeout (default 300: an unbounded read is timed)")
    parser.add_argument("--parts", default="reconnect,frames,ranges",
                        help="which parts to run, comma-separated (default all three)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.connections, args.repeats = min(args.connections, 64), 1
        args.hold_s, args.after_s = min(args.hold_s, 0.5), min(args.after_s, 0.5)
        args.frame_mib, args.frame_settle_s = min(args.frame_mib, 64), min(args.frame_settle_s, 0.5)
        args.value_mib = min(args.value_mib, 8)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(unknown)}; one of {list(PARTS)}")
    if min(args.connections, args.flood_repeat, args.repeats, args.frames, args.ranges) < 1:
        parser.error("--connections, --flood-repeat, --repeats, --frames and --ranges must be at least 1")
    if args.flood_rate < 0:
        parser.error("--flood-rate must not be negative")
    if not args.flood_source.startswith("127."):
        parser.error("--flood-source: a loopback address (127.0.0.x)")
    if args.frame_mib << 20 <= StorageSettings().max_frame_bytes:
        parser.error(f"--frame-mib must be over the node's max_frame_bytes "
                     f"({StorageSettings().max_frame_bytes >> 20} MiB)")
    if (args.value_mib << 20) < args.ranges:
        parser.error("--value-mib must hold --ranges distinct bytes")
    return args


# -- the figures (pure) ------------------------------------------------------------------------------

def mib(num_bytes: float) -> float:
    return num_bytes / MIB


def reconnect_figures(runs: list[dict]) -> dict:
    """Quiet and flooded restarts: each kind's reconnection times and their median, and its memory."""
    out = {}
    for kind in ("quiet", "flooded"):
        mine = [r for r in runs if r["kind"] == kind]
        if not mine:
            continue
        times = [r["reconnect_s"] for r in mine]
        out[kind] = {"runs": len(mine), "reconnect_s": times, "reconnect_p50_s": median(times),
                     "gave_up": sum(r["gave_up"] for r in mine),
                     "rss_growth_max_bytes": max(rss_growth(r) for r in mine)}
    return out


def rss_growth(run: dict) -> int:
    """How far the node's memory rose over its figure before: its peak, or later, whichever is higher."""
    return max(run["rss_peak_bytes"], run["rss_after_bytes"]) - run["rss_before_bytes"]


def add_ratios(result: dict) -> None:
    """The targets' figures from the parts that ran, and the floors and ceilings on them."""
    r, ratios = result["results"], result["ratios"]
    summary = r.get("reconnect", {}).get("summary", {})
    if "quiet" in summary and "flooded" in summary:
        ratios["reconnect_p50_flooded_vs_quiet"] = ratio(summary["flooded"]["reconnect_p50_s"],
                                                         summary["quiet"]["reconnect_p50_s"])
        ratios["reconnect_p50_flooded_minus_quiet_s"] = (summary["flooded"]["reconnect_p50_s"]
                                                         - summary["quiet"]["reconnect_p50_s"])
        ratios["flood_rss_growth_mib"] = mib(summary["flooded"]["rss_growth_max_bytes"])
    frames = r.get("frames")
    if frames:
        ratios["frames_rss_growth_mib"] = mib(max(frames["rss_peak_bytes"], frames["rss_after_bytes"])
                                              - frames["rss_before_bytes"])
        ratios["frames_store_after_ok"] = 1.0 if frames["store_after"]["status"] == "success" else 0.0
    reads = (r.get("ranges") or {}).get("reads", {})
    if "spread" in reads:
        ratios["ranges_spread_refused_invalid_field"] = 1.0 if reads["spread"]["status"] == "invalid field" else 0.0
        ratios["ranges_spread_answer_s"] = reads["spread"]["seconds"]
    if "adjacent" in reads:
        ratios["ranges_adjacent_served"] = 1.0 if reads["adjacent"]["status"] == "success" else 0.0
    result["floors"] = floors(ratios, FLOORS, CEILINGS)


def spread_ranges(key: bytes, value_bytes: int, count: int) -> list[tuple[bytes, int, int]]:
    """count one-byte ranges evenly spread over a value (none adjacent when it holds 2 * count bytes)."""
    step = value_bytes // count
    return [(key, i * step, 1) for i in range(count)]


def adjacent_ranges(key: bytes, count: int) -> list[tuple[bytes, int, int]]:
    """count one-byte ranges side by side from the value's start (one range once merged)."""
    return [(key, i, 1) for i in range(count)]


# -- the node and the agent --------------------------------------------------------------------------

@contextlib.contextmanager
def storage_node(directory: Path, name: str, **settings: object):
    """A storage node process (start_storage), always stopped at the end."""
    proc = start_storage(directory, name, **settings)
    try:
        yield proc
    finally:
        proc.stop()


def node_pid(proc: ServiceProcess) -> int | None:
    return proc.proc.pid if proc.proc is not None else None


def agent_nodes(address: str) -> StorageNodes:
    """The agent's connections to the node, as the agent's settings make them (smartnic.data_plane)."""
    agent = SmartNicSettings()
    return StorageNodes([(NODE, address)], agent.host_nqn, agent.queue_depth, agent.fabric_timeout_s,
                        agent.reconnect_interval_s,
                        security=FabricSecurity.for_host(agent.fabric_security, agent.credentials_dir,
                                                         agent.host_nqn))


def agent_store(nodes: StorageNodes) -> bool:
    """One store by the agent; a failure is reported to it, as its data path does."""
    client = nodes.client(NODE)
    if client is None:
        return False
    try:
        client.store(NSID, b"abuse-probe", [b"v"])
        return True
    except (FabricError, TimeoutError) as exc:
        nodes.report_failure(NODE, exc)
        return False


def until_storing(nodes: StorageNodes, timeout_s: float) -> float | None:
    """Seconds until the agent stores again, or None after timeout_s."""
    began = time.monotonic()
    while not agent_store(nodes):
        if time.monotonic() - began > timeout_s:
            return None
        time.sleep(0.05)
    return time.monotonic() - began


def restart_run(proc: ServiceProcess, nodes: StorageNodes, args: argparse.Namespace, flooded: bool) -> dict:
    """Kill the node, flood it or not while it is down, start it again; the agent's reconnection and
    the node's memory."""
    address = proc.addresses["fabric"]
    before = vm_rss_bytes(proc.proc.pid)
    proc.kill()
    flood = ConnectFlood(address, SmartNicSettings().host_nqn, args.connections, args.flood_source,
                         args.flood_repeat, args.flood_rate) if flooded else None
    try:
        with RssWatch(lambda: node_pid(proc)) as watch:
            agent_store(nodes)  # fails after the agent's timeout: it notices the node gone
            proc.start(timeout_s=START_TIMEOUT_S)
            ready = time.monotonic()
            reconnect_s = until_storing(nodes, args.reconnect_timeout_s)
            time.sleep(max(0.0, ready + args.hold_s - time.monotonic()))
            answered = flood.answered() if flood else 0
    finally:
        if flood is not None:
            flood.close()
    time.sleep(args.after_s)
    return {"kind": "flooded" if flooded else "quiet", "gave_up": reconnect_s is None,
            "reconnect_s": args.reconnect_timeout_s if reconnect_s is None else reconnect_s,
            "rss_before_bytes": before, "rss_peak_bytes": watch.peak,
            "rss_after_bytes": vm_rss_bytes(proc.proc.pid), "flood_answered": answered,
            "flood_sent": flood.sent if flood else 0}


def measure_reconnect(directory: Path, args: argparse.Namespace, result: dict) -> dict:
    """Quiet and flooded restarts, alternating, of one node (fixed port and data)."""
    port = free_port()
    runs = []
    with storage_node(directory, "reconnect", fabric_address=f"tcp://127.0.0.1:{port}") as proc:
        nodes = agent_nodes(proc.addresses["fabric"])
        try:
            nodes.start()
            if until_storing(nodes, START_TIMEOUT_S) is None:
                raise RuntimeError("the agent never stored on the node")
            for i in range(args.repeats):
                for flooded in (False, True):
                    run = restart_run(proc, nodes, args, flooded)
                    runs.append(run)
                    if run["gave_up"]:
                        fail(result, f"reconnect {run['kind']} run {i + 1}",
                             TimeoutError(f"the agent not storing after {args.reconnect_timeout_s:.0f} s"))
        finally:
            nodes.close()
    return {"runs": runs, "summary": reconnect_figures(runs)}


def measure_frames(directory: Path, args: argparse.Namespace) -> dict:
    """Big unauthenticated frames: the node's memory, and an authenticated store after them."""
    with storage_node(directory, "frames") as proc:
        pid, address = proc.proc.pid, proc.addresses["fabric"]
        before = vm_rss_bytes(pid)
        frame = bytearray(args.frame_mib * MIB)
        socks, after_each = [], []
        try:
            with RssWatch(lambda: pid) as watch:
                for _ in range(args.frames):
                    socks.append(send_frame(address, frame, FRAMES_SOURCE))
                    time.sleep(args.frame_settle_s)
                    after_each.append(vm_rss_bytes(pid))
        finally:
            for sock in socks:
                sock.close(linger=0)
        del frame
        after = vm_rss_bytes(pid)
        client = bench_client(address)
        try:
            began = time.monotonic()
            client.connect()
            store = timed(lambda: client.store(NSID, b"after-frames", [b"v"]), began)
        finally:
            client.close()
        return {"frames": args.frames, "frame_bytes": args.frame_mib * MIB, "rss_before_bytes": before,
                "rss_peak_bytes": watch.peak, "rss_after_each_bytes": after_each, "rss_after_bytes": after,
                "store_after": store, "node_alive": proc.alive()}


def timed(fn, began: float | None = None) -> dict:
    """fn()'s status ("success", the NVMe status's name, or the error) and seconds (from began)."""
    began = time.monotonic() if began is None else began
    try:
        done = fn()
        status, nbytes = "success", sum(memoryview(f.buffer).nbytes for f in getattr(done, "frames", []))
    except StorageStatusError as exc:
        status, nbytes = st.status_name(exc.sct, exc.sc), 0
    except (FabricError, TimeoutError) as exc:
        status, nbytes = f"{type(exc).__name__}: {exc}", 0
    return {"status": status, "seconds": time.monotonic() - began, "bytes": nbytes}


def measure_ranges(directory: Path, args: argparse.Namespace) -> dict:
    """A big value stored, then range reads over it: spread, adjacent, and spread at the node's cap."""
    value_bytes = args.value_mib * MIB
    cap = StorageSettings().max_ranges
    with storage_node(directory, "ranges", namespace_size_bytes=max(1 << 30, 2 * value_bytes)) as proc:
        client = bench_client(proc.addresses["fabric"], timeout_s=args.read_timeout_s)
        try:
            client.connect()
            value = np.random.default_rng(1).bytes(value_bytes)
            store = timed(lambda v=value: client.store(NSID, b"big", [v]))
            del value
            if store["status"] != "success":
                raise RuntimeError(f"the {args.value_mib} MiB value was not stored: {store['status']}")
            reads = {"spread": spread_ranges(b"big", value_bytes, args.ranges),
                     "adjacent": adjacent_ranges(b"big", args.ranges),
                     "spread_at_cap": spread_ranges(b"big", value_bytes, min(cap, args.ranges))}
            out = {name: {"ranges": len(ranges), **timed(lambda r=ranges: client.retrieve_ranges(NSID, r))}
                   for name, ranges in reads.items()}
        finally:
            client.close()
        return {"value_bytes": value_bytes, "store": store, "max_ranges": cap, "reads": out,
                "node_alive": proc.alive()}


def bench_settings(args: argparse.Namespace) -> dict:
    """The run's settings for its result: its options, the attackers' addresses, the node's bounds."""
    settings = {k: getattr(args, k) for k in (
        "connections", "flood_repeat", "flood_rate", "repeats", "hold_s", "after_s", "reconnect_timeout_s",
        "frames", "frame_mib", "frame_settle_s", "value_mib", "ranges", "parts", "smoke")}
    settings["flood_source"], settings["frames_source"] = args.flood_source, FRAMES_SOURCE
    settings["node"] = {k: getattr(StorageSettings(), k) for k in (
        "fabric_security", "max_frame_bytes", "max_half_open", "max_half_open_per_peer",
        "handshakes_per_s_per_peer", "handshake_timeout_s", "max_ranges")}
    return settings


def run(args: argparse.Namespace) -> dict:
    result = new_result("abuse", bench_settings(args))
    with data_dir(args, "abuse") as directory:
        parts = {"reconnect": lambda: measure_reconnect(directory, args, result),
                 "frames": lambda: measure_frames(directory, args),
                 "ranges": lambda: measure_ranges(directory, args)}
        for name in args.parts:
            figures = run_part(result, name, parts[name])
            if figures is not None:
                result["results"][name] = figures
    add_ratios(result)
    return result


# -- text ----------------------------------------------------------------------------------------------

def reconnect_text(result: dict) -> str:
    s, part = result["settings"], result["results"].get("reconnect")
    if not part:
        return ""
    head = ["restart", "agent storing again (s)", "RSS before (MiB)", "peak (MiB)",
            f"{s['after_s']:g} s after (MiB)", "flood sent", "flood answered"]
    flooded = [r["kind"] == "flooded" for r in part["runs"]]
    rows = [[r["kind"], f"{r['reconnect_s']:.2f}" + (" (gave up)" if r["gave_up"] else ""),
             f"{mib(r['rss_before_bytes']):.0f}", f"{mib(r['rss_peak_bytes']):.0f}",
             f"{mib(r['rss_after_bytes']):.0f}", r.get("flood_sent", "?") if f else "-",
             r["flood_answered"] if f else "-"]
            for r, f in zip(part["runs"], flooded)]
    medians = ", ".join(f"{kind} {f['reconnect_p50_s']:.2f} s" for kind, f in part["summary"].items())
    steady = f", then {s['flood_rate']:g} a second more" if s.get("flood_rate") else ""
    return (f"reconnect: the node killed and started again; flooded: {s['connections']} connections from "
            f"{s['flood_source']} sending {s['flood_repeat']} unauthenticated Connect(s) each{steady}\n"
            f"{format_table(head, rows)}\nmedians: {medians}")


def frames_text(result: dict) -> str:
    f = result["results"].get("frames")
    if not f:
        return ""
    store = f["store_after"]
    return (f"frames: {f['frames']} unauthenticated frames of {mib(f['frame_bytes']):.0f} MiB from "
            f"{result['settings']['frames_source']}: node RSS before {mib(f['rss_before_bytes']):.0f} MiB, "
            f"peak {mib(f['rss_peak_bytes']):.0f} MiB, after {mib(f['rss_after_bytes']):.0f} MiB; "
            f"an authenticated connect and store after: {store['status']} in {store['seconds']:.3f} s")


def ranges_text(result: dict) -> str:
    r = result["results"].get("ranges")
    if not r:
        return ""
    labels = {"spread": "one-byte, spread", "adjacent": "one-byte, adjacent",
              "spread_at_cap": "one-byte, spread (the node's max_ranges)"}
    rows = [[labels[name], read["ranges"], read["status"], f"{read['seconds']:.3f}", read["bytes"]]
            for name, read in r["reads"].items()]
    return (f"ranges: one read over a {mib(r['value_bytes']):.0f} MiB value (stored in "
            f"{r['store']['seconds']:.2f} s)\n"
            f"{format_table(['read', 'ranges', 'status', 'time (s)', 'bytes'], rows)}")


def floors_text(result: dict) -> str:
    rows = [[name, f"{f['value']:.3g}", f"{'>=' if 'floor' in f else '<='} {f.get('floor', f.get('ceiling')):g}",
             "met" if f["met"] else "NOT MET"] for name, f in (result.get("floors") or {}).items()]
    return format_table(["target", "value", "bound", ""], rows) if rows else ""


def table(result: dict) -> str:
    blocks = [reconnect_text(result), frames_text(result), ranges_text(result), floors_text(result)]
    return "\n\n".join(b for b in blocks if b)


def main(argv: list[str]) -> int:
    return run_bench(argv, parse_args, run, table)
