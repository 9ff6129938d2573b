from __future__ import annotations

import numpy as np
import pytest

from hostmem.kv_layout import KvLayout
from hostmem.region import Region, RegionError

LAYOUT = KvLayout(num_slots=3, num_layers=2, num_kv_heads=3, max_tokens=16, head_dim=4, chunk_tokens=4)


def test_ranges_match_the_shape_comment():
    # kv: [slot, layer, K|V, kv_head, token, head_dim] as one numpy array over the same bytes
    kv = np.arange(3 * 2 * 2 * 3 * 16 * 4, dtype=np.float32).reshape(3, 2, 2, 3, 16, 4)
    raw = kv.tobytes()
    ranges = LAYOUT.kv_ranges(slot=1, token_start=4, token_end=8)
    assert len(ranges) == 2 * 2 * 3
    gathered = b"".join(raw[o:o + n] for o, n in ranges)
    assert gathered == np.ascontiguousarray(kv[1, :, :, :, 4:8, :]).tobytes()


def test_parts_do_not_overlap_and_fit():
    assert LAYOUT.token_ids_offset >= LAYOUT.num_slots * LAYOUT.slot_bytes
    assert LAYOUT.counter_offset >= LAYOUT.token_ids_offset + 3 * 16 * 4
    assert LAYOUT.region_bytes >= LAYOUT.counter_offset + LAYOUT.counter_count * 16
    counters = {LAYOUT.token_counter(s) for s in range(3)} | {LAYOUT.restore_counter(s) for s in range(3)} \
        | {LAYOUT.offload_counter(s) for s in range(3)}
    assert len(counters) == 9


def test_chunk_token_ranges_cut_the_last_chunk():
    assert LAYOUT.chunk_tokens_range(0, 16) == (0, 4)
    assert LAYOUT.chunk_tokens_range(2, 10) == (8, 10)
    with pytest.raises(ValueError):
        LAYOUT.chunk_tokens_range(3, 10)


@pytest.mark.parametrize("call", [
    lambda: LAYOUT.kv_ranges(3, 0, 1), lambda: LAYOUT.kv_ranges(0, 5, 17), lambda: LAYOUT.token_counter(-1),
])
def test_out_of_range_is_an_error(call):
    with pytest.raises(ValueError):
        call()


def test_region_shared_between_owner_and_attacher(tmp_path):
    name = f"kvtb-test-{id(tmp_path)}"
    owner = Region.create(name, LAYOUT.region_bytes, LAYOUT.counter_offset, LAYOUT.counter_count)
    try:
        peer = Region.attach(name, LAYOUT.region_bytes, LAYOUT.counter_offset, LAYOUT.counter_count)
        owner.write(100, b"hello")
        assert bytes(peer.view(100, 5)) == b"hello"
        owner.store_counter(2, 64)
        peer.add_counter(2, error=1)
        assert owner.read_counter(2) == (64, 1) and owner.counter_total(2) == 65
        with pytest.raises(RegionError):
            peer.view(LAYOUT.region_bytes - 2, 5)
        with pytest.raises(RegionError):
            peer.read_counter(LAYOUT.counter_count)
        peer.close()
    finally:
        owner.close()
    with pytest.raises(RegionError, match="does not exist"):
        Region.attach(name, LAYOUT.region_bytes, LAYOUT.counter_offset, LAYOUT.counter_count)


def test_kv_run_is_kv_ranges_as_one_run():
    for start, end in ((0, 5), (3, 16), (16, 16)):
        run = LAYOUT.kv_run(1, start, end)
        assert [(run.first + i * run.stride, run.length) for i in range(run.count)] == \
            LAYOUT.kv_ranges(1, start, end)
