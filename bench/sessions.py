"""Chat sessions through the frontend, as users would run them: each a thread with its own client."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from chat_client.client import FrontendClient

TOPICS = ("the storage node", "the SmartNIC agent", "the compute node", "the chat frontend",
          "a trigger counter", "the KV cache", "an eviction timer", "a queue pair")


def script(index: int, turns: int) -> list[str]:
    """The messages of conversation `index` (len(TOPICS) distinct openings, short follow-ups)."""
    topic = TOPICS[index % len(TOPICS)]
    first = f"In five words, what is {topic}?"
    follow = ["Say it again, shorter.", "Give one more word.", "Now one synonym.", "Thanks, and?"]
    return [first, *follow[:max(turns - 1, 0)]]


@dataclasses.dataclass
class TurnOutcome:
    """One turn: the reply and its figures (ms) as the frontend summarized them, and the client's TTFT."""

    reply: str
    client_ttft_ms: float
    summary: object


def run_session(address: str, token: str, messages: Sequence[str], max_new_tokens: int) -> list[TurnOutcome]:
    """One conversation, its turns back to back; raises on the first failed turn."""
    client = FrontendClient(address, token)
    out: list[TurnOutcome] = []
    context = ""
    try:
        for message in messages:
            begin = time.perf_counter()
            first_ms, texts, summary = None, [], None
            for event in client.chat(message, context, max_new_tokens):
                kind = event.WhichOneof("event")
                if kind == "text":
                    first_ms = first_ms or (time.perf_counter() - begin) * 1e3
                    texts.append(event.text)
                elif kind == "summary":
                    summary = event.summary
                context = context or event.context_id
            if summary is None:
                raise RuntimeError(f"turn {message!r} ended without a summary")
            out.append(TurnOutcome(summary.reply or "".join(texts), first_ms or summary.e2e_ms, summary))
    finally:
        client.close()
    return out


def run_concurrent(address: str, conversations: Sequence[tuple[str, Sequence[str]]], sessions: int,
                   max_new_tokens: int) -> tuple[list[list[TurnOutcome] | Exception], float]:
    """`sessions` concurrent sessions working through a queue of conversations ((token, messages),
    each its own user's), as ScaleLLM's and AIPerf's clients do: every session takes the next
    conversation as soon as its last one ended, until none is left. Per conversation its outcomes
    (or its error), and the wall time (s) from the common start to the last conversation's end."""
    results: list = [None] * len(conversations)
    taken = iter(range(len(conversations)))
    lock = threading.Lock()
    barrier = threading.Barrier(sessions + 1)

    def worker() -> None:
        barrier.wait()
        while True:
            with lock:
                k = next(taken, None)
            if k is None:
                return
            token, messages = conversations[k]
            try:
                results[k] = run_session(address, token, messages, max_new_tokens)
            except Exception as exc:  # noqa: BLE001 - reported per conversation by the caller
                results[k] = exc

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(sessions)]
    for t in threads:
        t.start()
    barrier.wait()
    begin = time.perf_counter()
    for t in threads:
        t.join()
    return results, time.perf_counter() - begin
