"""`kvtb bench ttft`'s prefill part: the exact-attention FLOP bound, sizes side by side, failed sizes (its run
with the real services is in test_smoke.py)."""
from __future__ import annotations

import pytest
from transformers import LlamaConfig

from bench import prefill, ttft
from bench.progress import Progress
from bench.turns import TurnResult
from kvtb_proto import compute_pb2

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

# SmolLM2-135M's shape
SMOLLM2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152)


def test_flops_per_token_are_the_layers_weights_twice_plus_attention_over_the_mean_context():
    weights = 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536)  # q, o; k, v; gate, up, down
    assert weights == 106_168_320
    assert prefill.flops_per_token(SMOLLM2, 1) == 2 * weights + 4 * 30 * 9 * 64  # one key
    # 6,016 tokens: keys 1..6016, 3,008.5 on average
    assert prefill.flops_per_token(SMOLLM2, 6016) == pytest.approx(2 * weights + 69_120 * 3008.5)


def test_a_6k_prompts_tokens_cost_about_twice_a_512_token_ones_under_exact_attention():
    # attention (69k FLOPs per key) equals the layers' 212 MFLOPs at ~3,070 keys, a 6k prompt's mean
    assert prefill.exact_attention_bound(SMOLLM2, 512, 6016) == pytest.approx(230.07 / 420.28, abs=1e-4)  # MFLOPs per token
    assert prefill.exact_attention_bound(SMOLLM2, 512, 512) == 1.0


class Node:
    """generate() as bench.turns' with a clock: a turn of n tokens takes n / tokens_per_s(n) seconds."""

    def __init__(self, tokens_per_s, reuse: int = 0, fail_at: int | None = None):
        self.tokens_per_s, self.reuse, self.fail_at, self.calls = tokens_per_s, reuse, fail_at, []

    def __call__(self, stub, user, context, ids, max_new, policy):
        n = len(ids)
        self.calls.append((n, policy, max_new))
        if n == self.fail_at:
            raise TimeoutError("deadline exceeded")
        reused = self.reuse if n > 512 else 0
        record = compute_pb2.TurnRecord(tokens_prefilled=n - reused, tokens_reused=reused, ttft_ms=1.0)
        return TurnResult(n / self.tokens_per_s(n), 0.0, [7], record)


def measure(node: Node, sizes: list[int], reps: int = 2) -> dict:
    result = {"bench": "ttft", "settings": {}, "results": {}, "ratios": {}, "failed": []}
    quiet = Progress(1, "x", enabled=False)
    result["results"]["prefill"] = prefill.run_prefill(result, None, sizes, reps, quiet, lambda n: [1] * n, node,
                                                       "u2")
    return result


def test_sizes_are_measured_side_by_side_and_compared_with_the_bound():
    node = Node(lambda n: 100.0 if n == 512 else 50.0)
    result = measure(node, [512, 1024, 6016])
    assert [n for n, _, _ in node.calls] == [512, 1024, 6016, 6016, 1024, 512]  # each round the other way
    assert {(policy, max_new) for _, policy, max_new in node.calls} == {("recompute", 1)}
    assert result["results"]["prefill"]["6016"]["tokens_per_s"] == pytest.approx(50.0)
    floor = prefill.add_ratios(result, SMOLLM2)
    assert result["ratios"]["prefill_tokens_per_s_6016_vs_512"] == pytest.approx(0.5)
    bound = result["results"]["prefill_bound"]["6016_vs_512"]
    assert result["ratios"]["prefill_vs_exact_attention_bound_6016"] == pytest.approx(0.5 / bound)
    assert floor == {"prefill_vs_exact_attention_bound_6016": prefill.FLOOR}
    assert "6016_vs_512" in result["results"]["prefill_bound"] and "failed" not in result["results"]["prefill"]
    assert "exact-attention bound" in prefill.table(result)


def test_tokens_per_s_are_of_each_sizes_fastest_round():
    speeds = iter([100.0, 100.0, 25.0, 25.0])  # the second round under others' load
    result = measure(Node(lambda n: next(speeds)), [512, 1024])
    assert [result["results"]["prefill"][n]["tokens_per_s"] for n in ("512", "1024")] == [100.0, 100.0]
    assert result["results"]["prefill"]["512"]["ttft_s"]["max"] == pytest.approx(512 / 25.0)


def test_a_size_that_raises_or_reuses_kv_fails_and_gives_no_ratio():
    result = measure(Node(lambda n: 100.0, fail_at=2048), [512, 2048])
    assert [f["part"] for f in result["failed"]] == ["prefill 2048 tokens"]
    assert prefill.add_ratios(result, SMOLLM2) == {} and result["ratios"] == {}
    result = measure(Node(lambda n: 100.0, reuse=64), [512, 1024])
    assert "reused 64 tokens" in result["results"]["prefill"]["1024"]["failed"]
    assert "failed: RuntimeError" in prefill.table(result)


def test_ttft_measures_the_prefill_sizes_unless_told_none():
    assert ttft.parse_args([]).prefill_sizes == list(prefill.SIZES)
    assert ttft.parse_args(["--prefill-sizes"]).prefill_sizes == []
    assert ttft.parse_args(["--smoke"]).prefill_sizes == list(prefill.SMOKE_SIZES)
    with pytest.raises(SystemExit):
        ttft.parse_args(["--prefill-sizes", "0"])


@pytest.mark.slow
def test_ttft_smoke_measures_prefill_by_prompt_length_with_real_services(tmp_path):
    from tests.bench.test_smoke import bench
    result = bench(tmp_path, "ttft", "--sizes", "32", "--reps", "1", "--placements", "shared",
                   "--prefill-sizes", "64", "160")
    rows = result["results"]["prefill"]
    assert [rows[n]["prompt_tokens"] for n in ("64", "160")] == [64, 160]
    assert all(rows[n]["tokens_per_s"] > 0 and rows[n]["ttft_s"]["n"] == 2 for n in rows)
    assert 0 < result["ratios"]["prefill_tokens_per_s_160_vs_64"]
    assert "prefill_vs_exact_attention_bound_160" in result["floors"] and result["failed"] == []
