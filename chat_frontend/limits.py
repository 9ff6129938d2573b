"""Limits on a turn: tokens to generate, choices, sampling, the model's context. Pure.

A prompt's length is bounded in tokens, against the model's context (`check_context_fits`); what
bounds it before tokenizing is the request's size (the HTTP body's and the gRPC message's bound).
"""
from __future__ import annotations

import math

from chat_frontend.errors import ChatError

MAX_TEMPERATURE = 100.0  # the compute node's bound (compute_node.sampling.check_sampling)


def check_message(message: str) -> None:
    """INVALID_ARGUMENT when the gRPC Chat message is empty (the proto says so)."""
    if not message.strip():
        raise ChatError("INVALID_ARGUMENT", "message is empty", "message")


def check_n(n: int, max_n: int) -> int:
    """The choices to generate: 1 when 0 is asked; INVALID_ARGUMENT above max_n."""
    if n > max_n:
        raise ChatError("INVALID_ARGUMENT", f"n is {n}, over the limit of {max_n} choices", "n")
    return max(1, n)


def resolve_max_new_tokens(requested: int, default: int, cap: int) -> int:
    """The tokens to generate: the default when 0 is asked, INVALID_ARGUMENT above the cap."""
    if requested == 0:
        return default
    if requested > cap:
        raise ChatError("INVALID_ARGUMENT",
                        f"max_new_tokens is {requested}, over the limit of {cap} by {requested - cap}")
    return requested


def check_sampling(temperature: float, top_p: float) -> None:
    """INVALID_ARGUMENT unless temperature is in [0, 100] and top_p in [0, 1] (NaN is neither)."""
    if not (math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
        raise ChatError("INVALID_ARGUMENT", f"sampling.temperature must be in [0, {MAX_TEMPERATURE:g}], "
                        f"got {temperature}", "temperature")
    if not (math.isfinite(top_p) and 0.0 <= top_p <= 1.0):
        raise ChatError("INVALID_ARGUMENT", f"sampling.top_p must be in [0, 1], got {top_p}", "top_p")


def check_context_fits(tokens_so_far: int, new_tokens: int, max_new_tokens: int,
                       max_context_tokens: int) -> None:
    """INVALID_ARGUMENT when the conversation plus this turn would pass the model's context."""
    needed = tokens_so_far + new_tokens + max_new_tokens
    if needed > max_context_tokens:
        raise ChatError("INVALID_ARGUMENT",
                        f"conversation would need {needed} tokens ({tokens_so_far} so far + "
                        f"{new_tokens} for this message + {max_new_tokens} to generate), over the "
                        f"model's context of {max_context_tokens} tokens by "
                        f"{needed - max_context_tokens}; start a new context")


def fit_default(max_new_tokens: int, requested: int, room: int) -> int:
    """The default tokens to generate shrink to the room left in the context; a request does not."""
    if requested:
        return max_new_tokens
    return max(1, min(max_new_tokens, room))
