"""OpenAI chat-completions requests and responses, to and from a frontend turn. Pure.

`FIELDS` is the one list of every request field and what happens to it (the README's table says
the same): supported (honoured, as vLLM's server honours it), accepted when it is the default
(a value that changes nothing here, e.g. `store: false`; any other value is 400 naming it) or
refused (400 naming it). A field not in the list is 400 naming it: nothing is silently dropped.

A request maps onto a turn of a context (the frontend keeps each context's transcript; its KV
lives on the storage nodes and is found by content):

- Messages that are an optional system message, then user and assistant in turn, ending with the
  user's (the usual case): the last one is the new turn, the others its history. A session the
  request names (X-Session-Id, or the header or `user` field the settings name) that its user
  already has continues that context: the history may be left out, or must be the stored
  transcript exactly. Otherwise the whole conversation is the turn's prompt.
- Any other sequence (two messages of one role in a row, an assistant message first, a system
  message later, a trailing assistant message; or `add_generation_prompt: false`) is rendered whole
  by the chat template, as vLLM does, and starts a new context (`Whole`). A trailing assistant
  message is closed and followed by a new assistant turn, or with `continue_final_message` continued.
- A client's system message is part of the prompt; the configured one applies when it sends none.
  (`developer`, OpenAI's newer name for it, is taken as `system`.)

Sampling defaults are vLLM's: temperature 1.0 (top_p, top_k, min_p, repetition_penalty off) unless
the model's generation config sets them (`apply_defaults`); a random seed when none is sent.
"""
from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from chat_frontend import limits
from chat_frontend import request_fields as rf
from chat_frontend import request_parsing as rp
from chat_frontend.conversation import Whole
from chat_frontend.request_fields import SHARED, Field
from chat_frontend.request_fields import default as _default
from chat_frontend.request_fields import empty as _empty
from chat_frontend.request_fields import no as _no
from chat_frontend.request_fields import null_or as _null_or
from chat_frontend.request_fields import yes as _yes
from kvtb_proto import compute_pb2, frontend_pb2

# ChatError code -> (HTTP status, OpenAI error type)
HTTP_STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout"),
}


SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # OpenAI's (and vLLM's): int64
TEMPERATURE_RANGE = (0.0, limits.MAX_TEMPERATURE)
MAX_STOP = 16                # stop strings (the compute node's bound)
MAX_STOP_CHARS = 256         # characters of one
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300         # entries
MAX_TOKEN_ID = (1 << 31) - 1  # the compute node checks ids against its vocabulary
MAX_TOP_LOGPROBS = 20        # OpenAI's and vLLM's
MAX_SCHEMA_BYTES = 64 * 1024  # a response_format json_schema as JSON text (the compute node's bound)
LOGPROB_FLOOR = -9999.0      # vLLM's stand-in for -inf (JSON has no infinity)
TOOLS_REFUSED = "this model's chat template has no tool-call format; tool calling is not supported"
# vLLM's defaults when neither the request nor the model's generation config sets them
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 0.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 0.0}

def _no_tools(value: Any, body: dict) -> bool:
    """tools: none, or any with tool_choice "none" (then they are not offered to the model)."""
    return _empty(value, body) or body.get("tool_choice") == "none"


def _tool_choice(value: Any, body: dict) -> bool:
    return value is None or value == "none" or (value == "auto" and _empty(body.get("tools"), body))


def _function_call(value: Any, body: dict) -> bool:
    return value is None or value == "none" or (value == "auto" and _empty(body.get("functions"), body))


