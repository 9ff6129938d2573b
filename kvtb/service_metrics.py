"""The metric families of the agent, the compute node and a storage node, read from their stats.

Each function takes the plain snapshot a service already keeps (the same figures its Stats
RPC returns) and yields Prometheus families: counts are never kept twice. Pure.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from kvtb.metrics import counter, gauge


def agent_families(s: Mapping) -> Iterable:
    """The SmartNIC agent: lookups, triggered operations, evictions, the fabric, its hashmap."""
    yield counter("kv_lookup_requested_tokens_total", "Prompt tokens the agent looked up KV for.",
                  s.get("lookup_requested_tokens", 0))
    yield counter("kv_lookup_hit_tokens_total", "Tokens whose stored KV covered a looked-up prompt.",
                  s.get("lookup_hit_tokens", 0))
    yield counter("kv_lookups_total", "Turns whose stored prefix lookup found blocks (hit) or none (miss).",
                  {"hit": s.get("hits", 0), "miss": s.get("misses", 0)}, ("result",))
    yield counter("kv_evictions_total", "Stored KV blocks deleted, by reason.",
                  s.get("evictions_by_reason", {}), ("reason",))
    yield counter("triggered_ops_fired_total", "Triggered operations fired.", s.get("triggered_fired", 0))
    yield gauge("triggered_ops_queued", "Triggered operations waiting for their threshold.",
                s.get("queue_depth", 0))
    yield counter("triggered_op_errors_total", "Triggered operations that completed with an error.",
                  s.get("errors_by_kind", {}), ("kind",))
    yield counter("fabric_put_bytes_total", "KV bytes the agent stored on the storage nodes.",
                  s.get("bytes_put", 0))
    yield counter("fabric_get_bytes_total", "KV bytes the agent fetched from the storage nodes.",
                  s.get("bytes_got", 0))
    yield counter("kv_prefetches_total", "Restores started by the agent on a follow-up (step 5).",
                  s.get("prefetches", 0))
    yield counter("kv_puts_skipped_total", "Blocks not stored: first seen under admission on_reuse.",
                  s.get("puts_skipped", 0))
    yield counter("kv_discovery_requests_total", "Storage nodes asked for blocks the agent's index lacked "
                  "(the miss path: another replica may have stored them).", s.get("discovery_requests", 0))
    yield counter("kv_discovered_blocks_total", "Blocks the miss path found on the storage nodes.",
                  s.get("discovered_blocks", 0))
    yield counter("kv_discovery_timeouts_total", "Miss-path requests a node did not answer in time.",
                  s.get("discovery_timeouts", 0))
    yield counter("kv_deletes_refused_leased_total", "Evictions a storage node refused: another agent had "
                  "the block leased (it stays indexed and is evicted later).", s.get("deletes_refused_leased", 0))
    yield counter("requests_denied_total", "Turns the match-action table refused.", s.get("denied", 0))
    yield gauge("kv_stored_bytes", "KV bytes in the agent's hashmap, by storage node.",
                s.get("bytes_by_storage_node", {}), ("storage_node",))
    yield gauge("kv_stored_contexts", "Contexts with stored KV.", s.get("contexts", 0))
    yield gauge("kv_stored_chunks", "Stored KV chunks.", s.get("chunks", 0))
    yield counter("agent_rpc_calls_total", "gRPC calls the agent served, by method and the caller's identity.",
                  s.get("rpc_calls", {}), ("method", "peer"))
    yield gauge("relayed_turns", "Turns the agent relays to its compute node now (none holds a thread).",
                s.get("relayed_turns", 0))
    yield gauge("relayed_turns_peak", "The most turns relayed at once since start.", s.get("relayed_turns_peak", 0))
    yield counter("relayed_turns_refused_total", "Turns refused past max_relayed_turns.",
                  s.get("relayed_turns_refused", 0))


def compute_families(s: Mapping) -> Iterable:
    """The compute node: the batch and the pool (vLLM's names and meanings), turns by KV source,
    fallbacks, bytes restored and offloaded."""
    yield gauge("num_requests_running", "Sequences in the running batch.", s.get("num_requests_running", 0))
    yield gauge("num_requests_waiting", "Sequences waiting for the batch (restoring ones included).",
                s.get("num_requests_waiting", 0))
    yield gauge("num_requests_restoring", "Sequences whose KV is being restored, outside the batch.",
                s.get("num_requests_restoring", 0))
    yield gauge("kv_cache_usage_perc", "Fraction of the pool's blocks in use (held or pinned by I/O).",
                s.get("kv_cache_usage_perc", 0.0))
    yield counter("num_preemptions_total", "Sequences preempted when blocks ran out, by kind.",
                  s.get("preemptions", {}), ("kind",))
    yield counter("num_preempted_tokens_total", "KV tokens those preemptions gave up, by kind.",
                  s.get("preempted_tokens", {}), ("kind",))
    yield counter("preemption_seconds_total", "The engine's own time in preemption work, by kind: recompute "
                  "(forward time on tokens computed again), swap_out and swap_in (copies), swap_wait (swapped "
                  "sequences waiting for their blocks from storage, summed).",
                  {"recompute": s.get("preempt_recompute_s", 0.0), "swap_out": s.get("preempt_swap_out_s", 0.0),
                   "swap_in": s.get("preempt_swap_in_s", 0.0), "swap_wait": s.get("preempt_swap_wait_s", 0.0)},
                  ("kind",))
    yield counter("preemption_recomputed_tokens_total", "Tokens computed again after a recompute preemption.",
                  s.get("preempt_recompute_tokens", 0))
    yield counter("swap_host_bytes_total", "KV bytes copied to and from the host swap tier (preemption swap-host).",
                  {"out": s.get("swap_host_bytes_out", 0), "in": s.get("swap_host_bytes_in", 0)}, ("direction",))
    yield counter("swap_host_fallbacks_total", "Swap-host preemptions that fell back to recompute.",
                  s.get("swap_host_fallbacks", 0))
    yield counter("prefix_cache_queries_total", "Prompt tokens looked up in the pool's prefix cache.",
                  s.get("prefix_cache_queries", 0))
    yield counter("prefix_cache_hits_total", "Prompt tokens found in the pool's prefix cache.",
                  s.get("prefix_cache_hits", 0))
    yield counter("turns_total", "Turns the compute node ran, by where their KV came from.",
                  s.get("kv_source", {}), ("kv_source",))
    yield counter("fallbacks_total", "Turns that fell back to recomputing, by reason.",
                  s.get("fallbacks", {}), ("reason",))
    yield counter("engine_steps_failed_total", "Engine steps that raised (their turns failed INTERNAL; the node "
                  "went on serving).", s.get("steps_failed", 0))
    yield counter("puts_timed_out_total", "Offload PUTs a turn stopped waiting for (drain_timeout_s).",
                  s.get("puts_timed_out", 0))
    yield gauge("blocks_quarantined", "Pool blocks kept out of use while a timed-out PUT may still read them.",
                s.get("blocks_quarantined", 0))
    yield counter("kv_restore_bytes_total", "KV bytes restored into the pool (steps 6-7).",
                  s.get("bytes_restored", 0))
    yield counter("kv_offload_bytes_total", "KV bytes offloaded from the pool (steps 2, 4, 8).",
                  s.get("bytes_offloaded", 0))
    yield counter("prompt_tokens_prefilled_total", "Prompt tokens computed by prefill.",
                  s.get("tokens_prefilled", 0))
    yield counter("prompt_tokens_reused_total", "Prompt tokens whose KV was reused.",
                  s.get("tokens_reused", 0))
    yield counter("output_tokens_total", "Tokens generated.", s.get("tokens_out", 0))


def storage_families(s: Mapping, namespaces: Iterable[tuple[int, int, int]]) -> Iterable:
    """A storage node: commands by opcode and status, bytes, and (nsid, used bytes, keys) per namespace."""
    yield counter("storage_commands_total", "Commands completed, by opcode and NVMe status.",
                  s.get("commands", {}), ("opcode", "status"))
    yield counter("storage_bytes_written_total", "Value bytes written.", s.get("bytes_written", 0))
    yield counter("storage_bytes_read_total", "Value bytes read.", s.get("bytes_read", 0))
    rows = list(namespaces)
    yield gauge("storage_bytes_used", "Bytes allocated in each namespace.",
                {str(nsid): used for nsid, used, _ in rows}, ("nsid",))
    yield gauge("storage_keys", "Keys in each namespace.", {str(nsid): keys for nsid, _, keys in rows},
                ("nsid",))
