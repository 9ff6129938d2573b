"""The KV pool: one registered shared-memory region and the torch/numpy views into it.

    region    = [ kv | token_ids | counters ]                (hostmem.kv_layout.KvLayout)
    kv        : [slot, layer, K|V, kv_head, token, head_dim]  fp32
    token_ids : [slot, token]                                 uint32
    counters  : [counter, success|error]                      uint64; per slot: token count,
                                                              restore, offload

The model's cache for a session is a view into one slot (compute_node.slot_cache): nothing
is ever copied out of the pool for offload, the agent reads the same memory.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from hostmem.kv_layout import KvLayout
from hostmem.region import Region

logger = logging.getLogger(__name__)


def layout_for(config, num_slots: int, max_tokens: int, chunk_tokens: int) -> KvLayout:
    """The pool layout for a transformers model config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return KvLayout(num_slots=num_slots, num_layers=config.num_hidden_layers,
                    num_kv_heads=config.num_key_value_heads, max_tokens=max_tokens,
                    head_dim=head_dim, dtype_bytes=4, chunk_tokens=chunk_tokens)


class KvPool:
    """Views of the region; owns the region when created here.

    Thread-safety: the engine thread writes a slot's KV and token ids; the agent (another
    process) reads them when a PUT fires and writes them for a GET into a reserved slot.
    """

    def __init__(self, layout: KvLayout, region: Region):
        self.layout = layout
        self.region = region
        L = layout
        kv_count = L.num_slots * L.num_layers * 2 * L.num_kv_heads * L.max_tokens * L.head_dim
        # kv: [slot, layer, K|V, kv_head, token, head_dim] fp32
        self.kv = torch.frombuffer(region.buffer, dtype=torch.float32, count=kv_count,
                                   offset=L.kv_offset).view(
            L.num_slots, L.num_layers, 2, L.num_kv_heads, L.max_tokens, L.head_dim)
        # token_ids: [slot, token] uint32
        self.token_ids = np.frombuffer(region.buffer, dtype="<u4", count=L.num_slots * L.max_tokens,
                                       offset=L.token_ids_offset).reshape(L.num_slots, L.max_tokens)

    @classmethod
    def create(cls, name: str, layout: KvLayout) -> "KvPool":
        """Create the shared-memory region (zero-filled) and map it."""
        region = Region.create(name, layout.region_bytes, layout.counter_offset, layout.counter_count)
        logger.info("KV pool %s: %d slots x %d tokens, %.1f MiB", name, layout.num_slots,
                    layout.max_tokens, layout.region_bytes / 2**20)
        return cls(layout, region)

    # -- slot data
    def slot_kv(self, slot: int) -> torch.Tensor:
        """kv[slot]: [layer, K|V, kv_head, token, head_dim], a view."""
        return self.kv[slot]

    def write_token_ids(self, slot: int, start: int, ids) -> None:
        """token_ids[slot, start:start+len(ids)] = ids."""
        ids = np.asarray(ids, dtype="<u4")
        self.token_ids[slot, start:start + len(ids)] = ids

    def read_token_ids(self, slot: int, start: int, end: int) -> np.ndarray:
        """A copy of token_ids[slot, start:end]."""
        return self.token_ids[slot, start:end].copy()

    # -- counters
    def store_tokens(self, slot: int, count: int) -> None:
        """The GPU thread's flag write: the slot's token count into its trigger counter."""
        self.region.store_counter(self.layout.token_counter(slot), count)

    def counter_total(self, counter: int) -> int:
        return self.region.counter_total(counter)

    def read_counter(self, counter: int) -> tuple[int, int]:
        return self.region.read_counter(counter)

    def close(self) -> None:
        """Drop the views and unmap (and unlink, as the owner)."""
        self.kv = None
        self.token_ids = None
        self.region.close()
