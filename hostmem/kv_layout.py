"""Where a paged KV pool keeps what inside its registered region (pure: no torch, zmq or grpc).

The compute node lays its pool out this way and registers the layout with the agent, so both
sides find a block's bytes and counters from the same arithmetic:

    region      = [ kv | token_ids | descriptors | counters ]
    kv:           [block, layer, K|V, kv_head, block_tokens, head_dim]   kv_dtype (hostmem.kv_dtype), dtype_bytes each
    token_ids:    [block, block_tokens]                                  uint32 little endian
    descriptors:  [block] x DESCRIPTOR_BYTES                             (hostmem.descriptor)
    counters:     [counter] x 16 bytes                                   (success u64, error u64)

A block is `block_tokens` tokens of every layer: one contiguous extent of the region, the unit
the SmartNIC stores and restores (one DMA). Inside it the layers follow each other, so a group of
layers is a contiguous byte range too (a layer-wise restore reads one per group).

Counters per block: the PUT trigger (the compute node stores the block's descriptor generation
there: the standing triggered PUT fires), the PUT completion (the agent), and one GET completion
per layer group (the agent bumps all of a block's when its GET ends; a restore that lands group
by group would bump each as it lands). After them the extra counters, then the watcher's doorbell
(`bell_counter`: hostmem.bell).
"""
from __future__ import annotations

import dataclasses

from hostmem import gather, kv_dtype as kvd

COUNTER_BYTES = 16
TOKEN_ID_BYTES = 4
PAGE_BYTES = 4096
DESCRIPTOR_BYTES = 512


