"""`kvtb bench offload`'s options, its sampling (warm-up, order, failed stores) and readable output
(its run is in test_smoke.py)."""
from __future__ import annotations

import pytest

import types

from bench import offload
from bench.offload import BLOCK_TOKENS, POLICIES, parse_args, table
from kvtb_proto import compute_pb2

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_the_block_sizes_default_to_the_sweep_and_smoke_is_tiny():
    assert parse_args([]).block_tokens == list(BLOCK_TOKENS)
    smoke = parse_args(["--smoke"])
    assert smoke.block_tokens == [8] and smoke.decode_tokens <= 12 and smoke.repeats == 1
    assert parse_args(["--block-tokens", "32", "--decode-tokens", "256"]).block_tokens == [32]


def test_a_sample_holds_more_blocks_than_one_short_turn():
    assert parse_args([]).decode_tokens >= 256
    assert offload.turns_per_sample(20, 256, 8) == 1          # 34 blocks in one turn
    assert offload.turns_per_sample(20, 256, 32) == 2         # 8 blocks a turn: two for 16
    assert offload.turns_per_sample(20, 256, 128) == 3        # 2 a turn: at most 3 turns
    assert offload.turns_per_sample(5, 2, 128) == 3           # no full block at all


def test_the_policy_order_rotates_so_each_goes_first():
    firsts = {offload.policy_order(r)[0] for r in range(3)}
    assert firsts == set(POLICIES)
    assert all(sorted(offload.policy_order(r)) == sorted(POLICIES) for r in range(5))


def test_failed_stores_add_no_block_and_are_counted_not_averaged_in():
    samples = [{"turns": 2, "tbt_ms": 70.0, "stall_ms": 10.0, "blocks": 20, "failed_stores": 0},
               {"turns": 2, "tbt_ms": 72.0, "stall_ms": 500.0, "blocks": 18, "failed_stores": 2},
               {"turns": 2, "tbt_ms": 71.0, "stall_ms": 14.0, "blocks": 20, "failed_stores": 0}]
    f = offload.sample_figures(samples)
    assert f["stall_per_block_ms"] == 24.0 / 40  # per stored block, the sample with failures left out
    assert f["failed_stores"] == 2 and f["samples_with_failed_stores"] == 1
    assert f["blocks_per_sample"] == 58 / 3 and f["blocks_per_turn"] == 58 / 6


class FakeStub:
    """EncodeChat and Generate as the agent serves them: every turn's policy recorded; a turn under
    an offloading policy stores (prompt + tokens) // block blocks, the first `cpu` one slowly."""

    def __init__(self, block: int):
        self.block, self.turns = block, []

    def EncodeChat(self, request, timeout):  # noqa: N802 - gRPC's name
        return types.SimpleNamespace(token_ids=list(range(20)))

    def Generate(self, request, timeout):  # noqa: N802
        policy = request.policy
        tokens = len(request.token_ids) + request.max_new_tokens
        blocks = 0 if policy == "resident" else tokens // self.block
        first_cpu = policy == "cpu" and not any(p == "cpu" for p, _ in self.turns)
        self.turns.append((policy, blocks))
        for i in range(request.max_new_tokens):
            yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=i))
        stall = 0.01 * blocks + (1000.0 if first_cpu else 0.0)  # the handshake of the first cpu block
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            tbt_ms=70.0, offload_stall_ms=stall, offload_stall_cpu_ms=0.004 * blocks, chunks_offloaded=blocks))


def test_every_policy_is_warmed_up_with_a_block_before_the_clock_runs():
    stub = FakeStub(block=32)
    d = offload.measure_decode(stub, 32, decode_tokens=40, repeats=3, turns=1)
    warm = stub.turns[:3]
    assert [p for p, _ in warm] == list(POLICIES)
    assert all(blocks >= 1 for p, blocks in warm if p != "resident")  # the connection is made here
    assert d["cpu"]["stall_per_block_ms"] < 1.0  # the handshake's second stays in the warm-up
    assert d["triggered"]["stall_cpu_per_block_ms"] == pytest.approx(0.004)  # the engine thread's CPU, apart
    assert [o[0] for o in d["order"]] == ["resident", "triggered", "cpu"]


