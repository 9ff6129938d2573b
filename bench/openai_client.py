"""A light stateless OpenAI chat client (aiohttp): the whole history in every request, no session header.

What ChatGPT-style apps, LangChain and multi-turn benchmarks do: the server is told nothing but the
messages, so whatever KV it reuses it finds by the prompt's content. Streams the reply and times
the first token from the request's start; the usage chunk says how many prompt tokens were cached.
An optional per-request timeout closes a stream that has not ended in time (ChatTimedOut).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence

import aiohttp

logger = logging.getLogger(__name__)

Message = dict[str, str]


class ChatFailed(RuntimeError):
    """The server refused the request or broke off the stream."""


@dataclasses.dataclass
class Reply:
    """One completion as the client saw it (times in seconds from the request's start)."""

    text: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    started_s: float = 0.0  # when it was sent, on the caller's clock (time.perf_counter)
    session_id: str = ""    # the context the frontend ran the turn in (its X-Session-Id header)


def messages_of(system: str | None, turns: Sequence[tuple[str, str]], question: str) -> list[Message]:
    """The messages of a conversation: system?, each (question, answer) so far, the new question."""
    out = [{"role": "system", "content": system}] if system else []
    for q, a in turns:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out + [{"role": "user", "content": question}]


@dataclasses.dataclass
class _Stream:
    """What a stream has brought so far."""

    first: float | None = None
    parts: list[str] = dataclasses.field(default_factory=list)
    usage: dict | None = None
    finish: str = ""
    session_id: str = ""


class ChatTimedOut(ChatFailed):
    """The reply did not end within the request's timeout (the stream was closed): when its first text
    came (ttft_s, None if none did), the text so far and the context it ran in."""

    def __init__(self, timeout_s: float, ttft_s: float | None, text: str, session_id: str):
        super().__init__(f"no end within {timeout_s:g} s")
        self.timeout_s, self.ttft_s, self.text, self.session_id = timeout_s, ttft_s, text, session_id


async def chat(session: aiohttp.ClientSession, base_url: str, token: str, model: str,
               messages: list[Message], max_tokens: int, timeout_s: float | None = None) -> Reply:
    """One streamed greedy completion; ChatFailed on an HTTP error or an error event; with timeout_s,
    ChatTimedOut when the stream has not ended timeout_s after the request was sent."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    return await send(session, base_url, token, body, timeout_s)


async def send(session: aiohttp.ClientSession, base_url: str, token: str, body: dict,
               timeout_s: float | None = None) -> Reply:
    """chat() with a request body of the caller's (streamed, with its usage chunk: `stream` and
    `stream_options.include_usage` must be set), such as another client's recorded payload."""
    start = time.perf_counter()
    seen = _Stream()
    try:
        await asyncio.wait_for(_stream(session, base_url, token, body, seen), timeout_s)
    except asyncio.TimeoutError:
        if timeout_s is None or time.perf_counter() - start < timeout_s:
            raise  # not ours: the session's own timeout
        raise ChatTimedOut(timeout_s, None if seen.first is None else seen.first - start, "".join(seen.parts),
                           seen.session_id) from None
    end = time.perf_counter()
    usage = seen.usage
    if usage is None:
        raise ChatFailed("the stream ended without its usage chunk")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Reply("".join(seen.parts), (seen.first or end) - start, end - start, usage["prompt_tokens"],
                 cached, usage["completion_tokens"], seen.finish, start, seen.session_id)


async def _stream(session: aiohttp.ClientSession, base_url: str, token: str, body: dict,
                  seen: _Stream) -> None:
    """POST the request and read its events into `seen` as they come."""
    async with session.post(f"{base_url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {token}"}) as response:
        seen.session_id = response.headers.get("X-Session-Id", "")
        if response.status != 200:
            raise ChatFailed(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise ChatFailed(f"error event: {event['error'].get('message')}")
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    seen.first = seen.first or time.perf_counter()
                    seen.parts.append(text)
                seen.finish = choice.get("finish_reason") or seen.finish
            seen.usage = event.get("usage") or seen.usage


async def model_name(session: aiohttp.ClientSession, base_url: str, token: str) -> str:
    """The model the server serves (GET /v1/models)."""
    async with session.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {token}"}) as response:
        if response.status != 200:
            raise ChatFailed(f"GET /v1/models: HTTP {response.status}")
        return (await response.json())["data"][0]["id"]
