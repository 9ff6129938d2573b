"""Limits on a turn: tokens to generate, choices, sampling, the model's context. Pure.

A prompt's length is bounded in tokens, against the model's context (`max_new_tokens`, as vLLM's
server reckons it); what bounds it before tokenizing is the request's size (the HTTP body's and the
gRPC message's bound). The context is the compute node's (Info), never hard-coded here.
"""
from __future__ import annotations

import math

from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2

MAX_TEMPERATURE = 100.0  # the compute node's bound (compute_node.sampling.check_sampling)
MAX_TOKENS = (1 << 31) - 1  # max_tokens taken at all (then checked against the context): int32, as torch's
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code for a request past the context
CONTEXT_EXCEEDED_WORDS = "This model's maximum context length is"  # how vLLM (and the compute node) says it


def check_message(message: str) -> None:
    """INVALID_ARGUMENT when the gRPC Chat message is empty (the proto says so)."""
    if not message.strip():
        raise ChatError("INVALID_ARGUMENT", "message is empty", "message")


def check_n(n: int, max_n: int) -> int:
    """The choices to generate: 1 when 0 is asked; INVALID_ARGUMENT above max_n."""
    if n > max_n:
        raise ChatError("INVALID_ARGUMENT", f"n is {n}, over the limit of {max_n} choices", "n")
    return max(1, n)


def check_sampling(temperature: float, top_p: float) -> None:
    """INVALID_ARGUMENT unless temperature is in [0, 100] and top_p in [0, 1] (NaN is neither)."""
    if not (math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
        raise ChatError("INVALID_ARGUMENT", f"sampling.temperature must be in [0, {MAX_TEMPERATURE:g}], "
                        f"got {temperature}", "temperature")
    if not (math.isfinite(top_p) and 0.0 <= top_p <= 1.0):
        raise ChatError("INVALID_ARGUMENT", f"sampling.top_p must be in [0, 1], got {top_p}", "top_p")


def context_tokens(info: compute_pb2.InfoResponse) -> int:
    """One sequence's tokens at most, prompt and reply: the model's context (Info.max_context_tokens),
    never more than the compute node's KV pool holds (vLLM does not start with a pool that small)."""
    pool = info.num_blocks * info.block_tokens
    return min(info.max_context_tokens, pool) if pool else info.max_context_tokens


def context_exceeded(context: int, prompt: int, max_tokens: int | None, param: str) -> ChatError:
    """INVALID_ARGUMENT in vLLM's words, with OpenAI's code: the prompt (and max_tokens, when the
    request gave it) past the context. `param` names what is too long: the messages (the prompt) or
    the max_tokens the request gave."""
    if max_tokens is None:  # vLLM's text, its comma before "Please" made a full stop
        message = (f"{CONTEXT_EXCEEDED_WORDS} {context} tokens. However, you requested {prompt} tokens in "
                   "the messages. Please reduce the length of the messages.")
    else:
        message = (f"{CONTEXT_EXCEEDED_WORDS} {context} tokens. However, you requested "
                   f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
                   "completion). Please reduce the length of the messages or completion.")
    return ChatError("INVALID_ARGUMENT", message, param, openai_code=CONTEXT_LENGTH_EXCEEDED)


def max_new_tokens(prompt: int, context: int, requested: int | None, *, default: int = 0, cap: int = 0,
                   prompt_param: str = "messages", tokens_param: str = "max_tokens") -> int:
    """The tokens to generate after a prompt of `prompt` tokens in a context of `context`, as vLLM's
    server reckons them; INVALID_ARGUMENT (context_exceeded) when they cannot fit.

    Followed: vllm/entrypoints/openai/serving_engine.py, OpenAIServing._validate_input (a prompt must
    leave the reply a token: prompt >= context is refused, naming the prompt; a max_tokens the request
    gave must fit beside it, else refused naming max_tokens) and vllm/entrypoints/utils.py,
    get_max_tokens (absent: what the context leaves, lowered to the server's default; either way
    lowered to the server's cap, as vLLM's override_max_tokens, never refused for it). `default` and
    `cap` of 0 are none; `requested` is None (absent) or at least 1. vLLM main words the refusals
    otherwise (vllm/entrypoints/openai/engine/serving.py, vllm/renderers/params.py: "your request has
    N input tokens", code 400, param "input_tokens"); this keeps the wording clients parse ("P in the
    messages, K in the completion") with OpenAI's code (context_length_exceeded) and params.
    """
    if prompt >= context or (requested is not None and prompt + requested > context):
        too_long = prompt_param if prompt >= context else tokens_param
        raise context_exceeded(context, prompt, requested, too_long)
    tokens = context - prompt if requested is None else requested
    bounds = (tokens, default if requested is None else 0, cap)
    return min(n for n in bounds if n > 0)
