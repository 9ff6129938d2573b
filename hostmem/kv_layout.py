"""Where a KV pool keeps what inside its registered region (pure: no torch, zmq or grpc).

The compute node lays its pool out this way and registers the layout with the agent, so
that both sides find a chunk of a slot from the same arithmetic:

    region = [ kv | token_ids | counters ]
    kv:        [slot, layer, K|V, kv_head, token, head_dim]   dtype_bytes each (fp32: 4)
    token_ids: [slot, token]                                  uint32 little endian
    counters:  [counter] x 16 bytes                           (success u64, error u64)

Per slot there are three counters: the token count (what triggers PUTs), the restore
completion counter and the offload completion counter.
"""
from __future__ import annotations

import dataclasses

from hostmem import gather

COUNTER_BYTES = 16
TOKEN_ID_BYTES = 4
PAGE_BYTES = 4096
COUNTERS_PER_SLOT = 3


def _align(n: int, to: int = PAGE_BYTES) -> int:
    return (n + to - 1) // to * to


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """Byte offsets of a KV pool's parts; immutable and cheap to share."""

    num_slots: int
    num_layers: int
    num_kv_heads: int
    max_tokens: int
    head_dim: int
    dtype_bytes: int = 4
    chunk_tokens: int = 32
    extra_counters: int = 8  # for tests, benchmarks and chaining

    def __post_init__(self):
        for name in ("num_slots", "num_layers", "num_kv_heads", "max_tokens", "head_dim",
                     "dtype_bytes", "chunk_tokens"):
            assert getattr(self, name) > 0, f"{name} must be positive"

    # -- sizes
    @property
    def token_bytes(self) -> int:
        """Bytes of one token's row in one (layer, K|V, head): head_dim values."""
        return self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """All layers, K and V, all heads, for one token."""
        return self.num_layers * 2 * self.num_kv_heads * self.token_bytes

    @property
    def slot_bytes(self) -> int:
        return self.kv_bytes_per_token * self.max_tokens

    @property
    def kv_offset(self) -> int:
        return 0

    @property
    def token_ids_offset(self) -> int:
        return _align(self.kv_offset + self.num_slots * self.slot_bytes)

    @property
    def counter_offset(self) -> int:
        return _align(self.token_ids_offset + self.num_slots * self.max_tokens * TOKEN_ID_BYTES)

    @property
    def counter_count(self) -> int:
        return self.num_slots * COUNTERS_PER_SLOT + self.extra_counters

    @property
    def region_bytes(self) -> int:
        return _align(self.counter_offset + self.counter_count * COUNTER_BYTES)

    @property
    def num_chunks(self) -> int:
        """Chunks a full slot holds (the last may be partial)."""
        return -(-self.max_tokens // self.chunk_tokens)

    # -- counters
    def token_counter(self, slot: int) -> int:
        return self._check_slot(slot) * COUNTERS_PER_SLOT

    def restore_counter(self, slot: int) -> int:
        return self._check_slot(slot) * COUNTERS_PER_SLOT + 1

    def offload_counter(self, slot: int) -> int:
        return self._check_slot(slot) * COUNTERS_PER_SLOT + 2

    def extra_counter(self, i: int) -> int:
        assert 0 <= i < self.extra_counters, f"extra counter {i} out of range"
        return self.num_slots * COUNTERS_PER_SLOT + i

    # -- ranges
    def _check_slot(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} out of range [0, {self.num_slots})")
        return slot

    def _check_tokens(self, start: int, end: int) -> None:
        if not 0 <= start <= end <= self.max_tokens:
            raise ValueError(f"token range [{start}, {end}) outside [0, {self.max_tokens}]")

    def row_offset(self, slot: int, layer: int, kv: int, head: int, token: int = 0) -> int:
        """Byte offset of kv[slot, layer, kv, head, token, :]."""
        self._check_slot(slot)
        index = (((slot * self.num_layers + layer) * 2 + kv) * self.num_kv_heads + head)
        return self.kv_offset + (index * self.max_tokens + token) * self.token_bytes

    def kv_ranges(self, slot: int, token_start: int, token_end: int) -> list[tuple[int, int]]:
        """(offset, length) of tokens [start, end) in every (layer, K|V, head), in layout order."""
        run = self.kv_run(slot, token_start, token_end)
        return [(run.first + i * run.stride, run.length) for i in range(run.count)]

    def kv_run(self, slot: int, token_start: int, token_end: int) -> gather.Run:
        """kv_ranges() as one run: the rows of consecutive (layer, K|V, head) are max_tokens apart."""
        self._check_tokens(token_start, token_end)
        length = (token_end - token_start) * self.token_bytes
        rows = self.num_layers * 2 * self.num_kv_heads if length else 0
        return gather.Run(self.row_offset(slot, 0, 0, 0, token_start), length,
                          self.max_tokens * self.token_bytes, rows)

    def chunk_runs(self, slot: int, token_start: int, token_end: int) -> tuple[gather.Run, ...]:
        """A chunk's bytes in the slot as copy runs: its token ids, then its KV rows (kv_run)."""
        offset, length = self.token_ids_range(slot, token_start, token_end)
        ids = gather.Run(offset, length, length, 1 if length else 0)
        return tuple(r for r in (ids, self.kv_run(slot, token_start, token_end)) if r.count)

    def token_ids_range(self, slot: int, token_start: int, token_end: int) -> tuple[int, int]:
        """(offset, length) of token ids [start, end) of a slot."""
        self._check_slot(slot)
        self._check_tokens(token_start, token_end)
        base = self.token_ids_offset + slot * self.max_tokens * TOKEN_ID_BYTES
        return base + token_start * TOKEN_ID_BYTES, (token_end - token_start) * TOKEN_ID_BYTES

    def chunk_tokens_range(self, chunk_index: int, tokens_in_slot: int) -> tuple[int, int]:
        """[start, end) of a chunk, cut at tokens_in_slot (the last chunk may be partial)."""
        start = chunk_index * self.chunk_tokens
        end = min(start + self.chunk_tokens, tokens_in_slot, self.max_tokens)
        if start >= end:
            raise ValueError(f"chunk {chunk_index} is empty with {tokens_in_slot} tokens")
        return start, end

    def counter_range(self, counter: int) -> tuple[int, int]:
        if not 0 <= counter < self.counter_count:
            raise ValueError(f"counter {counter} out of range [0, {self.counter_count})")
        return self.counter_offset + counter * COUNTER_BYTES, COUNTER_BYTES
