"""Multi-round QA in the shape of LMCache's benchmark: N users, R rounds each, think time between rounds.

Each user opens with a document of their own (LMCache's "user history") and a question, then asks
a short question per round, resending the whole conversation every time through the stateless
client (bench.openai_client), after an optional system prompt common to all users. Users start
staggered over one think time, so their rounds interleave on the compute node as they would in
a service. Texts are built here (seeded, no tokenizer); the server reports the tokens.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time

import aiohttp

from bench.openai_client import Reply, chat, messages_of

logger = logging.getLogger(__name__)

WORDS = ("storage", "node", "compute", "agent", "block", "cache", "memory", "request", "reply", "user",
         "model", "token", "layer", "queue", "counter", "trigger", "region", "fabric", "chunk", "restore",
         "prefix", "turn", "session", "context", "window", "policy", "network", "latency", "bandwidth",
         "file", "drive", "journal", "metric", "batch", "decode", "prefill")
QUESTIONS = ("In one sentence, what is this text about?", "Name one thing it mentions twice.",
             "Which word in it do you find most important?", "Summarise it in five words.",
             "What would you ask its author?", "Give it a short title.")


@dataclasses.dataclass(frozen=True)
class QaWorkload:
    """The shape of the workload (sizes in words: about one token each)."""

    users: int = 4
    rounds: int = 3
    context_words: int = 480
    system_words: int = 64        # 0: no system prompt
    think_s: float = 1.0
    max_new_tokens: int = 16
    seed: int = 0

    def __post_init__(self):
        if not (self.users > 0 and self.rounds > 1):
            raise ValueError("need users and at least two rounds (follow-ups)")
        if not (self.context_words >= 0 and self.system_words >= 0 and self.think_s >= 0):
            raise ValueError("context_words, system_words and think_s must not be negative")


def filler(words: int, seed: str) -> str:
    """`words` seeded words as sentences of eight."""
    rng = random.Random(seed)
    picked = [rng.choice(WORDS) for _ in range(words)]
    sentences = [" ".join(picked[i:i + 8]).capitalize() + "." for i in range(0, len(picked), 8)]
    return " ".join(sentences)


def system_prompt(w: QaWorkload) -> str | None:
    """The system prompt every user sends (None with system_words 0)."""
    if not w.system_words:
        return None
    return "You answer questions about the user's notes. " + filler(w.system_words, "system")


def first_message(w: QaWorkload, user: int) -> str:
    return f"My notes:\n{filler(w.context_words, f'{w.seed}:user{user}')}\n\n{QUESTIONS[0]}"


def question(round_no: int) -> str:
    """Round round_no's question (round 0 asks the first, with the notes)."""
    return QUESTIONS[round_no % len(QUESTIONS)]


@dataclasses.dataclass
class Round:
    """One round of one user."""

    user: int
    round: int
    reply: Reply | None = None
    error: str = ""


async def run_user(session: aiohttp.ClientSession, base_url: str, token: str, model: str, w: QaWorkload,
                   user: int, start_delay_s: float) -> list[Round]:
    """One user's rounds, the history resent each time; a failed round ends the user's conversation."""
    await asyncio.sleep(start_delay_s)
    system, turns, out = system_prompt(w), [], []
    for r in range(w.rounds):
        if r:
            await asyncio.sleep(w.think_s)
        asked = first_message(w, user) if r == 0 else question(r)
        one = Round(user, r)
        out.append(one)
        try:
            one.reply = await chat(session, base_url, token, model, messages_of(system, turns, asked),
                                   w.max_new_tokens)
        except Exception as exc:  # noqa: BLE001 - reported per round
            one.error = f"{type(exc).__name__}: {exc}"
            logger.warning("user %d round %d failed: %s", user, r, one.error)
            break
        turns.append((asked, one.reply.text))
    return out


async def run(base_url: str, tokens: list[str], model: str, w: QaWorkload) -> tuple[list[Round], float]:
    """Every user at once (started over one think time); their rounds and the wall time (s)."""
    timeout = aiohttp.ClientTimeout(total=600)
    begin = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        stagger = w.think_s / w.users
        per_user = await asyncio.gather(*(run_user(session, base_url, tokens[u], model, w, u, u * stagger)
                                          for u in range(w.users)))
    return [r for rounds in per_user for r in rounds], time.perf_counter() - begin
