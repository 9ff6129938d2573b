"""OpenAI (legacy) completions requests and responses, as vLLM's server takes and gives them. Pure.

`FIELDS` is the one list of every /v1/completions request field and what happens to it (as
openai_format.FIELDS for chat): supported, accepted when it is the default, or refused (400 naming
it); a field not in the list is 400 naming it. A prompt is raw text (tokenized without the chat
template, with the tokenizer's special tokens unless `add_special_tokens` is false, as vLLM does) or
token ids; a request holds up to MAX_PROMPTS of them, each run as n choices: choice
`prompt_index * n + j`. Completions are stateless: no transcript is kept, but the KV of a prompt's
prefix the user ran before is found by content, as for chat.
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from chat_frontend import limits
from chat_frontend import openai_format as oa
from chat_frontend import request_fields as rf
from chat_frontend import request_parsing as rp
from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2

MAX_PROMPTS = 32         # prompts of one request
MAX_SEQUENCES = 64       # prompts times n
MAX_LOGPROBS = 5         # OpenAI's completions bound (vLLM's default max_logprobs is 20)
DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) completions default
ECHO_LOGPROBS_REFUSED = ("echo with logprobs needs the prompt's logprobs, which this server does not "
                         "compute; ask for one or the other")

_yes, _default, _no = rf.yes, rf.default, rf.no

# Every field of a completions request (OpenAI's, then vLLM's extras). A null value is the field left out.
FIELDS: dict[str, rf.Field] = {
    **rf.SHARED,
    "prompt": _yes(f"a string, a list of strings, token ids, or lists of token ids (at most {MAX_PROMPTS})"),
    "echo": _yes("the prompt's text before the completion; not with logprobs"),
    "logprobs": _yes(f"0-{MAX_LOGPROBS}: the sampled token's and the likeliest that many"),
    "max_tokens": _yes(f"default {DEFAULT_MAX_TOKENS}; 0 only with echo; with the prompt at most the context "
                       "(else context_length_exceeded); settings max_new_tokens_cap lowers it"),
    "n": _yes("1 to the frontend's max_n per prompt"),
    "stop": _yes("a string or up to 16"),
    "suffix": _default("null or \"\" (the model has no fill-in-the-middle format)", rf.empty),
    "user": _yes("accepted; completions are stateless"),
    # vLLM's sampling parameters
    # vLLM's extra parameters
    "add_special_tokens": _yes("default true: the tokenizer's BOS and the like"),
    "request_id": _yes("the response's id is cmpl-<request_id>"),
    "prompt_embeds": _no("prompts are text or token ids"),
}


Prompt = str | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CompletionsRequest:
    """What a completions request asks: n choices of each prompt."""

    model: str
    prompts: tuple[Prompt, ...]
    max_tokens: int                      # DEFAULT_MAX_TOKENS when absent
    n: int
    sampling: compute_pb2.Sampling       # the choices' seeds are seed + choice index
    given: frozenset[str]                # sampling fields the request set (the rest take defaults)
    echo: bool = False
    logprobs: int | None = None          # None: no logprobs
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    add_special_tokens: bool = True
    token_ids_as_tokens: bool = False
    request_id: str = ""
    max_tokens_given: bool = True        # False: the default (then the prompt is what passes the context)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def check_fields(body: dict) -> None:
    """INVALID_ARGUMENT naming the first field that is unknown, refused, or not its default."""
    rf.check_fields(body, FIELDS, "completions")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= oa.MAX_TOKEN_ID


def parse_prompts(value: Any) -> tuple[Prompt, ...]:
    """The prompts of `prompt`: a string, strings, token ids, or lists of token ids (none empty)."""
    shape = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise rp.bad(shape, "prompt")
    if all(_is_id(v) for v in value):
        value = [value]
    if len(value) > MAX_PROMPTS:
        raise rp.bad(f"prompt holds {len(value)} prompts, over the limit of {MAX_PROMPTS}", "prompt")
    prompts: list[Prompt] = []
    for i, p in enumerate(value):
        if isinstance(p, str) and p:
            prompts.append(p)
        elif isinstance(p, list) and p and all(_is_id(t) for t in p):
            prompts.append(tuple(p))
        else:
            raise rp.bad(f"prompt[{i}] is empty or not a string or a list of token ids: {shape}", "prompt")
    return tuple(prompts)


def _stream_options(body: dict, stream: bool) -> bool:
    """include_usage of stream_options (which needs stream)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise rp.bad("stream_options needs stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise rp.bad("stream_options must be an object of include_usage (and continuous_usage_stats false)",
                     "stream_options")
    if rp.flag(options, "continuous_usage_stats", "stream_options.continuous_usage_stats"):
        raise rp.bad("stream_options.continuous_usage_stats is not supported: usage comes in the last chunk",
                     "stream_options.continuous_usage_stats")
    return rp.flag(options, "include_usage", "stream_options.include_usage")