def test_table_shows_every_block_size_policy_failure_and_ratio():
    def figures(t, s):
        return {"tbt_ms": t, "stall_per_block_ms": s, "stall_cpu_per_block_ms": s / 4, "blocks_per_turn": 10.0,
                "blocks_per_sample": 20.0, "failed_stores": 0}
    decode = {"prompt_tokens": 43, **{p: figures(t, s) for p, t, s in (("resident", 70.0, 0.0),
                                                                         ("triggered", 71.0, 0.5),
                                                                         ("cpu", 90.0, 12.0))}}
    result = {"settings": {"decode_tokens": 256, "repeats": 3, "block_tokens": [8, 32, 128]},
              "results": {"blocks": {"8": decode, "32": decode}},
              "failed": [{"part": "128 tokens", "error": "RuntimeError: offload with blocks of 128 failed"}],
              "ratios": {"cpu_stall_vs_triggered_32": 24.0},
              "floors": {"cpu_stall_vs_triggered_32": {"floor": 100.0, "value": 24.0, "met": False},
                         "triggered_stall_us_32": {"ceiling": 20.0, "value": 12.5, "met": True}}}
    lines = table(result).splitlines()
    assert lines[0].startswith("decode of 256 tokens")
    assert lines[3].split() == ["8", "70.00", "71.00", "90.00", "500.0", "12000.0", "125.0", "20.0", "0/0"]
    assert lines[4].split()[0] == "32"
    assert lines[5].split()[:3] == ["128", "failed:", "RuntimeError:"]
    assert lines[-3].split() == ["cpu_stall_vs_triggered_32", "24"]
    assert lines[-2:] == ["cpu_stall_vs_triggered_32 >= 100: 24 (NOT met)",
                          "triggered_stall_us_32 <= 20: 12.5 (met)"]


def test_every_placement_runs_every_block_size_and_each_is_reported(monkeypatch, tmp_path):
    def decode(stall_ms: float) -> dict:
        figures = {"tbt_ms": 70.0, "stall_per_block_ms": stall_ms, "blocks_per_turn": 10.0,
                   "blocks_per_sample": 20.0, "failed_stores": 0}
        return ({"prompt_tokens": 43, **{p: dict(figures) for p in POLICIES}}
                | {"cpu": {**figures, "stall_per_block_ms": 5.0}})

    calls = []

    def fake_child(args, block, placement):
        calls.append((placement, block))
        if (placement, block) == ("nic", 32):
            raise RuntimeError("the agent did not start")
        cpus = {"shared": {"compute": "0-1", "smartnic": "0-1"}, "nic": {"compute": "0", "smartnic": "1"}}
        return decode(0.5 if placement == "shared" else 0.05) | {
            "placement": {"name": placement, "cpus": cpus[placement], "torch_threads": 1, "started": True}}

    monkeypatch.setattr(offload, "run_one_block", fake_child)
    monkeypatch.setattr(offload, "plot", lambda result, out: None)
    args = parse_args(["--block-tokens", "8", "32", "--placements", "shared", "nic", "--out", str(tmp_path)])
    result = offload.run(args)
    assert calls == [("shared", 8), ("shared", 32), ("nic", 8), ("nic", 32)]
    assert [f["part"] for f in result["failed"]] == ["nic: 32 tokens"]
    assert [p["cpus"]["compute"] for p in result["machine"]["placement"]] == ["0-1", "0"]
    assert "placement" not in result["results"]["blocks"]["8"]  # the record is the machine's, not a block's
    assert result["ratios"]["cpu_stall_vs_triggered_8@nic"] == 100.0
    assert result["ratios"]["triggered_stall_us_8@nic_vs_shared"] == 0.1
    assert "cpu_stall_vs_triggered_32@nic" not in result["ratios"]
    assert result["floors"]["cpu_stall_vs_triggered_8@nic"]["met"]
    assert not result["floors"]["cpu_stall_vs_triggered_8"]["met"]  # the first placement's, shared
    text = offload.report(result)
    assert "== placement nic: compute 0, smartnic 1; torch threads 1" in text
    assert "triggered_stall_us_8" in text.split("placements side by side")[1]


def test_the_child_is_told_its_placement():
    assert parse_args(["--one-block", "8", "--placement", "nic"]).placement == "nic"
    assert parse_args(["--one-block", "8"]).placement == "shared"
