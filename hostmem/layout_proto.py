"""A KvLayout to and from smartnic.proto's KvLayout message (registration, step 1)."""
from __future__ import annotations

from hostmem.kv_layout import COUNTERS_PER_SLOT, KvLayout
from hostmem.region import RegionError
from kvtb_proto import smartnic_pb2


def layout_to_proto(layout: KvLayout):
    """The layout as smartnic.proto's KvLayout message."""
    slots = range(layout.num_slots)
    return smartnic_pb2.KvLayout(
        num_slots=layout.num_slots, num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads, max_tokens=layout.max_tokens,
        head_dim=layout.head_dim, dtype_bytes=layout.dtype_bytes,
        chunk_tokens=layout.chunk_tokens, kv_offset=layout.kv_offset,
        token_ids_offset=layout.token_ids_offset,
        slot_token_counter=[layout.token_counter(s) for s in slots],
        slot_restore_counter=[layout.restore_counter(s) for s in slots],
        slot_offload_counter=[layout.offload_counter(s) for s in slots])


def layout_from_proto(msg, counter_count: int) -> KvLayout:
    """A KvLayout from its message; refuse one whose offsets differ from KvLayout's arithmetic."""
    layout = KvLayout(num_slots=msg.num_slots, num_layers=msg.num_layers, num_kv_heads=msg.num_kv_heads,
                      max_tokens=msg.max_tokens, head_dim=msg.head_dim, dtype_bytes=msg.dtype_bytes or 4,
                      chunk_tokens=msg.chunk_tokens or 32,
                      extra_counters=max(0, counter_count - msg.num_slots * COUNTERS_PER_SLOT))
    wanted = {"kv_offset": layout.kv_offset, "token_ids_offset": layout.token_ids_offset}
    for name, value in wanted.items():
        if getattr(msg, name) != value:
            raise RegionError(f"kv_layout.{name} is {getattr(msg, name)}, KvLayout computes {value}")
    for name, fn in (("slot_token_counter", layout.token_counter),
                     ("slot_restore_counter", layout.restore_counter),
                     ("slot_offload_counter", layout.offload_counter)):
        given = list(getattr(msg, name))
        if given and given != [fn(s) for s in range(layout.num_slots)]:
            raise RegionError(f"kv_layout.{name} differs from KvLayout's counters")
    return layout
