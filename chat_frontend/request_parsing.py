"""Reading an OpenAI API request body: its JSON object, its fields' values, or the 400 naming one. Pure.

Every endpoint's parser (openai_format for chat, completions_format, tokenize_format) reads its body
with these: `load` (a JSON object of Unicode text), `flag` (true or false), `number` (an int or a
float within bounds; never a bool, NaN or infinity), `request_id`. A value that is not one is a
ChatError INVALID_ARGUMENT (`bad`) whose param names the field; a message shows a value shortened
(`shown`) and a key with its unprintable characters escaped (`printable`), never the request's bytes
at length. What each endpoint does with a field is request_fields' tables.
"""
from __future__ import annotations

import json
import math
from typing import Any

from chat_frontend.errors import ChatError

MAX_REQUEST_ID_CHARS = 240


def bad(message: str, param: str | None = None) -> ChatError:
    return ChatError("INVALID_ARGUMENT", message, param)


def shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, float) else repr(value)  # NaN, Infinity as JSON says
    return text if len(text) <= 40 else text[:37] + "..."


def printable(key: str) -> str:
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
                where = f"{path}.{printable(key)}" if path else printable(key)
                if printable(key) != key:
                    return where
                stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def load(raw: bytes) -> dict:
    """The body as a JSON object of Unicode text (no lone surrogate anywhere)."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, an int of 4300+ digits
        raise bad(f"the body is not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    if (where := lone_surrogate(body)) is not None:
        raise bad(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not Unicode text",
                  where)
    return body


def number(body: dict, name: str, kind: type, default: Any, low: float, high: float) -> Any:
    """The field as int or float within [low, high]; INVALID_ARGUMENT if it is not one."""
    return number_value(body.get(name), name, kind, default, low, high)


def number_value(value: Any, name: str, kind: type, default: Any, low: float, high: float) -> Any:
    """value (of the field `name`) as int or float within [low, high]; default when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not (math.isfinite(value) and (kind is float or value.is_integer()))) \
            or not low <= value <= high:
        what = "an integer" if kind is int else "a number"
        raise bad(f"{name} must be {what} in [{low}, {high}], got {shown(value)}", name)
    return kind(value)


def flag(body: dict, name: str, where: str = "", default: bool = False) -> bool:
    """The field as a bool; `where` names it in the error when it sits inside an object (stream_options.x)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{where or name} must be true or false, got {shown(value)}", where or name)
    return value


def request_id(body: dict) -> str:
    """vLLM's request_id field: printable text of at most MAX_REQUEST_ID_CHARS ("" when absent)."""
    rid = body.get("request_id") or ""
    if not isinstance(rid, str) or len(rid) > MAX_REQUEST_ID_CHARS or not rid.isprintable():
        raise bad(f"request_id must be printable text of at most {MAX_REQUEST_ID_CHARS} characters",
                  "request_id")
    return rid
