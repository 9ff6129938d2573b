"""Greedy by default; every vLLM sampling parameter per row of a batch, reproducible with a seed."""
from __future__ import annotations

import math

import pytest
import torch

from compute_node.sampling import (
    SamplingParams,
    SequenceSampler,
    check_params,
    check_sampling,
    sample,
    top_p_filter,
    top_p_rows,
)


def draws(params: SamplingParams, logits: torch.Tensor, n: int) -> list[int]:
    """n tokens one step at a time from the same logits [vocab], as the engine's batch of one."""
    state = SequenceSampler(params, logits.shape[-1])
    out = []
    for _ in range(n):
        [token], _ = sample(logits[None], [state])
        state.accept(token)
        out.append(token)
    return out


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert draws(SamplingParams(), logits, 1) == [1]


def test_a_seed_makes_sampling_reproducible():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    assert draws(params, logits, 20) == draws(params, logits, 20)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = top_p_filter(probs.clone(), 0.8)
    assert torch.allclose(kept, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_bad_values_are_explained():
    assert "temperature" in check_sampling(-1.0, 0.0)
    assert "top_p" in check_sampling(0.5, 1.5)
    assert check_sampling(0.7, 0.95) is None


def test_a_tiny_temperature_samples_like_the_smallest_safe_one():
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(3)) * 20  # [vocab]
    for temperature in (1e-300, 5e-324, 1e-38, 1e-3):
        assert draws(SamplingParams(temperature=temperature, seed=1), logits, 5) == [int(torch.argmax(logits))] * 5
    assert check_sampling(1e-300, 0.0) is None


def test_nan_and_infinity_are_refused():
    nan, inf = float("nan"), float("inf")
    assert "temperature" in check_sampling(nan, 0.0) and "temperature" in check_sampling(inf, 0.0)
    assert "top_p" in check_sampling(0.5, nan) and "top_p" in check_sampling(0.5, -inf)


# -- the batched sampler (vLLM's SamplingParams, per row)

VOCAB = 64


def rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3  # [n, vocab]


def seq(prompt=(), stop_ids=(2,), **kw) -> SequenceSampler:
    return SequenceSampler(SamplingParams(**kw), VOCAB, prompt, stop_ids)


def test_plain_greedy_rows_are_the_argmax_and_report_nothing():
    logits = rows(4)
    samplers = [seq() for _ in range(4)]
    assert all(s.plain for s in samplers)
    tokens, logprobs = sample(logits, samplers)
    assert tokens == logits.argmax(dim=-1).tolist() and logprobs == [None] * 4


def test_a_logit_bias_of_100_makes_greedy_pick_its_token_and_leaves_other_rows_alone():
    logits = rows(3)
    best = logits.argmax(dim=-1).tolist()
    assert best[1] != 7
    tokens, _ = sample(logits, [seq(), seq(logit_bias={7: 100.0}), seq()])
    assert tokens == [best[0], 7, best[2]]


def test_min_tokens_masks_the_end_of_turn_and_stop_tokens_until_reached():
    logits = rows(1)
    logits[0, 2], logits[0, 5] = 50.0, 49.0  # end of turn and a stop token the likeliest by far
    s = seq(min_tokens=2, stop_token_ids=(5,))
    for _ in range(2):
        assert not s.plain
        [token], _ = sample(logits, [s])
        assert token not in (2, 5)
        s.accept(token)
    assert s.plain  # reached: greedy again, the argmax alone
    assert sample(logits, [s])[0] == [2]


def test_presence_and_frequency_penalties_lower_generated_tokens_by_their_counts():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    s = seq(presence_penalty=0.3, frequency_penalty=0.2)
    assert sample(logits, [s])[0] == [3]
    s.accept(3)  # 3: 2.0 - 0.3 - 0.2 = 1.5, a tie with 4 (the first wins)
    assert sample(logits, [s])[0] == [3]
    s.accept(3)  # 2.0 - 0.3 - 0.4 = 1.3 < 1.5
    assert sample(logits, [s])[0] == [4]
    assert int(s.counts[3]) == 2 and int(s.counts.sum()) == 2  # kept incrementally


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_prompt_and_output():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 10], logits[0, 11], logits[0, 12] = 3.0, 2.0, -0.1
    s = seq(prompt=[10], repetition_penalty=2.0)  # 10: 3 / 2 = 1.5 < 2
    assert sample(logits, [s])[0] == [11]
    s.accept(11)  # 11: 1.0; 10: 1.5
    assert sample(logits, [s])[0] == [10]
    logits[0, :12] = -1.0
    s.accept(12)  # -0.1 * 2 = -0.2 still above -1
    assert sample(logits, [s])[0] == [12]
    assert sample(logits, [seq(repetition_penalty=1.0)])[0] == [12]  # 1: off


