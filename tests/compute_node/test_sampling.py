"""Greedy by default; temperature and top-p reproducible with a seed."""
from __future__ import annotations

import torch

from compute_node.sampling import Sampler, SamplingParams, check_sampling, top_p_filter


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampler(SamplingParams())(logits) == 1


def test_a_seed_makes_sampling_reproducible():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    a, b = Sampler(params), Sampler(params)
    assert [a(logits) for _ in range(20)] == [b(logits) for _ in range(20)]


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
        draws = Sampler(SamplingParams(temperature=temperature, seed=1))
        assert [draws(logits) for _ in range(5)] == [int(torch.argmax(logits))] * 5
    assert check_sampling(1e-300, 0.0) is None


def test_nan_and_infinity_are_refused():
    nan, inf = float("nan"), float("inf")
    assert "temperature" in check_sampling(nan, 0.0) and "temperature" in check_sampling(inf, 0.0)
    assert "top_p" in check_sampling(0.5, nan) and "top_p" in check_sampling(0.5, -inf)