# Every field of a chat-completions request (OpenAI's, then vLLM's extras): the one place that says
# what happens to each. A null value is the field left out.
FIELDS: dict[str, Field] = {
    **SHARED,
    "messages": _yes("roles system/developer, user, assistant in any order; text content (parts); each "
                     "message's fields as MESSAGE_FIELDS says"),
    "logprobs": _yes(),
    "top_logprobs": _yes("0-20, needs logprobs"),
    "max_tokens": _yes("at least 1, at most what the context leaves after the prompt (past it: "
                       "context_length_exceeded); absent: what it leaves; settings max_new_tokens_default "
                       "and max_new_tokens_cap lower it"),
    "max_completion_tokens": _yes("as max_tokens; wins over it"),
    "n": _yes("1 to the frontend's max_n; the choices share the prompt's blocks"),
    "stop": _yes("a string or up to 16, not streamed"),
    "user": _yes("names the session when the settings say so"),
    "tools": _default("[] or with tool_choice \"none\" (not rendered): " + TOOLS_REFUSED, _no_tools),
    "tool_choice": _default("\"none\", or \"auto\" with no tools", _tool_choice),
    "parallel_tool_calls": _default("any, with no tools", lambda value, body: _empty(body.get("tools"), body)
                                    or body.get("tool_choice") == "none"),
    "functions": _default("[]: " + TOOLS_REFUSED, _empty),
    "function_call": _default("\"none\", or \"auto\" with no functions", _function_call),
    "audio": _no("text output only"),
    "modalities": _default("[\"text\"]", _null_or(["text"])),
    "prediction": _no("predicted outputs are not supported"),
    "reasoning_effort": _no("the model does not reason"),
    "service_tier": _default("\"auto\" or \"default\"", _null_or("auto", "default")),
    "store": _default("false (completions are not stored for OpenAI's dashboard)", _null_or(False)),
    "metadata": _default("{} (only meaningful with store)", _empty),
    "web_search_options": _no("web search is not supported"),
    # vLLM's sampling parameters
    # vLLM's extra parameters
    "echo": _default("false", _null_or(False)),
    "add_generation_prompt": _yes("default true"),
    "continue_final_message": _yes("needs a trailing assistant message and add_generation_prompt false"),
    "add_special_tokens": _default("false (the template adds them)", _null_or(False)),
    "documents": _default("[] (the template has no documents)", _empty),
    "chat_template": _no("the model's own template only"),
    "chat_template_kwargs": _default("{} (the template takes none)", _empty),
    "mm_processor_kwargs": _default("{} (text only)", _empty),
    "request_id": _yes("the response's id is chatcmpl-<request_id>"),
    "include_reasoning": _default("any (the model produces no reasoning)", lambda value, body: True),
}

# Every field of a message (OpenAI's message params, vLLM's additions) and of a content part, as FIELDS
# for the body: a field not listed is 400 naming it (messages[i].field, messages[i].content[j].field).
MESSAGE_FIELDS: dict[str, Field] = {
    "role": _yes("system (developer), user, assistant; tool and function are refused: " + TOOLS_REFUSED),
    "content": _yes("a string or text parts; null or absent: empty"),
    "name": _yes("a string; not rendered: the model's chat template has no place for it"),
    "tool_calls": _default("null or []: " + TOOLS_REFUSED, _empty),
    "function_call": _default("null or {}: " + TOOLS_REFUSED, _empty),
    "tool_call_id": _default("null: " + TOOLS_REFUSED, _null_or()),
    "tools": _default("null or [] (vLLM's per-message tools): " + TOOLS_REFUSED, _empty),
    "refusal": _default("null or \"\" (an assistant's refusal has no place in the chat template)", _empty),
    "audio": _default("null (text output only)", _null_or()),
    "annotations": _default("null or [] (web search citations; web search is not supported)", _empty),
    "reasoning": _default("null or \"\" (the model does not reason)", _empty),
    "reasoning_content": _default("null or \"\" (the model does not reason)", _empty),
}
CONTENT_PART_FIELDS: dict[str, Field] = {
    "type": _yes("\"text\" only: image, audio, file and refusal parts are refused"),
    "text": _yes("a string"),
}


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """What a chat-completions request asks of one turn (and its n choices)."""

    message: str
    history: tuple[tuple[str, str], ...]   # (role, content) between the system message and the last
    system: str | None                     # the client's system message; None: it sent none
    user: str                              # OpenAI's `user` field ("" when absent)
    model: str
    stream: bool
    include_usage: bool
    max_new_tokens: int                    # 0: absent (what the context leaves)
    sampling: compute_pb2.Sampling
    n: int = 1
    ignore_eos: bool = False
    whole: Whole | None = None             # messages the template renders whole (not alternation)
    logprobs: bool = False
    token_ids_as_tokens: bool = False      # return_tokens_as_token_ids
    request_id: str = ""
    given: frozenset[str] = frozenset()    # sampling fields the request set (the rest take defaults)
    max_tokens_param: str = "max_tokens"   # the field that gave max_new_tokens (max_completion_tokens wins)