def _align(n: int, to: int = PAGE_BYTES) -> int:
    return (n + to - 1) // to * to


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """Byte offsets of a paged KV pool's parts; immutable and cheap to share."""

    num_blocks: int
    num_layers: int
    num_kv_heads: int
    block_tokens: int
    head_dim: int
    dtype_bytes: int = 4
    layer_groups: int = 1    # GET completion counters per block (layer-wise restore)
    extra_counters: int = 8  # for tests, benchmarks and chaining
    kv_dtype: str = ""       # the element type (hostmem.kv_dtype), dtype_bytes its size; "" with 4 bytes
    #                          is float32, with other sizes raw bytes of no stated type (no restore checks it)

    def __post_init__(self):
        for name in ("num_blocks", "num_layers", "num_kv_heads", "block_tokens", "head_dim", "dtype_bytes",
                     "layer_groups"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.layer_groups > self.num_layers:
            raise ValueError(f"layer_groups {self.layer_groups} must not exceed num_layers {self.num_layers}")
        if self.extra_counters < 0:
            raise ValueError(f"extra_counters must not be negative, got {self.extra_counters}")
        if not self.kv_dtype and self.dtype_bytes == kvd.size(kvd.DEFAULT):
            object.__setattr__(self, "kv_dtype", kvd.DEFAULT)
        if self.kv_dtype and self.kv_dtype not in kvd.KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {self.kv_dtype!r} (one of {', '.join(kvd.KV_DTYPES)})")
        if self.kv_dtype and self.dtype_bytes != kvd.size(self.kv_dtype):
            raise ValueError(f"kv_dtype {self.kv_dtype} is {kvd.size(self.kv_dtype)} bytes an element, not "
                             f"dtype_bytes {self.dtype_bytes}")

    @classmethod
    def of_dtype(cls, kv_dtype: str, **fields) -> "KvLayout":
        """A layout of `kv_dtype` elements (dtype_bytes its size)."""
        return cls(dtype_bytes=kvd.size(kv_dtype), kv_dtype=kv_dtype, **fields)

    # -- sizes
    @property
    def token_bytes(self) -> int:
        """One token's row in one (layer, K|V, head): head_dim values."""
        return self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """All layers, K and V, all heads, for one token."""
        return self.num_layers * 2 * self.num_kv_heads * self.token_bytes

    @property
    def layer_bytes(self) -> int:
        """One layer of one block: K and V, all heads, block_tokens rows."""
        return 2 * self.num_kv_heads * self.block_tokens * self.token_bytes

    @property
    def block_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    @property
    def kv_offset(self) -> int:
        return 0

    @property
    def token_ids_offset(self) -> int:
        return _align(self.kv_offset + self.num_blocks * self.block_bytes)

    @property
    def descriptor_offset(self) -> int:
        return _align(self.token_ids_offset + self.num_blocks * self.block_tokens * TOKEN_ID_BYTES)

    @property
    def counter_offset(self) -> int:
        return _align(self.descriptor_offset + self.num_blocks * DESCRIPTOR_BYTES)

    @property
    def counters_per_block(self) -> int:
        return 2 + self.layer_groups

    @property
    def counter_count(self) -> int:
        return self.num_blocks * self.counters_per_block + self.extra_counters + 1  # + the doorbell

    @property
    def bell_counter(self) -> int:
        """The counter whose first 4 bytes are the agent's watcher's doorbell (hostmem.bell)."""
        return self.num_blocks * self.counters_per_block + self.extra_counters

    @property
    def region_bytes(self) -> int:
        return _align(self.counter_offset + self.counter_count * COUNTER_BYTES)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_tokens

    # -- counters
    def _check_block(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} out of range [0, {self.num_blocks})")
        return block

    def put_trigger(self, block: int) -> int:
        """The counter the compute node stores a block's descriptor generation into."""
        return self._check_block(block) * self.counters_per_block

    def put_done(self, block: int) -> int:
        """The counter the agent bumps when a PUT of the block completed (success or error)."""
        return self._check_block(block) * self.counters_per_block + 1

    def get_done(self, block: int, group: int = 0) -> int:
        """The counter the agent bumps when layer group `group` of a GET into the block landed."""
        if not 0 <= group < self.layer_groups:
            raise ValueError(f"layer group {group} out of range [0, {self.layer_groups})")
        return self._check_block(block) * self.counters_per_block + 2 + group

    def extra_counter(self, i: int) -> int:
        if not 0 <= i < self.extra_counters:
            raise ValueError(f"extra counter {i} out of range [0, {self.extra_counters})")
        return self.num_blocks * self.counters_per_block + i

    # -- layer groups
    def group_layers(self, group: int) -> tuple[int, int]:
        """[first, end) of the layers in a layer group (groups as even as the layers allow)."""
        if not 0 <= group < self.layer_groups:
            raise ValueError(f"layer group {group} out of range [0, {self.layer_groups})")
        return (group * self.num_layers // self.layer_groups, (group + 1) * self.num_layers // self.layer_groups)

    def group_of_layer(self, layer: int) -> int:
        """The layer group holding a layer."""
        return next(g for g in range(self.layer_groups) if self.group_layers(g)[1] > layer)

    # -- byte ranges
    def block_range(self, block: int) -> tuple[int, int]:
        """(offset, length) of a block's KV: one contiguous extent."""
        return self.kv_offset + self._check_block(block) * self.block_bytes, self.block_bytes

    def group_range(self, block: int, group: int) -> tuple[int, int]:
        """(offset, length) of one layer group of a block's KV, contiguous inside the block."""
        first, end = self.group_layers(group)
        offset, _ = self.block_range(block)
        return offset + first * self.layer_bytes, (end - first) * self.layer_bytes

    def token_ids_range(self, block: int, tokens: int | None = None) -> tuple[int, int]:
        """(offset, length) of the first `tokens` token ids of a block (all of them by default)."""
        tokens = self.block_tokens if tokens is None else tokens
        if not 0 <= tokens <= self.block_tokens:
            raise ValueError(f"{tokens} tokens do not fit a block of {self.block_tokens}")
        base = self.token_ids_offset + self._check_block(block) * self.block_tokens * TOKEN_ID_BYTES
        return base, tokens * TOKEN_ID_BYTES

    def descriptor_range(self, block: int) -> tuple[int, int]:
        return self.descriptor_offset + self._check_block(block) * DESCRIPTOR_BYTES, DESCRIPTOR_BYTES

    def chunk_runs(self, block: int, tokens: int) -> tuple[gather.Run, ...]:
        """A block as a stored chunk's payload, as copy runs: its `tokens` token ids, then its whole KV
        extent (rows past `tokens` in a partial block travel too: one DMA, never read by attention)."""
        ids_offset, ids_length = self.token_ids_range(block, tokens)
        kv_offset, kv_length = self.block_range(block)
        ids = gather.Run(ids_offset, ids_length, ids_length, 1 if ids_length else 0)
        return tuple(r for r in (ids, gather.Run(kv_offset, kv_length, kv_length, 1)) if r.count)

    def chunk_payload_bytes(self, tokens: int) -> int:
        """Token ids plus KV of a stored block of `tokens` tokens."""
        return tokens * TOKEN_ID_BYTES + self.block_bytes
