"""Text the CLI prints: a turn's one-line summary, its steps as a timeline, system stats. Pure."""
from __future__ import annotations

from typing import Any


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def summary_line(record: dict[str, Any]) -> str:
    """One line with the turn's figures (from summary_to_dict)."""
    parts = [f"turn {record['turn']}", f"kv_source: {record['kv_source']}"]
    if record.get("replica"):  # several replicas: which one, and where its KV came from
        served = f"on {record['replica']} (kv {record.get('kv_origin') or '?'})"
        if record.get("retried_from"):
            served += f", retried from {record['retried_from']}"
        parts.append(served)
    if record["fallback_reason"]:
        parts.append(f"fallback: {record['fallback_reason']}")
    parts += [f"prefilled {record['tokens_prefilled']}", f"reused {record['tokens_reused']}",
              f"out {record['tokens_out']}", f"ttft {record['ttft_ms']:.0f} ms",
              f"tbt {record['tbt_ms']:.1f} ms", f"e2e {record['e2e_ms']:.0f} ms",
              f"gateway {record['gateway_ms']:.0f} ms"]
    if record["bytes_restored"]:
        parts.append(f"restored {human_bytes(record['bytes_restored'])}")
    if record["bytes_offloaded"]:
        parts.append(f"offloaded {human_bytes(record['bytes_offloaded'])}")
    return "[" + " · ".join(parts) + "]"


def timeline(record: dict[str, Any], width: int = 40) -> list[str]:
    """The turn's steps as bars on one time axis from the turn's start (ms)."""
    steps = record["steps"]
    if not steps:
        return ["  (no steps reported)"]
    span = max([record["e2e_ms"], *(s["end_ms"] for s in steps)]) or 1.0
    name_width = max(len(s["name"]) for s in steps)
    lines = [f"  {'':>2} {'step':<{name_width}} |0 ms{'':<{width - 4 - len(f'{span:.0f} ms')}}"
             f"{span:.0f} ms|"]
    for s in steps:
        lines.append(f"  {s['step']:>2} {s['name']:<{name_width}} |{_bar(s, span, width)}| "
                     f"{_span_text(s)}")
    return lines


def _bar(step: dict[str, Any], span: float, width: int) -> str:
    start = max(0.0, step["start_ms"])
    first = min(width - 1, int(start / span * width))
    last = max(first, min(width - 1, int(max(step["end_ms"], 0.0) / span * width - 1e-9)))
    cells = [" "] * width
    for i in range(first, last + 1):
        cells[i] = "█"
    if step["start_ms"] < 0:
        cells[0] = "◂"  # began before this turn (e.g. step 1 at the compute node's start)
    return "".join(cells)


def _span_text(step: dict[str, Any]) -> str:
    start, end = step["start_ms"], step["end_ms"]
    if end <= 0 and start < 0:  # wholly before the turn: how long it took and how long ago
        text = f"{end - start:8.1f} ms, {-start / 1000:.1f} s before the turn"
    else:
        text = f"{start:8.1f} – {end:8.1f} ms" + (" (began before the turn)" if start < 0 else "")
    if step["bytes"]:
        text += f"  {human_bytes(step['bytes'])}"
    return text


def stats_lines(stats: dict[str, Any]) -> list[str]:
    """The system's figures as a short report (kvtb stats, /stats); with several replicas, each one's."""
    fe = stats.get("frontend", {})
    lines = [f"frontend: {fe.get('turns_completed', 0)} turns since start, {fe.get('turns', 0)} turns in "
             f"{fe.get('contexts', 0)} contexts stored, "
             f"{fe.get('turns_active', 0)} active, {fe.get('turns_waiting', 0)} waiting, "
             f"{fe.get('rejected_busy', 0)} rejected busy"]
    replicas = stats.get("replicas")
    if replicas:
        for name, replica in sorted(replicas.items()):
            state = "in the rotation" if replica.get("up") else "OUT of the rotation"
            lines.append(f"{name} ({replica.get('address', '')}): {state}")
            lines += [f"  {line}" for line in _agent_lines(replica.get("agent", {}))]
            lines.append(f"  {_compute_line(replica.get('compute', {}))}")
    else:
        lines += _agent_lines(stats.get("agent", {}))
        lines.append(_compute_line(stats.get("compute", {})))
    for node in stats.get("storage", []):
        if "error" in node:
            lines.append(f"storage {node.get('address')}: unreachable ({node['error']})")
            continue
        used = sum(int(ns.get("used_bytes", 0)) for ns in node.get("namespaces", []))
        keys = sum(int(ns.get("key_count", 0)) for ns in node.get("namespaces", []))
        lines.append(f"storage {node.get('address')}: {keys} keys, {human_bytes(used)} used, "
                     f"written {human_bytes(int(node.get('bytes_written', 0)))}, read "
                     f"{human_bytes(int(node.get('bytes_read', 0)))}, commands "
                     f"{node.get('commands_completed', 0)}, fsyncs {node.get('fsyncs', 0)}")
    return lines


def _agent_lines(agent: dict[str, Any]) -> list[str]:
    if "error" in agent:
        return [f"agent {agent.get('address', '')}: unreachable ({agent['error']})"]
    evictions = agent.get("evictions_by_reason") or {}
    lines = [
        f"agent {agent.get('address', '')}: hits {agent.get('hits', 0)}, misses "
        f"{agent.get('misses', 0)}, prefetches {agent.get('prefetches', 0)}, evictions "
        f"{sum(int(v) for v in evictions.values())} {_pairs(evictions)}, "
        f"denied {agent.get('denied', 0)}, put {human_bytes(int(agent.get('bytes_put', 0)))}, "
        f"got {human_bytes(int(agent.get('bytes_got', 0)))}, "
        f"stored {human_bytes(int(agent.get('bytes_stored', 0)))} "
        f"in {agent.get('contexts', 0)} contexts / "
        f"{agent.get('chunks', 0)} chunks, triggered ops fired {agent.get('triggered_fired', 0)} "
        f"(p50 {float(agent.get('trigger_to_fire_p50_us', 0)):.0f} µs, "
        f"p99 {float(agent.get('trigger_to_fire_p99_us', 0)):.0f} µs)"]
    for node, n in sorted((agent.get("bytes_by_storage_node") or {}).items()):
        lines.append(f"  bytes on {node}: {human_bytes(int(n))}")
    return lines


def _compute_line(compute: dict[str, Any]) -> str:
    if "error" in compute:
        return f"compute: unreachable ({compute['error']})"
    return (f"compute: {compute.get('turns', 0)} turns, "
            f"kv sources {_pairs(compute.get('kv_source_counts'))}, "
            f"fallbacks {_pairs(compute.get('fallbacks_by_reason'))}, running "
            f"{compute.get('num_requests_running', 0)}, waiting {compute.get('num_requests_waiting', 0)}, "
            f"KV blocks in use {float(compute.get('kv_cache_usage_perc', 0)):.0%}, preemptions "
            f"{_pairs(compute.get('preemptions'))}, restored "
            f"{human_bytes(int(compute.get('bytes_restored', 0)))}, offloaded "
            f"{human_bytes(int(compute.get('bytes_offloaded', 0)))}")


def _pairs(mapping: dict | None) -> str:
    if not mapping:
        return "{}"
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(mapping.items())) + "}"
