"""Prompt text for trace requests: equal hash ids are equal text, each block exactly block_tokens tokens (pure).

A block is block_tokens words, each one token with its leading space (" the", " river"), drawn
from a seeded generator per hash id: the same id always gives the same words. A byte-level BPE
tokenizer (SmolLM2's) splits text at spaces before it merges, so such words never merge across
a block boundary, and the tokens of a prompt are the concatenation of its blocks' tokens. That is
checked, not assumed: `check_prompt` compares the tokenizer's ids with the blocks' own.

The prompt goes into a chat template after a system message; `pad_system` makes the template's
head (everything before the first block) a whole number of blocks, so trace blocks fall on the
engine's block boundaries and a trace prefix is an engine prefix.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence

from bench.mooncake import TraceRequest

Encode = Callable[[str], list[int]]
_WORD = re.compile(r"Ġ([a-z]{3,9})")  # byte-level BPE marks a leading space with "Ġ"


def single_token_words(vocab: Mapping[str, int], encode: Encode, limit: int = 4096) -> list[str]:
    """Lowercase words (3-9 letters) that are one token with a leading space, most frequent (lowest id) first."""
    candidates = sorted((i, m.group(1)) for token, i in vocab.items() if (m := _WORD.fullmatch(token)))
    words = []
    for token_id, word in candidates:
        if encode(" " + word) == [token_id]:
            words.append(word)
            if len(words) == limit:
                break
    return words


class BlockText:
    """The text of each hash id's block: block_tokens words chosen by a generator seeded with the id."""

    def __init__(self, words: Sequence[str], block_tokens: int, seed: int = 0):
        if not (len(words) >= 2 and block_tokens > 0):
            raise ValueError("need words and a positive block size")
        self.words = list(words)
        self.block_tokens = block_tokens
        self.seed = seed

    def words_of(self, hash_id: int) -> list[str]:
        rng = random.Random(f"{self.seed}:{hash_id}")
        return [rng.choice(self.words) for _ in range(self.block_tokens)]

    def block(self, hash_id: int, tokens: int | None = None) -> str:
        """The block's text, or its first `tokens` words (a partial last block)."""
        n = self.block_tokens if tokens is None else tokens
        return "".join(" " + w for w in self.words_of(hash_id)[:n])

    def prompt(self, request: TraceRequest) -> str:
        """The user message of a request: its full blocks, then its last block cut to input_length."""
        bt = self.block_tokens
        last = request.input_length - (len(request.hash_ids) - 1) * bt
        if not (0 < last <= bt):
            raise ValueError(f"input_length {request.input_length} does not fit {len(request.hash_ids)} blocks")
        return "".join(self.block(h) for h in request.hash_ids[:-1]) + self.block(request.hash_ids[-1], last)

    def expected_ids(self, request: TraceRequest, encode: Encode) -> list[int]:
        """The token ids the prompt must have: each block's own ids, concatenated."""
        bt = self.block_tokens
        last = request.input_length - (len(request.hash_ids) - 1) * bt
        ids = [t for h in request.hash_ids[:-1] for t in encode(self.block(h))]
        return ids + encode(self.block(request.hash_ids[-1], last))


def check_prompt(got: Sequence[int], head: Sequence[int], body: Sequence[int], tail: Sequence[int]) -> str:
    """'' when got == head + body + tail, else where it differs (for the report)."""
    want = [*head, *body, *tail]
    if list(got) == want:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"{len(got)} ids, expected {len(want)}; first difference at {at}"


def split_template(ids: Sequence[int], marker: Sequence[int]) -> tuple[list[int], list[int]]:
    """(head, tail) around the one place `marker` occurs in ids (a template rendered around a known block)."""
    n = len(marker)
    at = [i for i in range(len(ids) - n + 1) if list(ids[i:i + n]) == list(marker)]
    if len(at) != 1:
        raise ValueError(f"the marker block occurs {len(at)} times in the rendered template")
    return list(ids[:at[0]]), list(ids[at[0] + n:])


def pad_words(head_tokens: int, block_tokens: int) -> int:
    """Words of one token to add to the system message so that the head is a whole number of blocks."""
    return (-head_tokens) % block_tokens