def test_top_k_1_is_greedy_and_min_p_1_keeps_only_the_likeliest():
    logits = rows(6, seed=4)
    best = logits.argmax(dim=-1).tolist()
    assert sample(logits, [seq(temperature=1.5, top_k=1, seed=i) for i in range(6)])[0] == best
    assert sample(logits, [seq(temperature=1.5, min_p=1.0, seed=i) for i in range(6)])[0] == best


def test_top_k_draws_only_among_the_k_likeliest():
    logits = rows(1, seed=5)
    allowed = set(logits[0].topk(3).indices.tolist())
    s = seq(temperature=5.0, top_k=3, seed=9)
    drawn = {sample(logits, [s])[0][0] for _ in range(60)}
    assert drawn <= allowed and len(drawn) > 1


def test_a_seed_gives_the_same_draws_whatever_else_is_in_the_batch():
    logits = rows(1, seed=6)
    alone = seq(temperature=1.0, top_p=0.9, top_k=20, min_p=0.01, seed=42)
    mine = [sample(logits, [alone])[0][0] for _ in range(30)]
    others = rows(3, seed=7)
    batched = seq(temperature=1.0, top_p=0.9, top_k=20, min_p=0.01, seed=42)
    companions = [seq(temperature=0.7, seed=1), seq(), seq(logit_bias={1: 5.0}, temperature=2.0, top_k=5, seed=3)]
    got = []
    for i in range(30):
        batch = torch.cat([others[:1], logits, others[1:]])  # [4, vocab]: ours is row 1
        got.append(sample(batch, [companions[0], batched, *companions[1:]])[0][1])
        companions = companions[1:] + companions[:1] if i % 2 else companions
    assert got == mine and len(set(mine)) > 1


def test_draws_follow_the_distribution_after_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * (VOCAB - 4)]) + 1e-30)
    s = seq(temperature=1.0, top_p=0.85, seed=11)
    counts = torch.bincount(torch.tensor([sample(logits, [s])[0][0] for _ in range(4000)]), minlength=VOCAB)
    assert counts[3:].sum() == 0  # top_p 0.85 keeps 0.5, 0.3 and 0.15 (renormalised: 0.526, 0.316, 0.158)
    assert (counts[:3] / 4000).tolist() == pytest.approx([0.526, 0.316, 0.158], abs=0.03)


def test_top_p_among_the_candidates_equals_a_full_sort_and_falls_back_when_the_mass_is_wide():
    probs = torch.softmax(torch.randn(4, 5000, generator=torch.Generator().manual_seed(12)) * 4, dim=-1)
    probs[2:] = torch.softmax(torch.randn(2, 5000, generator=torch.Generator().manual_seed(13)) * 0.1, dim=-1)
    top_ps = [0.9, 0.5, 0.5, 0.9]  # flat rows: among 4096 candidates (82% of the mass), then by a full sort
    kept = top_p_rows(probs.clone(), top_ps)
    for row, p in enumerate(top_ps):
        full = top_p_filter(probs[row].clone(), p)
        assert torch.equal(kept[row] > 0, full > 0) and float(kept[row].sum()) >= p


def test_logprobs_are_raw_log_probabilities_with_the_likeliest_sorted():
    logits = rows(2, seed=9)
    tokens, logprobs = sample(logits, [seq(logprobs=True, top_logprobs=5, logit_bias={9: 30.0}), seq()])
    raw = torch.log_softmax(logits[0], dim=-1)
    lp = logprobs[0]
    assert tokens[0] == 9 and lp.logprob == pytest.approx(float(raw[9]))  # before the bias
    assert [i for i, _ in lp.top] == raw.topk(5).indices.tolist()
    values = [v for _, v in lp.top]
    assert values == sorted(values, reverse=True) and all(v <= 0 for v in values) and logprobs[1] is None
    greedy_tokens, greedy_lp = sample(logits, [seq(logprobs=True, top_logprobs=3), seq(logprobs=True)])
    assert greedy_lp[0].top[0][0] == greedy_tokens[0] and greedy_lp[1].top == []
    assert math.isclose(sum(math.exp(v) for v in raw.tolist()), 1.0, rel_tol=1e-4)


