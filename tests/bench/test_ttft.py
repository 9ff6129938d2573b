"""`kvtb bench ttft`'s contexts of whole blocks, its kv_source check and its failed sizes (its run
with the real services is in test_smoke.py)."""
from __future__ import annotations

import pytest

from bench import ttft
from bench.progress import Progress


def fake_encode(text: str) -> list[int]:
    """A chat template of 23 tokens around the message; 'conversation' is two tokens, any other word one."""
    words = text.split()
    return [0] * 23 + [1] * sum(2 if w.strip(".") == "conversation" else 1 for w in words)


@pytest.mark.parametrize("size", [32, 64, 96, 100, 1000, 2048])
def test_contexts_are_whole_blocks_so_resident_keeps_all_a_restore_brings_back(size):
    ids = ttft.whole_blocks_prompt(fake_encode, size, 32)
    assert len(ids) == ttft.whole_blocks(size, 32) and len(ids) % 32 == 0
    assert abs(len(ids) - size) <= 16


def test_a_context_that_cannot_be_whole_blocks_is_an_error():
    with pytest.raises(ValueError, match="exactly 32 tokens"):
        ttft.whole_blocks_prompt(lambda text: [0] * 40 + [1] * len(text.split()), 32, 32)  # the template: 40


def test_every_follow_ups_kv_source_is_checked_against_its_policy():
    ok = {"resident": ["resident", "resident"], "triggered": ["restored", "restored"],
          "recompute": ["none", "recomputed"]}
    assert ttft.source_mismatches(ok) == []
    bad = {**ok, "triggered": ["restored", "partial"], "resident": ["recomputed", "resident"],
           "recompute": ["resident"]}
    assert ttft.source_mismatches(bad) == [
        "resident follow-up 1: kv_source 'recomputed', expected 'resident'",
        "triggered follow-up 2: kv_source 'partial', expected 'restored'",
        "recompute follow-up 1: kv_source 'resident', expected 'none' or 'recomputed'"]


def row(size: int, triggered: list[str], ms: tuple[float, float, float] = (20.0, 22.0, 400.0)) -> dict:
    policies = {p: {"ttft_s": {"p50": t / 1e3}, "kv_source": src, "tokens_reused": [size]}
                for p, t, src in zip(ttft.POLICIES, ms, (["resident"], triggered, ["recomputed"]))}
    return {"context_tokens": size, "policies": policies,
            "mismatches": ttft.source_mismatches({p: policies[p]["kv_source"] for p in ttft.POLICIES})}


def test_a_size_with_a_mismatch_or_an_error_is_reported_failed_and_gives_no_ratio(monkeypatch):
    def fake_run_size(stub, size, reps, max_new, progress):
        if size == 1024:
            raise TimeoutError("deadline exceeded")
        return row(size, ["restored"] if size == 256 else ["partial"])
    monkeypatch.setattr(ttft, "run_size", fake_run_size)
    result = {"bench": "ttft", "settings": {"reps": 1}, "results": {}, "ratios": {}, "failed": []}
    quiet = Progress(1, "x", enabled=False)
    result["results"]["sizes"] = ttft.run_sizes(result, None, [256, 512, 1024], 1, 2, quiet)
    ttft.add_ratios(result)
    assert [f["part"] for f in result["failed"]] == ["512 tokens", "1024 tokens"]
    assert "kv_source 'partial', expected 'restored'" in result["failed"][0]["error"]
    assert set(result["ratios"]) == {"recompute_vs_restore_256", "restore_vs_resident_256"}
    lines = ttft.table(result).splitlines()
    assert lines[3].split()[:3] == ["256", "256", "20.0"]
    assert "failed: KvSourceMismatch: triggered follow-up 1" in lines[4]
    assert "failed: TimeoutError: deadline exceeded" in lines[5]
