"""OpenAI chat-completions requests and responses, to and from a frontend turn. Pure.

The frontend keeps each conversation's transcript (and its KV lives on the storage nodes), so
a request maps onto a turn like this:

- With `X-Session-Id: CONTEXT_ID` the last message (role `user`) is the new turn. The messages
  before it may be left out, or must be the stored transcript exactly (user, assistant, ...),
  as a client that resends the whole history sends them; anything else is a 400.
- Without it, a new context starts from the request's only user message; a history without a
  session id is a 400 (the frontend could not reuse its KV).
- A `system` message must be the frontend's configured system prompt (it is part of the KV).
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Sequence

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


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """What a chat-completions request asks of one turn."""

    message: str
    history: tuple[tuple[str, str], ...]   # (role, content) before the last message
    model: str
    stream: bool
    include_usage: bool
    max_new_tokens: int
    sampling: compute_pb2.Sampling


def error_body(code: str, message: str, param: str | None = None) -> tuple[int, dict]:
    """(HTTP status, OpenAI error object) of a ChatError code."""
    status, kind = HTTP_STATUS.get(code, (500, "internal_error"))
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code.lower()}}


def _bad(message: str) -> ChatError:
    return ChatError("INVALID_ARGUMENT", message)


def _content(message: Any, index: int) -> tuple[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _bad(f"messages[{index}] must be an object with a role")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise _bad(f"messages[{index}]: only text content parts are supported")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise _bad(f"messages[{index}].content must be a string")
    return message["role"], content


def _number(body: dict, name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and value != int(value)):
        raise _bad(f"{name} must be a{'n integer' if kind is int else ' number'}")
    return kind(value)


def parse_request(raw: bytes, system_prompt: str) -> CompletionRequest:
    """The turn a request body asks for (INVALID_ARGUMENT when it is not one)."""
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list")
    pairs = [_content(m, i) for i, m in enumerate(messages)]
    for role, content in pairs:
        if role == "system" and content != system_prompt:
            raise _bad("a system message must be the frontend's system prompt "
                       f"({system_prompt!r}); it is configured, not sent")
        if role not in ("system", "user", "assistant"):
            raise _bad(f"unsupported role {role!r}")
    pairs = [p for p in pairs if p[0] != "system"]
    if not pairs or pairs[-1][0] != "user":
        raise _bad("the last message must be from the user")
    if _number(body, "n", int, 1) != 1:
        raise _bad("n must be 1")
    max_new = _number(body, "max_completion_tokens", int, None)
    max_new = _number(body, "max_tokens", int, 0) if max_new is None else max_new
    if max_new < 0:
        raise _bad("max_tokens must not be negative")
    options = body.get("stream_options") or {}
    sampling = compute_pb2.Sampling(temperature=_number(body, "temperature", float, 0.0),
                                    top_p=_number(body, "top_p", float, 0.0),
                                    seed=max(0, _number(body, "seed", int, 0)))
    return CompletionRequest(pairs[-1][1], tuple(pairs[:-1]), body["model"], bool(body.get("stream")),
                             isinstance(options, dict) and bool(options.get("include_usage")),
                             max_new, sampling)


def check_history(history: Sequence[tuple[str, str]], stored: Sequence[tuple[str, str]],
                  continued: bool) -> None:
    """INVALID_ARGUMENT unless the earlier messages are absent or the stored transcript.

    `stored` holds (user message, reply) per stored turn.
    """
    if not history:
        return
    if not continued:
        raise _bad("a conversation with history needs its X-Session-Id header (the context id the "
                   "first response returned); without it a request starts a new context")
    expected = [pair for user, reply in stored for pair in (("user", user), ("assistant", reply))]
    if list(history) != expected:
        raise _bad(f"the earlier messages ({len(history)}) do not match the session's transcript "
                   f"({len(expected)} messages); send only the new user message, or the transcript as "
                   "the responses gave it")


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