def test_grammar_rows_are_masked_by_their_matchers(monkeypatch):
    import sys
    import types
    calls = []

    def mask_logits(logits, rows, matchers):
        calls.append((rows, matchers))
        for row, m in zip(rows, matchers):
            keep = logits[row, m.allowed].clone()
            logits[row] = -math.inf
            logits[row, m.allowed] = keep

    monkeypatch.setitem(sys.modules, "compute_node.grammar", types.SimpleNamespace(mask_logits=mask_logits))
    import compute_node
    monkeypatch.setattr(compute_node, "grammar", sys.modules["compute_node.grammar"], raising=False)
    matcher = types.SimpleNamespace(allowed=[20, 21], accept=lambda t: None)
    logits = rows(2, seed=10)
    s = SequenceSampler(SamplingParams(), VOCAB, matcher=matcher)
    tokens, _ = sample(logits, [seq(), s])
    assert tokens[1] == max((20, 21), key=lambda t: float(logits[1, t]))
    assert calls[0][0] == [0] and calls[0][1] == [matcher]  # rows of the processed rows: only the grammar's


@pytest.mark.parametrize("field, params, kw", [
    ("top_p", SamplingParams(top_p=1.5), {}),
    ("top_k", SamplingParams(top_k=-2), {}),
    ("min_p", SamplingParams(min_p=float("nan")), {}),
    ("presence_penalty", SamplingParams(presence_penalty=2.5), {}),
    ("frequency_penalty", SamplingParams(frequency_penalty=-float("inf")), {}),
    ("repetition_penalty", SamplingParams(repetition_penalty=2.01), {}),
    ("repetition_penalty", SamplingParams(repetition_penalty=-1.0), {}),
    ("logit_bias", SamplingParams(logit_bias={VOCAB: 1.0}), {}),
    ("logit_bias", SamplingParams(logit_bias={3: 100.5}), {}),
    ("logit_bias", SamplingParams(logit_bias={3: float("nan")}), {}),
    ("logit_bias", SamplingParams(logit_bias={i: 1.0 for i in range(301)}), {}),
    ("stop", SamplingParams(stop=tuple("abcdefghijklmnopq")), {}),
    ("stop", SamplingParams(stop=("",)), {}),
    ("stop", SamplingParams(stop=("x" * 257,)), {}),
    ("stop_token_ids", SamplingParams(stop_token_ids=(VOCAB,)), {}),
    ("stop_token_ids", SamplingParams(stop_token_ids=tuple(range(65))), {}),
    ("min_tokens", SamplingParams(min_tokens=17), {}),
    ("top_logprobs", SamplingParams(logprobs=True, top_logprobs=21), {}),
    ("top_logprobs", SamplingParams(top_logprobs=2), {}),
    ("ignore_eos", SamplingParams(structured=object()), {"ignore_eos": True}),
])
def test_each_bad_value_is_refused_naming_its_field(field, params, kw):
    why = check_params(params, VOCAB, 16, **kw)
    assert why is not None and field in why


def test_good_values_pass():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=-1, min_p=0.05, presence_penalty=-2.0,
                            frequency_penalty=2.0, repetition_penalty=1.2, logit_bias={63: -100.0},
                            stop_token_ids=(5,), stop=("x" * 256,), min_tokens=16, logprobs=True, top_logprobs=20)
    assert check_params(params, VOCAB, 16) is None


def test_a_sampler_made_inside_a_forward_counts_after_it():
    with torch.inference_mode():  # the engine takes turns in between two layers of a forward
        s = SequenceSampler(SamplingParams(presence_penalty=1.0, repetition_penalty=1.5), 500, [1, 2])
    tokens = [3, 3, 4] + list(range(5, 100)) * 2  # past the first buffer of 64 distinct ids
    for token in tokens:
        s.accept(token)
    assert int(s.counts[3]) == 2 and int(s.counts[99]) == 2 and int(s.counts.sum()) == len(tokens)
    assert s.output.ids.tolist() == list(range(3, 100)) and s.seen.ids.tolist() == list(range(1, 100))
