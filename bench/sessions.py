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


def run_session(address: str, token: str, messages: Sequence[str], max_new_tokens: int,
                start: threading.Barrier | None = None) -> list[TurnOutcome]:
    """One conversation, its turns back to back; raises on the first failed turn."""
    client = FrontendClient(address, token)
    out: list[TurnOutcome] = []
    context = ""
    try:
        if start is not None:
            start.wait()
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


def run_concurrent(address: str, tokens: Sequence[str], scripts: Sequence[Sequence[str]],
                   max_new_tokens: int) -> tuple[list[list[TurnOutcome] | Exception], float]:
    """All sessions at once (released together); their outcomes (or errors) and the wall time (s)."""
    results: list = [None] * len(scripts)
    barrier = threading.Barrier(len(scripts) + 1)

    def worker(i: int) -> None:
        try:
            results[i] = run_session(address, tokens[i], scripts[i], max_new_tokens, barrier)
        except Exception as exc:  # noqa: BLE001 - reported per session by the caller
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(scripts))]
    for t in threads:
        t.start()
    barrier.wait()
    begin = time.perf_counter()
    for t in threads:
        t.join()
    return results, time.perf_counter() - begin