def parse_request(raw: bytes, max_n: int,
                  draw_seed: Callable[[], int] = lambda: secrets.randbits(64)) -> CompletionsRequest:
    """The completions a request body asks for (INVALID_ARGUMENT naming the field when it is not one)."""
    body = rp.load(raw)
    check_fields(body)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise rp.bad("model is required", "model")
    prompts = parse_prompts(body.get("prompt"))
    n = rp.number(body, "n", int, 1, 1, max_n)
    if len(prompts) * n > MAX_SEQUENCES:
        raise rp.bad(f"{len(prompts)} prompts times n={n} make {len(prompts) * n} sequences, over the limit "
                     f"of {MAX_SEQUENCES}", "n")
    echo = rp.flag(body, "echo")
    logprobs = rp.number(body, "logprobs", int, None, 0, MAX_LOGPROBS)
    if echo and logprobs is not None:
        raise rp.bad(ECHO_LOGPROBS_REFUSED, "echo")
    max_tokens = rp.number(body, "max_tokens", int, DEFAULT_MAX_TOKENS, 0, limits.MAX_TOKENS)
    if max_tokens == 0 and not echo:
        raise rp.bad("max_tokens must be at least 1 (0 only with echo: the prompt alone)", "max_tokens")
    if not isinstance(body.get("user", ""), (str, type(None))):
        raise rp.bad("user must be a string", "user")
    stream = rp.flag(body, "stream")
    include_usage = _stream_options(body, stream)
    # chat's sampling fields, with completions' logprobs (a count) as chat's logprobs + top_logprobs
    chat_body = {**body, "logprobs": logprobs is not None, "top_logprobs": logprobs or None}
    sampling = oa.parse_sampling(chat_body, max(1, max_tokens), draw_seed)
    given = frozenset(name for name in oa.SAMPLING_DEFAULTS if body.get(name) is not None)
    return CompletionsRequest(
        model=body["model"], prompts=prompts, max_tokens=max_tokens, n=n, sampling=sampling, given=given,
        echo=echo, logprobs=logprobs, stream=stream, include_usage=include_usage,
        ignore_eos=rp.flag(body, "ignore_eos"),
        add_special_tokens=rp.flag(body, "add_special_tokens", default=True),
        token_ids_as_tokens=rp.flag(body, "return_tokens_as_token_ids"), request_id=rp.request_id(body),
        max_tokens_given=body.get("max_tokens") is not None)


# Responses

@dataclasses.dataclass
class Choice:
    """One choice as it ends: its text (the echoed prompt included), tokens and the engine's record."""

    index: int
    text: str
    tokens: list                               # compute_pb2.TurnEvent.Token
    finish_reason: str
    stop_reason: str | int | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0                     # of its prompt
    cached_tokens: int = 0                     # of those, whose KV was reused (prefix cache or restore)


def logprobs(tokens: Sequence, text_offset: int, as_ids: bool = False) -> dict:
    """OpenAI's completions logprobs of these TurnEvent.Tokens, the first at text_offset of the choice's
    text: tokens, token_logprobs, top_logprobs (the sampled token and the likeliest ones, as vLLM) and
    text_offset (where each token's text begins)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        name = f"token_id:{t.id}" if as_ids else t.piece
        out["tokens"].append(name)
        out["token_logprobs"].append(max(float(t.logprob), oa.LOGPROB_FLOOR))
        top = {name: max(float(t.logprob), oa.LOGPROB_FLOOR)}
        for alt in t.top_logprobs:
            top.setdefault(f"token_id:{alt.id}" if as_ids else alt.piece, max(float(alt.logprob), oa.LOGPROB_FLOOR))
        out["top_logprobs"].append(top)
        out["text_offset"].append(text_offset)
        text_offset += len(t.text)
    return out


def usage(choices: Sequence[Choice], n: int) -> dict:
    """The usage object: each prompt once (the first of its n choices), every choice's tokens."""
    firsts = [c for c in choices if c.index % n == 0]
    prompt = sum(c.prompt_tokens for c in firsts)
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts)}}


def choice_object(choice: Choice, req: CompletionsRequest, text_offset: int = 0) -> dict:
    """A choice of the completion (echoed text's tokens carry no logprobs: echo excludes logprobs)."""
    return {"index": choice.index, "text": choice.text,
            "logprobs": None if req.logprobs is None else logprobs(choice.tokens, text_offset,
                                                                   req.token_ids_as_tokens),
            "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason, "prompt_logprobs": None}


def completion(completion_id: str, req: CompletionsRequest, choices: Sequence[Choice]) -> dict:
    """A `text_completion` object of the choices (in index order)."""
    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": req.model,
            "choices": [choice_object(c, req) for c in sorted(choices, key=lambda c: c.index)],
            "usage": usage(choices, req.n)}


def chunk(completion_id: str, model: str, index: int, text: str, logprobs_object: dict | None = None,
          finish_reason: str | None = None, reason: str | int | None = None) -> dict:
    """A streamed `text_completion` chunk of choice `index`."""
    choice = {"index": index, "text": text, "logprobs": logprobs_object, "finish_reason": finish_reason,
              "stop_reason": reason}
    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice]}


def usage_chunk(completion_id: str, model: str, choices: Sequence[Choice], n: int) -> dict:
    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [], "usage": usage(choices, n)}


def model_object(model: str) -> dict:
    """GET /v1/models/{id}'s object (as /v1/models lists it)."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "kvtestbed"}


def check_model(requested: str, served: str) -> None:
    """NOT_FOUND in OpenAI's words unless the request names the served model."""
    if requested != served:
        raise ChatError("NOT_FOUND", f"the model {requested!r} does not exist; this server serves {served!r} "
                        "(GET /v1/models)", "model")
