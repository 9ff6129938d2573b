"""A request as the batching engine sees it: its tokens, its block table, its status (pure).

Tokens are the prompt then the generated tokens. The KV of token p lives in block
block_table[p // block_tokens] at offset p % block_tokens. A running sequence always has at
least one token whose KV is not computed yet (the last one): the step that computes it
yields the logits of the next token.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Hashable
from typing import Any

from hostmem.block_hash import Salts

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # in the wait queue, or restored and waiting for a place in the batch
    RESTORING = "restoring"  # blocks allocated, being filled from storage; outside the batch
    RUNNING = "running"  # in the batch
    SWAPPED = "swapped"  # preempted by swap: its KV is (being) stored, or in the host swap tier; waits to be restored
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request's state; mutated only by the block manager and the scheduler.

    Invariants: 0 <= num_cached_tokens <= num_computed_tokens < num_tokens while it holds
    blocks and is not finished; the block table covers every token, the uncomputed ones
    included (a just-sampled token that starts a new block gets it at the next schedule,
    by may_append); block_hashes[i] is the hash
    chain value of full block i (computed lazily, never invalidated: tokens are only appended).
    Identity (not value) equality: a sequence can be a set member or a dict key.
    """

    token_ids: list[int]
    max_new_tokens: int
    block_tokens: int  # the pool's (compute_node.settings: block_tokens, the one source)
    user_id: Hashable = ""
    context_id: Hashable = ""
    salt: bytes | Salts = b""  # per tenant and user; Salts: the tenant's alone for a shared prefix
    payload: Any = None  # sampling parameters, the turn, ...: opaque here
    seq_id: int = dataclasses.field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    num_prompt_tokens: int = -1  # -1: len(token_ids) at creation
    block_table: list[int] = dataclasses.field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the pool, from token 0 on
    num_cached_tokens: int = 0  # of those, found in the prefix cache at allocation
    block_hashes: list[bytes] = dataclasses.field(default_factory=list)
    num_preemptions: int = 0
    num_preempted_tokens: int = 0  # KV tokens held at the last preemption, until re-admitted
    kv_mark: int = 0  # the most KV tokens it held at any preemption: a token below it computed again is
    #                   preemption work (compute_node.preemption_cost)
    restore_blocks: list[int] = dataclasses.field(default_factory=list)  # block indexes being filled
    num_restore_tokens: int = 0  # the restore in flight brings tokens [0, this) (with the cached ones)
    pinned_blocks: list[int] = dataclasses.field(default_factory=list)  # block ids pinned for our I/O
    finish_reason: str = ""  # "stop", "length" or "abort"
    stop_reason: str = ""  # with "stop": the stop token's id (as text) or stop string that ended it; "": end of turn
    num_stored_tokens: int = 0  # tokens of its prefix on storage (the agent found them): restore on admission
    ignore_eos: bool = False  # decode max_new_tokens tokens even past a stop token (benchmarks)
    can_swap: bool = True  # its KV can be stored (an offloading policy); False: preempted by recompute always
    stop_token_ids: frozenset[int] = frozenset()  # the request's own stop tokens (besides the end of turn)
    min_tokens: int = 0  # no stop before this many generated tokens

    def __post_init__(self):
        self.token_ids = list(self.token_ids)
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)
        if not self.token_ids:
            raise ValueError("a sequence needs at least one token")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        if not isinstance(self.salt, (bytes, Salts)):
            raise TypeError("salt must be bytes or Salts")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_blocks(self) -> int:
        """Blocks that cover every token, the uncomputed ones included."""
        return -(-len(self.token_ids) // self.block_tokens)

    @property
    def num_full_blocks(self) -> int:
        return len(self.token_ids) // self.block_tokens

    @property
    def max_blocks(self) -> int:
        """Blocks the sequence holds at most: its KV never covers the last token it may generate."""
        return -(-(self.num_prompt_tokens + self.max_new_tokens - 1) // self.block_tokens)

    def block_token_ids(self, i: int) -> list[int]:
        """Token ids of block i (fewer than block_tokens for a partial last block)."""
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i} out of range [0, {self.num_blocks})")
        return self.token_ids[i * self.block_tokens:(i + 1) * self.block_tokens]

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens still without KV: the rest of the prefill, or 1 in decode."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """One token to compute: the last sampled one (or the last of a prompt)."""
        return self.num_tokens_to_compute == 1

    @property
    def prefill_done(self) -> bool:
        """The prompt's KV is all computed (so the first token was sampled or is being)."""
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def check_stop(self, token: int, eos_ids: frozenset[int] | set[int]) -> str | None:
        """Why this sequence ends with `token` just appended, or None (as vLLM's check_stop: nothing stops it
        before min_tokens; the end of turn (eos_ids) unless ignore_eos, then its own stop tokens (its
        stop_reason set to the token), then the length)."""
        if self.num_completion_tokens >= self.min_tokens:
            if token in eos_ids and not self.ignore_eos:
                return "stop"
            if token in self.stop_token_ids:
                self.stop_reason = str(token)
                return "stop"
        if self.num_completion_tokens >= self.max_new_tokens:
            return "length"
        return None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
