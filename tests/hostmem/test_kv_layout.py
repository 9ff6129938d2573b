"""The paged pool's layout: a block is one extent, a layer group one range inside it, counters per block."""
import pytest

from hostmem.kv_layout import COUNTER_BYTES, DESCRIPTOR_BYTES, PAGE_BYTES, KvLayout

L = KvLayout(num_blocks=6, num_layers=5, num_kv_heads=3, block_tokens=4, head_dim=8, layer_groups=2)


def test_parts_follow_each_other_page_aligned_and_fit_the_region():
    assert L.block_bytes == 5 * 2 * 3 * 4 * 8 * 4 == L.num_layers * L.layer_bytes
    assert L.kv_bytes_per_token * L.block_tokens == L.block_bytes
    assert L.token_ids_offset >= L.num_blocks * L.block_bytes and L.token_ids_offset % PAGE_BYTES == 0
    assert L.descriptor_offset >= L.token_ids_offset + 6 * 4 * 4
    assert L.counter_offset >= L.descriptor_offset + 6 * DESCRIPTOR_BYTES
    assert L.region_bytes >= L.counter_offset + L.counter_count * COUNTER_BYTES


def test_blocks_are_contiguous_and_layer_groups_split_them_in_order():
    offset, length = L.block_range(2)
    assert (offset, length) == (2 * L.block_bytes, L.block_bytes)
    groups = [L.group_range(2, g) for g in range(2)]
    assert groups[0][0] == offset and groups[0][0] + groups[0][1] == groups[1][0]
    assert groups[1][0] + groups[1][1] == offset + length
    assert [L.group_layers(g) for g in range(2)] == [(0, 2), (2, 5)] and L.group_of_layer(3) == 1


def test_each_block_has_its_own_counters():
    counters = {L.put_trigger(b) for b in range(6)} | {L.put_done(b) for b in range(6)}
    counters |= {L.get_done(b, g) for b in range(6) for g in range(2)}
    assert len(counters) == 6 * L.counters_per_block and max(counters) < L.extra_counter(0)
    with pytest.raises(ValueError):
        L.get_done(0, 2)
    with pytest.raises(ValueError):
        L.block_range(6)


def test_a_chunk_is_its_token_ids_then_its_whole_block():
    runs = L.chunk_runs(1, 3)
    assert [(r.first, r.length, r.count) for r in runs] == [(L.token_ids_range(1)[0], 12, 1),
                                                           (L.block_range(1)[0], L.block_bytes, 1)]
    assert L.chunk_payload_bytes(3) == 12 + L.block_bytes
