"""The paged KV pool: one registered shared-memory region and the torch/numpy views into it.

    region      = [ kv | token_ids | descriptors | counters ]        (hostmem.kv_layout.KvLayout)
    kv          : [block, layer, K|V, kv_head, block_tokens, head_dim]  kv_dtype (fp32, bf16 or fp8 e4m3)
    token_ids   : [block, block_tokens]                                 uint32
    descriptors : [block] x DESCRIPTOR_BYTES                            (hostmem.descriptor)
    counters    : [counter, success|error]                              uint64

The model runner attends over blocks of `kv` in place and writes new K/V straight into them:
nothing is ever copied out of the pool for offload, the agent reads the same memory.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from hostmem.kv_layout import KvLayout
from hostmem.region import Region

logger = logging.getLogger(__name__)


TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}


def layout_for(config, num_blocks: int, block_tokens: int, layer_groups: int = 1,
               kv_dtype: str = "float32") -> KvLayout:
    """The pool layout for a transformers model config, its KV of `kv_dtype` (hostmem.kv_dtype)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return KvLayout.of_dtype(kv_dtype, num_blocks=num_blocks, num_layers=config.num_hidden_layers,
                             num_kv_heads=config.num_key_value_heads, block_tokens=block_tokens, head_dim=head_dim,
                             layer_groups=min(layer_groups, config.num_hidden_layers))


class KvPool:
    """Views of the region; owns the region when created here.

    Thread-safety: the engine thread writes blocks' KV, token ids and descriptors and stores the
    PUT triggers; the agent (another process) reads a block when its PUT fires and writes a block
    whose GET the engine asked for, bumping the completion counters.
    """

    def __init__(self, layout: KvLayout, region: Region):
        self.layout = layout
        self.region = region
        L = layout
        count = L.num_blocks * L.block_bytes // L.dtype_bytes
        if L.kv_dtype not in TORCH_DTYPES:
            raise ValueError(f"a pool's KV is one of {', '.join(TORCH_DTYPES)}, not {L.kv_dtype or 'unstated'}")
        # kv: [block, layer, K|V, kv_head, block_tokens, head_dim] of the layout's kv_dtype
        self.kv = torch.frombuffer(region.buffer, dtype=TORCH_DTYPES[L.kv_dtype], count=count, offset=L.kv_offset).view(
            L.num_blocks, L.num_layers, 2, L.num_kv_heads, L.block_tokens, L.head_dim)
        # token_ids: [block, block_tokens] uint32
        self.token_ids = np.frombuffer(region.buffer, dtype="<u4", count=L.num_blocks * L.block_tokens,
                                       offset=L.token_ids_offset).reshape(L.num_blocks, L.block_tokens)
        # counters: [counter, success|error] uint64, the region's own array
        self.counters = region.counters
        # words: [counter * 2 + (0 success | 1 error)] u64, the same counters as a flat memoryview: the
        # engine's few-counter reads and stores between steps, where numpy's indexing costs tens of µs
        # with its code out of the CPU's caches after a forward
        self.words = region.buffer[L.counter_offset:L.counter_offset + L.counter_count * 16].cast("Q")

    @classmethod
    def create(cls, name: str, layout: KvLayout) -> "KvPool":
        """Create the shared-memory region (zero-filled) and map it, every page allocated now (as a GPU's KV
        cache is, vLLM's among them: no restore or step later waits for the kernel to find a page)."""
        region = Region.create(name, layout.region_bytes, layout.counter_offset, layout.counter_count)
        region.populate()
        logger.info("KV pool %s: %d blocks x %d tokens (%d tokens), %.1f MiB", name, layout.num_blocks,
                    layout.block_tokens, layout.pool_tokens, layout.region_bytes / 2**20)
        return cls(layout, region)

    # -- block data
    def write_token_ids(self, block_table, start: int, ids) -> None:
        """The token ids of a sequence's positions [start, start + len(ids)) into its blocks' rows
        (block_table[position // block_tokens] is the position's block)."""
        ids = np.asarray(ids, dtype="<u4")
        bt, pos, done = self.layout.block_tokens, start, 0
        while done < len(ids):
            block, offset = block_table[pos // bt], pos % bt
            n = min(bt - offset, len(ids) - done)
            self.token_ids[block, offset:offset + n] = ids[done:done + n]
            pos, done = pos + n, done + n

    def read_token_ids(self, block: int, count: int) -> np.ndarray:
        """A copy of the first `count` token ids of a block."""
        return self.token_ids[block, :count].copy()

    # -- counters
    def store_counter(self, counter: int, value: int) -> None:
        """The GPU thread's flag write: a plain store into the counter's success part."""
        self.region.store_counter(counter, value)

    def counter_total(self, counter: int) -> int:
        return self.region.counter_total(counter)

    def read_counter(self, counter: int) -> tuple[int, int]:
        return self.region.read_counter(counter)

    def totals(self, counters) -> np.ndarray:
        """success + error of many counters at once: [len(counters)] uint64."""
        rows = self.counters[np.asarray(counters, dtype=np.intp)]
        return rows[:, 0] + rows[:, 1]

    def close(self) -> None:
        """Drop the views and unmap (and unlink, as the owner)."""
        self.kv = self.token_ids = self.counters = None
        if self.words is not None:
            self.words.release()
            self.words = None
        self.region.close()
