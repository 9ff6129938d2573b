"""A light stateless OpenAI chat client (aiohttp): the whole history in every request, no session header.

What ChatGPT-style apps, LangChain and multi-turn benchmarks do: the server is told nothing but the
messages, so whatever KV it reuses it finds by the prompt's content. Streams the reply and times
the first token from the request's start; the usage chunk says how many prompt tokens were cached.
"""
from __future__ import annotations

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


def messages_of(system: str | None, turns: Sequence[tuple[str, str]], question: str) -> list[Message]:
    """The messages of a conversation: system?, each (question, answer) so far, the new question."""
    out = [{"role": "system", "content": system}] if system else []
    for q, a in turns:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out + [{"role": "user", "content": question}]


async def chat(session: aiohttp.ClientSession, base_url: str, token: str, model: str,
               messages: list[Message], max_tokens: int) -> Reply:
    """One streamed greedy completion; ChatFailed on an HTTP error or an error event."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, parts, usage, finish = None, [], None, ""
    async with session.post(f"{base_url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {token}"}) as response:
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
                    first = first or time.perf_counter()
                    parts.append(text)
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage") or usage
    end = time.perf_counter()
    if usage is None:
        raise ChatFailed("the stream ended without its usage chunk")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Reply("".join(parts), (first or end) - start, end - start, usage["prompt_tokens"], cached,
                 usage["completion_tokens"], finish, start)


async def model_name(session: aiohttp.ClientSession, base_url: str, token: str) -> str:
    """The model the server serves (GET /v1/models)."""
    async with session.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {token}"}) as response:
        if response.status != 200:
            raise ChatFailed(f"GET /v1/models: HTTP {response.status}")
        return (await response.json())["data"][0]["id"]
