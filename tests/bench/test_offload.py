"""`kvtb bench offload`'s options and readable output (its run is in test_smoke.py)."""
from __future__ import annotations

from bench.offload import BLOCK_TOKENS, parse_args, table


def test_the_block_sizes_default_to_the_sweep_and_smoke_is_tiny():
    assert parse_args([]).block_tokens == list(BLOCK_TOKENS)
    smoke = parse_args(["--smoke"])
    assert smoke.block_tokens == [8] and smoke.decode_tokens <= 12 and smoke.repeats == 1
    assert parse_args(["--block-tokens", "32", "--decode-tokens", "256"]).block_tokens == [32]


def test_table_shows_every_block_size_policy_and_ratio():
    decode = {"prompt_tokens": 43, **{p: {"tbt_ms": t, "stall_per_block_ms": s, "blocks_per_turn": 10.0}
                                      for p, t, s in (("resident", 70.0, 0.0), ("triggered", 71.0, 0.5),
                                                      ("cpu", 90.0, 12.0))}}
    result = {"settings": {"decode_tokens": 256}, "results": {"blocks": {"8": decode, "32": decode}},
              "ratios": {"cpu_stall_vs_triggered_32": 24.0},
              "floors": {"cpu_stall_vs_triggered_32": {"floor": 100.0, "value": 24.0, "met": False},
                         "triggered_stall_us_32": {"ceiling": 20.0, "value": 12.5, "met": True}}}
    lines = table(result).splitlines()
    assert lines[0] == "decode of 256 tokens"
    assert lines[3].split() == ["8", "70.00", "71.00", "90.00", "500.0", "12000.0"]
    assert lines[4].split()[0] == "32" and lines[-3].split() == ["cpu_stall_vs_triggered_32", "24"]
    assert lines[-2:] == ["cpu_stall_vs_triggered_32 >= 100: 24 (NOT met)", "triggered_stall_us_32 <= 20: 12.5 (met)"]
