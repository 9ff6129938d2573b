"""A transformers cache whose layers live in one slot of the KV pool.

Each layer's update writes the new keys and values straight into the slot's preallocated
rows and hands back views of the rows written so far, so the KV that attention reads is the
KV the agent offloads: no copy is ever made for offload.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer of one slot; keys/values are views [1, kv_head, length, head_dim]."""

    is_croppable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int = 0):
        super().__init__()
        # k_rows, v_rows: [1, kv_head, max_tokens, head_dim], views into the pool
        self.k_rows = keys.unsqueeze(0)
        self.v_rows = values.unsqueeze(0)
        self.max_tokens = keys.shape[-2]
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.k_rows[:, :, :length]
        self.values = self.v_rows[:, :, :length]

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # the rows exist from the start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write key/value_states [1, kv_head, n, head_dim] after the cached rows; return views."""
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.max_tokens:
            raise ValueError(f"slot holds {self.max_tokens} tokens; cannot add {n} to {self.length}")
        self.k_rows[:, :, self.length:end].copy_(key_states)
        self.v_rows[:, :, self.length:end].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_tokens

    def reset(self) -> None:
        self._set_length(0)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        self._set_length(max(0, self.length + tokens_to_remove))


class SlotCache(Cache):
    """The cache of one turn: all layers of `slot_kv` with `length` tokens already in it.

    slot_kv: [layer, K|V, kv_head, max_tokens, head_dim] (a view of KvPool.kv[slot]).
    Used by one thread at a time (the engine).
    """

    def __init__(self, slot_kv: torch.Tensor, length: int = 0):
        layers = [SlotLayer(slot_kv[layer, 0], slot_kv[layer, 1], length)
                  for layer in range(slot_kv.shape[0])]
        super().__init__(layers=layers)

    @property
    def length(self) -> int:
        """Tokens whose KV is in the slot."""
        return self.layers[0].length
