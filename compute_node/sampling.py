"""Choosing the next token from logits: greedy by default, or temperature and top-p with a seed.

A temperature below MIN_TEMPERATURE samples as MIN_TEMPERATURE (as vLLM does): in fp32,
logits / 1e-300 is inf (the divisor itself rounds to 0) and softmax gives NaN, which
torch.multinomial refuses. At 0.01 sampling is already all but greedy, so the clamp changes
no reply a user could tell apart, and every temperature check_sampling accepts is safe.
"""
from __future__ import annotations

import dataclasses

import torch

MIN_TEMPERATURE = 1e-2


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0: greedy; top_p 0 or 1: off."""

    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_sampling(temperature: float, top_p: float) -> str | None:
    """Why these values are invalid (NaN and infinities are), or None."""
    if not temperature >= 0.0 or temperature > 100.0:
        return f"sampling.temperature must be in [0, 100], got {temperature}"
    if not 0.0 <= top_p <= 1.0:
        return f"sampling.top_p must be in [0, 1], got {top_p}"
    return None


class Sampler:
    """Draws tokens for one turn; its generator makes a seeded turn reproducible."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator().manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] -> token id."""
        if self.params.greedy:
            return int(torch.argmax(logits))
        temperature = max(self.params.temperature, MIN_TEMPERATURE)
        probs = torch.softmax(logits.float() / temperature, dim=-1)  # [vocab]
        if 0.0 < self.params.top_p < 1.0:
            probs = top_p_filter(probs, self.params.top_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise."""
    sorted_probs, order = torch.sort(probs, descending=True)  # [vocab]
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