def error_body(code: str, message: str, param: str | None = None,
               openai_code: str | None = None) -> tuple[int, dict]:
    """(HTTP status, OpenAI error object) of a ChatError code; `code` is OpenAI's own where the error
    has one (openai_code: context_length_exceeded), else the status code's name."""
    status, kind = HTTP_STATUS.get(code, (500, "internal_error"))
    return status, {"error": {"message": message, "type": kind, "param": param,
                              "code": openai_code or code.lower()}}


def http_error_body(status: int, message: str) -> dict:
    """OpenAI's error object for an HTTP error aiohttp raised (413, 404, 405, an unparsable request)."""
    kind = "not_found_error" if status == 404 else \
        "invalid_request_error" if status < 500 else "internal_error"
    try:
        code = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        code = str(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# The compute node's names of Sampling fields (in its INVALID_ARGUMENT messages) -> the request's
NODE_PARAMS = {"structured": "response_format", "stop": "stop"}


def param_of(message: str) -> str | None:
    """The request field a compute node's refusal names (`sampling.top_k` -> top_k), or None."""
    found = re.search(r"sampling\.(\w+)", message)
    if found is None:
        return "response_format" if "json_schema" in message or "json_object" in message else None
    name = found.group(1)
    return NODE_PARAMS.get(name, name if name in FIELDS else None)


def check_fields(body: dict) -> None:
    """INVALID_ARGUMENT naming the first field that is unknown, refused, or not its default."""
    rf.check_fields(body, FIELDS, "chat completions")


def _content(message: Any, index: int) -> tuple[str, str]:
    """(role, text) of messages[index]; INVALID_ARGUMENT naming the first field (or content part's
    field) that is unknown, refused or not its default, as MESSAGE_FIELDS says."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise rp.bad(f"{where} must be an object with a role", where)
    role = "system" if message["role"] == "developer" else message["role"]
    if role in ("tool", "function"):
        raise rp.bad(f"{where} has role {role!r}: {TOOLS_REFUSED}", f"{where}.role")
    if role not in ("system", "user", "assistant"):
        raise rp.bad(f"{where}: unsupported role {role[:40]!r}", f"{where}.role")
    rf.check_keys(message, MESSAGE_FIELDS, where, "a chat message")
    content = message.get("content")
    if content is None:  # an assistant message may leave it out (OpenAI's schema)
        content = ""
    if isinstance(content, list):  # content parts: only text
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise rp.bad(f"{where}: only text content parts (with a string `text`) are supported",
                         f"{where}.content")
        for j, part in enumerate(content):
            rf.check_keys(part, CONTENT_PART_FIELDS, f"{where}.content[{j}]", "a text content part")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise rp.bad(f"{where}.content must be a string", f"{where}.content")
    if not isinstance(message.get("name") or "", str):
        raise rp.bad(f"{where}.name must be a string", f"{where}.name")
    return role, content


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if not (stops is None or (isinstance(stops, list) and len(stops) <= MAX_STOP and
                              all(isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stops))):
        raise rp.bad(f"stop must be a string or a list of at most {MAX_STOP} strings, each of 1 to "
                     f"{MAX_STOP_CHARS} characters", "stop")
    return stops or []


def _token_ids(body: dict, name: str, bound: int) -> list[int]:
    ids = body.get(name) or []
    if not (isinstance(ids, list) and len(ids) <= bound and
            all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_TOKEN_ID for i in ids)):
        raise rp.bad(f"{name} must be a list of at most {bound} token ids", name)
    return ids


def _logit_bias(body: dict) -> dict[int, float]:
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise rp.bad(f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token ids", "logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) <= MAX_TOKEN_ID):
            raise rp.bad(f"logit_bias keys must be token ids, got {rp.shown(key)}", "logit_bias")
        out[int(key)] = rp.number_value(value, "logit_bias", float, 0.0, -100.0, 100.0)
    return out


def _structured(body: dict) -> compute_pb2.StructuredOutput | None:
    """response_format (or vLLM's guided_json) as the compute node's StructuredOutput; None: free text."""
    schema = body.get("guided_json")
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise rp.bad("response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
                         "response_format")
        if fmt["type"] == "json_object":
            return compute_pb2.StructuredOutput(json_object=True)
        if fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                    or not isinstance(spec.get("schema", {}), dict):
                raise rp.bad("response_format.json_schema must be an object with a name and a schema object",
                             "response_format")
            schema = spec.get("schema", {})
    if schema is None:
        return None
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if not isinstance(schema, (str, dict)) or len(text.encode()) > MAX_SCHEMA_BYTES:
        raise rp.bad(f"the JSON schema must be an object of at most {MAX_SCHEMA_BYTES} bytes as JSON",
                     "guided_json" if fmt is None else "response_format")
    return compute_pb2.StructuredOutput(json_schema=text)


def parse_sampling(body: dict, max_new: int, draw_seed: Callable[[], int]) -> compute_pb2.Sampling:
    """The Sampling the request's fields set (the ones left out stay 0: apply_defaults fills them);
    completions_format reads its sampling fields with it too."""
    logprobs = rp.flag(body, "logprobs")
    top_logprobs = rp.number(body, "top_logprobs", int, 0, 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise rp.bad("top_logprobs needs logprobs: true", "top_logprobs")
    seed = rp.number(body, "seed", int, None, *SEED_RANGE)
    top_p = rp.number(body, "top_p", float, 0.0, 0.0, 1.0)
    if body.get("top_p") is not None and top_p == 0.0:
        raise rp.bad("top_p must be in (0, 1], got 0", "top_p")
    repetition = rp.number(body, "repetition_penalty", float, 0.0, 0.0, 2.0)
    if body.get("repetition_penalty") is not None and repetition == 0.0:
        raise rp.bad("repetition_penalty must be in (0, 2], got 0", "repetition_penalty")
    min_tokens = rp.number(body, "min_tokens", int, 0, 0, max_new)
    sampling = compute_pb2.Sampling(
        temperature=rp.number(body, "temperature", float, 0.0, *TEMPERATURE_RANGE), top_p=top_p,
        seed=(draw_seed() if seed is None else seed) % (1 << 64),  # int64 to the proto's uint64, one to one
        top_k=rp.number(body, "top_k", int, 0, -1, MAX_TOKEN_ID),
        min_p=rp.number(body, "min_p", float, 0.0, 0.0, 1.0),
        presence_penalty=rp.number(body, "presence_penalty", float, 0.0, -2.0, 2.0),
        frequency_penalty=rp.number(body, "frequency_penalty", float, 0.0, -2.0, 2.0),
        repetition_penalty=repetition, logit_bias=_logit_bias(body),
        stop_token_ids=_token_ids(body, "stop_token_ids", MAX_STOP_TOKEN_IDS), stop=_stop(body),
        include_stop_str_in_output=rp.flag(body, "include_stop_str_in_output"), min_tokens=min_tokens,
        logprobs=logprobs, top_logprobs=top_logprobs)
    structured = _structured(body)
    if structured is not None:
        sampling.structured.CopyFrom(structured)
    return sampling


def apply_defaults(sampling: compute_pb2.Sampling, given: frozenset[str],
                   generation_defaults: Mapping[str, float]) -> compute_pb2.Sampling:
    """The sampling with the fields the request left out set as vLLM sets them: the model's
    generation config's value (Info.generation_defaults), else vLLM's default (temperature 1.0)."""
    out = compute_pb2.Sampling()
    out.CopyFrom(sampling)
    for name, default in SAMPLING_DEFAULTS.items():
        if name not in given:
            value = generation_defaults.get(name, default)
            setattr(out, name, int(value) if name == "top_k" else float(value))
    return out


def split_messages(pairs: list[tuple[str, str]]) -> tuple[str | None, list[tuple[str, str]], str] | None:
    """(system message or None, history, new user message) when the messages are an optional system
    message, then user and assistant in turn, ending with the user; else None (rendered whole)."""
    system = None
    if pairs and pairs[0][0] == "system":
        system, pairs = pairs[0][1], pairs[1:]
    expected = ("user", "assistant")
    if not pairs or pairs[-1][0] != "user" or any(role != expected[i % 2] for i, (role, _) in enumerate(pairs)):
        return None
    return system, pairs[:-1], pairs[-1][1]


def parse_messages(body: dict) -> tuple[list[tuple[str, str]], bool, bool]:
    """(role, content) of each message, add_generation_prompt, continue_final_message (as /tokenize's
    messages are read too)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise rp.bad("messages must be a non-empty list", "messages")
    pairs = [_content(m, i) for i, m in enumerate(messages)]
    generation_prompt = rp.flag(body, "add_generation_prompt", default=True)
    continue_final = rp.flag(body, "continue_final_message")
    if continue_final and generation_prompt:
        raise rp.bad("continue_final_message and add_generation_prompt cannot both be true: set "
                     "add_generation_prompt to false to continue the last message", "continue_final_message")
    if continue_final and pairs[-1][0] != "assistant":
        raise rp.bad("continue_final_message needs the last message to be the assistant's",
                     "continue_final_message")
    return pairs, generation_prompt, continue_final


def parse_request(raw: bytes, max_n: int = 1,
                  draw_seed: Callable[[], int] = lambda: secrets.randbits(64)) -> CompletionRequest:
    """The turn a request body asks for (INVALID_ARGUMENT when it is not one).

    Every number is range-checked here, before it reaches protobuf (whose fields are 32- and
    64-bit) or the compute node's torch; max_tokens against the context once the prompt's tokens
    are known (limits.max_new_tokens).
    """
    body = rp.load(raw)
    check_fields(body)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise rp.bad("model is required", "model")
    pairs, generation_prompt, continue_final = parse_messages(body)
    split = split_messages(pairs) if generation_prompt else None
    n = rp.number(body, "n", int, 1, 1, max_n)
    tokens_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_new = rp.number(body, tokens_param, int, 0, 1, limits.MAX_TOKENS)
    if not isinstance(body.get("user", ""), (str, type(None))):
        raise rp.bad("user must be a string", "user")
    options = {} if body.get("stream_options") is None else body["stream_options"]
    if body.get("stream_options") is not None and not rp.flag(body, "stream"):
        raise rp.bad("stream_options needs stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise rp.bad("stream_options must be an object of include_usage (and continuous_usage_stats false)",
                     "stream_options")
    if rp.flag(options, "continuous_usage_stats", "stream_options.continuous_usage_stats"):
        raise rp.bad("stream_options.continuous_usage_stats is not supported: usage comes in the last chunk",
                     "stream_options.continuous_usage_stats")
    sampling = parse_sampling(body, max_new or limits.MAX_TOKENS, draw_seed)
    given = frozenset(name for name in SAMPLING_DEFAULTS if body.get(name) is not None)
    if split is None:
        message = next((content for role, content in reversed(pairs) if role == "user"), "")
        system, history, whole = None, (), Whole(tuple(pairs), generation_prompt, continue_final)
    else:
        (system, history, message), whole = split, None
    return CompletionRequest(message, tuple(history), system, body.get("user") or "", body["model"],
                             rp.flag(body, "stream"),
                             rp.flag(options, "include_usage", "stream_options.include_usage"), max_new,
                             sampling, n=n, ignore_eos=rp.flag(body, "ignore_eos"), whole=whole,
                             logprobs=sampling.logprobs,
                             token_ids_as_tokens=rp.flag(body, "return_tokens_as_token_ids"),
                             request_id=rp.request_id(body), given=given, max_tokens_param=tokens_param)


# Responses

def usage(summaries: list[frontend_pb2.TurnSummary]) -> dict:
    """The OpenAI usage object of a turn's choices: the prompt once (cached tokens are the ones whose
    KV was reused), the completion tokens of every choice."""
    first = summaries[0]
    prompt = first.tokens_prefilled + first.tokens_reused
    completion_tokens = sum(s.tokens_out for s in summaries)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": first.tokens_reused}}


def _token_entry(text: str, token_id: int, logprob: float, as_ids: bool) -> dict:
    token = f"token_id:{token_id}" if as_ids else text
    return {"token": token, "logprob": max(float(logprob), LOGPROB_FLOOR), "bytes": list(text.encode())}


def logprobs(tokens, as_ids: bool = False) -> dict:
    """OpenAI's chat logprobs object of these TurnEvent.Tokens: {"content": [...]}."""
    content = []
    for t in tokens:
        entry = _token_entry(t.piece, t.id, t.logprob, as_ids)
        entry["top_logprobs"] = [_token_entry(top.piece, top.id, top.logprob, as_ids) for top in t.top_logprobs]
        content.append(entry)
    return {"content": content}


def stop_reason(summary: frontend_pb2.TurnSummary | compute_pb2.TurnRecord,
                sampling: compute_pb2.Sampling) -> str | int | None:
    """vLLM's choices[i].stop_reason: the stop string, or the id of the request's stop token, that ended
    the reply (a turn's summary or its record); None for the model's own end of turn or max_tokens."""
    reason = summary.stop_reason
    if summary.finish_reason != "stop" or not reason:
        return None
    if reason in sampling.stop:
        return reason
    if reason.isdigit() and int(reason) in sampling.stop_token_ids:
        return int(reason)
    return None


def completion(completion_id: str, req: CompletionRequest, choices: list[tuple[frontend_pb2.TurnSummary, list]],
               ) -> dict:
    """A `chat.completion` object: choices [(summary, tokens)] in choice order."""
    out = [{"index": i, "message": {"role": "assistant", "content": summary.reply},
            "logprobs": logprobs(tokens, req.token_ids_as_tokens) if req.logprobs else None,
            "finish_reason": summary.finish_reason or "stop",
            "stop_reason": stop_reason(summary, req.sampling)}
           for i, (summary, tokens) in enumerate(choices)]
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": req.model,
            "choices": out, "usage": usage([summary for summary, _ in choices])}


def chunk(completion_id: str, model: str, delta: dict | None, finish_reason: str | None = None,
          summaries: list[frontend_pb2.TurnSummary] | None = None, index: int = 0,
          logprobs_object: dict | None = None, reason: str | int | None = None) -> dict:
    """A `chat.completion.chunk` of choice `index`; with summaries (and no delta), the usage chunk."""
    choice = {"index": index, "delta": delta, "logprobs": logprobs_object, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = reason
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [] if delta is None else [choice]}
    if summaries is not None:
        body["usage"] = usage(summaries)
    return body


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: JSON` (or a literal such as [DONE])."""
    text = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
