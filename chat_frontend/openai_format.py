"""OpenAI chat-completions requests and responses, to and from a frontend turn. Pure.

A request maps onto a turn of a context (the frontend keeps each context's transcript; its KV
lives on the storage nodes and is found by content):

- The last message (role `user`) is the new turn; the messages before it are an optional system
  message first, then the history, alternating user and assistant.
- A session the request names (X-Session-Id, or the header or `user` field the settings name)
  that its user already has continues that context: the history may be left out, or must be the
  stored transcript exactly, as a client that resends the whole history sends it.
- Otherwise (no session: a new context; or a session seen for the first time: that context) the
  whole conversation is the turn's prompt.
- A client's system message is part of the prompt; the configured one applies when it sends none.
  (`developer`, OpenAI's newer name for it, is taken as `system`.)
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from http import HTTPStatus
from typing import Any

from chat_frontend import limits
from chat_frontend.errors import ChatError
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
MAX_STOP = 4                             # OpenAI's limit on stop sequences


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """What a chat-completions request asks of one turn."""

    message: str
    history: tuple[tuple[str, str], ...]   # (role, content) between the system message and the last
    system: str | None                     # the client's system message; None: it sent none
    user: str                              # OpenAI's `user` field ("" when absent)
    model: str
    stream: bool
    include_usage: bool
    max_new_tokens: int
    sampling: compute_pb2.Sampling


def error_body(code: str, message: str, param: str | None = None) -> tuple[int, dict]:
    """(HTTP status, OpenAI error object) of a ChatError code."""
    status, kind = HTTP_STATUS.get(code, (500, "internal_error"))
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code.lower()}}


def http_error_body(status: int, message: str) -> dict:
    """OpenAI's error object for an HTTP error aiohttp raised (413, 404, 405, an unparsable request)."""
    kind = "not_found_error" if status == 404 else \
        "invalid_request_error" if status < 500 else "internal_error"
    try:
        code = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        code = str(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _bad(message: str, param: str | None = None) -> ChatError:
    return ChatError("INVALID_ARGUMENT", message, param)


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, float) else repr(value)  # NaN, Infinity as JSON says
    return text if len(text) <= 40 else text[:37] + "..."


