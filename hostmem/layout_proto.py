"""A KvLayout to and from smartnic.proto's KvLayout message (registration, step 1)."""
from __future__ import annotations

from hostmem.kv_layout import KvLayout
from hostmem.region import RegionError
from kvtb_proto import smartnic_pb2


def layout_to_proto(layout: KvLayout) -> smartnic_pb2.KvLayout:
    """The layout as smartnic.proto's KvLayout message (with its offsets, for the agent to check)."""
    return smartnic_pb2.KvLayout(
        num_blocks=layout.num_blocks, num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
        block_tokens=layout.block_tokens, head_dim=layout.head_dim, dtype_bytes=layout.dtype_bytes,
        layer_groups=layout.layer_groups, kv_offset=layout.kv_offset, token_ids_offset=layout.token_ids_offset,
        descriptor_offset=layout.descriptor_offset, extra_counters=layout.extra_counters,
        kv_dtype=layout.kv_dtype)


def layout_from_proto(msg: smartnic_pb2.KvLayout) -> KvLayout:
    """A KvLayout from its message; RegionError for one that is invalid or whose offsets differ
    from KvLayout's arithmetic (the two sides would not find the same bytes)."""
    try:
        layout = KvLayout(num_blocks=msg.num_blocks, num_layers=msg.num_layers, num_kv_heads=msg.num_kv_heads,
                          block_tokens=msg.block_tokens, head_dim=msg.head_dim, dtype_bytes=msg.dtype_bytes or 4,
                          layer_groups=msg.layer_groups or 1, extra_counters=msg.extra_counters,
                          kv_dtype=msg.kv_dtype)
    except ValueError as exc:
        raise RegionError(f"invalid kv_layout: {exc}") from exc
    for name in ("kv_offset", "token_ids_offset", "descriptor_offset"):
        if getattr(msg, name) != getattr(layout, name):
            raise RegionError(f"kv_layout.{name} is {getattr(msg, name)}, KvLayout computes {getattr(layout, name)}")
    return layout
