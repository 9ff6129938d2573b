"""vLLM's /tokenize and /detokenize requests, as compute-node requests. Pure.

/tokenize takes a prompt (raw text; the tokenizer's special tokens unless add_special_tokens is
false) or chat messages (rendered by the model's chat template, as /v1/chat/completions renders
them); /detokenize takes token ids. Every other field is 400 naming it.
"""
from __future__ import annotations

import dataclasses

from chat_frontend import openai_format as oa
from chat_frontend import request_fields as rf
from chat_frontend import request_parsing as rp
from kvtb_proto import compute_pb2

MAX_DETOKENIZE_TOKENS = 65536
MAX_TOKEN_STRS = 4096  # token_strs decodes each token alone

TOKENIZE_FIELDS = {"model", "prompt", "add_special_tokens", "return_token_strs", "messages",
                   "add_generation_prompt", "continue_final_message"}
# vLLM's chat fields accepted at their default (null, or as `accepts` says)
TOKENIZE_DEFAULTS = {"chat_template": rf.null_or(), "chat_template_kwargs": rf.empty, "tools": rf.empty,
                     "mm_processor_kwargs": rf.empty}
DETOKENIZE_FIELDS = {"model", "tokens"}


@dataclasses.dataclass(frozen=True)
class Tokenize:
    model: str | None
    encode: compute_pb2.EncodeChatRequest
    return_token_strs: bool


def _check(body: dict, known: set[str], defaults: dict) -> None:
    for name, value in body.items():
        if name in known or (name in defaults and defaults[name](value, body)):
            continue
        shown = rp.printable(name)[:60]
        if name in defaults:
            raise rp.bad(f"{name} {rp.shown(value)} is not supported (the model's own template only)", name)
        raise rp.bad(f"unknown field {shown!r}: accepted: {', '.join(sorted(known))}", shown)


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise rp.bad("model must be a string", "model")
    return model


def parse_tokenize(raw: bytes) -> Tokenize:
    """The EncodeChatRequest of a /tokenize body (INVALID_ARGUMENT naming the field otherwise)."""
    body = rp.load(raw)
    _check(body, TOKENIZE_FIELDS, TOKENIZE_DEFAULTS)
    strs = rp.flag(body, "return_token_strs")
    if ("prompt" in body) == ("messages" in body):
        raise rp.bad("give either prompt or messages", "prompt")
    if "prompt" in body:
        if not isinstance(body["prompt"], str):
            raise rp.bad("prompt must be a string", "prompt")
        for name in ("add_generation_prompt", "continue_final_message"):
            if body.get(name) is not None:
                raise rp.bad(f"{name} goes with messages, not prompt", name)
        return Tokenize(_model(body), compute_pb2.EncodeChatRequest(
            text=body["prompt"], add_special_tokens=rp.flag(body, "add_special_tokens", default=True)), strs)
    if rp.flag(body, "add_special_tokens"):
        raise rp.bad("add_special_tokens with messages is not supported: the chat template adds them",
                     "add_special_tokens")
    pairs, generation_prompt, continue_final = oa.parse_messages(body)
    return Tokenize(_model(body), compute_pb2.EncodeChatRequest(
        messages=[compute_pb2.ChatMessage(role=role, content=content) for role, content in pairs],
        add_generation_prompt=generation_prompt, continue_final_message=continue_final), strs)


def parse_detokenize(raw: bytes) -> tuple[str | None, list[int]]:
    """(model or None, token ids) of a /detokenize body."""
    body = rp.load(raw)
    _check(body, DETOKENIZE_FIELDS, {})
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or len(tokens) > MAX_DETOKENIZE_TOKENS or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= oa.MAX_TOKEN_ID for t in tokens):
        raise rp.bad(f"tokens must be a list of at most {MAX_DETOKENIZE_TOKENS} token ids", "tokens")
    return _model(body), tokens


def tokenize_response(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict:
    """vLLM's TokenizeResponse."""
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}