def _printable(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def lone_surrogate(body: Any) -> str | None:
    """Where the first string holding a lone surrogate (such as JSON's "\\ud800") is, or None.

    Such a string is valid JSON but not Unicode text: protobuf, the tokenizer and SQLite refuse it.
    """
    stack = [("", body)]
    while stack:  # not recursive: json.loads already bounded the depth, this keeps the stack flat
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "the body"
        elif isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{_printable(key)}" if path else _printable(key)
                if _printable(key) != key:
                    return where
                stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def _content(message: Any, index: int) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _bad(f"{where} must be an object with a role", where)
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise _bad(f"{where}: only text content parts (with a string `text`) are supported",
                       f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise _bad(f"{where}.content must be a string", f"{where}.content")
    if not isinstance(message.get("name", ""), str):
        raise _bad(f"{where}.name must be a string", f"{where}.name")
    return message["role"], content


def _number(body: dict, name: str, kind: type, default: Any, low: float, high: float) -> Any:
    """The field as int or float within [low, high]; INVALID_ARGUMENT if it is not one."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not (math.isfinite(value) and (kind is float or value.is_integer()))) \
            or not low <= value <= high:
        what = "an integer" if kind is int else "a number"
        raise _bad(f"{name} must be {what} in [{low}, {high}], got {_shown(value)}", name)
    return kind(value)


def _flag(body: dict, name: str, where: str = "") -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _bad(f"{where or name} must be true or false, got {_shown(value)}", where or name)
    return bool(value)


def _check_other_fields(body: dict) -> None:
    """stop (only empty: not supported), user and stream_options must have OpenAI's types."""
    stop = body.get("stop")
    if not (stop is None or isinstance(stop, str) or
            (isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(s, str) for s in stop))):
        raise _bad(f"stop must be a string or a list of at most {MAX_STOP} strings", "stop")
    if stop:
        raise _bad("stop sequences are not supported: the reply ends at the model's end of turn "
                   "or at max_tokens", "stop")
    if not isinstance(body.get("user", ""), str):
        raise _bad("user must be a string", "user")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")


def split_messages(pairs: list[tuple[str, str]]) -> tuple[str | None, list[tuple[str, str]], str]:
    """(system message or None, history, new user message); INVALID_ARGUMENT unless the messages
    are an optional system message, then user and assistant in turn, ending with the user."""
    system = None
    if pairs and pairs[0][0] in ("system", "developer"):
        system, pairs = pairs[0][1], pairs[1:]
    for i, (role, _) in enumerate(pairs):
        if role in ("system", "developer"):
            raise _bad("a system message must be the first message", "messages")
        if role not in ("user", "assistant"):
            raise _bad(f"unsupported role {role[:40]!r}", "messages")
        if role != ("user" if i % 2 == 0 else "assistant"):
            raise _bad("after the system message, messages must alternate user and assistant, starting "
                       "with the user", "messages")
    if not pairs or pairs[-1][0] != "user":
        raise _bad("the last message must be from the user", "messages")
    return system, pairs[:-1], pairs[-1][1]


def parse_request(raw: bytes, max_tokens_cap: int) -> CompletionRequest:
    """The turn a request body asks for (INVALID_ARGUMENT when it is not one).

    Every number is range-checked here, before it reaches protobuf (whose fields are 32- and
    64-bit) or the compute node's torch.
    """
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, an int of 4300+ digits
        raise _bad(f"the body is not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    if (where := lone_surrogate(body)) is not None:
        raise _bad(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not Unicode text",
                   where)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model is required", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    system, history, message = split_messages([_content(m, i) for i, m in enumerate(messages)])
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise _bad(f"n must be 1 (one choice per request), got {_shown(body['n'])}", "n")
    max_new = _number(body, "max_completion_tokens", int, None, 0, max_tokens_cap)
    max_new = _number(body, "max_tokens", int, 0, 0, max_tokens_cap) if max_new is None else max_new
    _check_other_fields(body)
    options = body.get("stream_options") or {}
    seed = _number(body, "seed", int, 0, *SEED_RANGE)
    sampling = compute_pb2.Sampling(temperature=_number(body, "temperature", float, 0.0, *TEMPERATURE_RANGE),
                                    top_p=_number(body, "top_p", float, 0.0, 0.0, 1.0),
                                    seed=seed % (1 << 64))  # int64 to the proto's uint64, one to one
    return CompletionRequest(message, tuple(history), system, body.get("user") or "", body["model"],
                             _flag(body, "stream"),
                             _flag(options, "include_usage", "stream_options.include_usage"), max_new, sampling)


def usage(summary: frontend_pb2.TurnSummary) -> dict:
    """The OpenAI usage object of a turn: cached tokens are the ones whose KV was reused."""
    prompt = summary.tokens_prefilled + summary.tokens_reused
    return {"prompt_tokens": prompt, "completion_tokens": summary.tokens_out,
            "total_tokens": prompt + summary.tokens_out,
            "prompt_tokens_details": {"cached_tokens": summary.tokens_reused}}


def completion(completion_id: str, model: str, summary: frontend_pb2.TurnSummary) -> dict:
    """A `chat.completion` object."""
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": summary.reply},
                         "logprobs": None, "finish_reason": summary.finish_reason or "stop"}],
            "usage": usage(summary)}


def chunk(completion_id: str, model: str, delta: dict | None, finish_reason: str | None = None,
          summary: frontend_pb2.TurnSummary | None = None) -> dict:
    """A `chat.completion.chunk`; with summary (and no delta), the usage chunk."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices}
    if summary is not None:
        body["usage"] = usage(summary)
    return body


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: JSON` (or a literal such as [DONE])."""
    text = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
