"""`kvtb bench offload`'s readable output."""
from __future__ import annotations

from compute_node.bench import render


def test_render_shows_every_policy_and_the_ratios():
    result = {
        "settings": {"decode_tokens": 256, "chunk_tokens": 32},
        "results": {"decode": {"prompt_tokens": 43,
                               **{p: {"tbt_ms": 70.0, "stall_per_chunk_ms": s, "chunks_per_turn": 10.0}
                                  for p, s in (("resident", 0.0), ("triggered", 0.5), ("cpu", 12.0))}},
                    "follow_up": {"context_tokens": 2048,
                                  **{p: {"ttft_ms": t, "kv_source": k, "tokens_prefilled": 17,
                                         "tokens_reused": r}
                                     for p, t, k, r in (("triggered", 300.0, "restored", 2030),
                                                        ("resident", 250.0, "resident", 2030),
                                                        ("recompute", 7000.0, "recomputed", 0))}}},
        "ratios": {"triggered_tbt_vs_resident": 1.01, "cpu_stall_vs_triggered": 24.0}}
    text = render(result)
    for word in ("resident", "triggered", "cpu", "recompute", "cpu_stall_vs_triggered 24", "2048 tokens"):
        assert word in text
