"""The KV dtypes a pool may hold: sizes and codes, a layout of each, and its registration message."""
import pytest

from hostmem import kv_dtype as kvd
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_from_proto, layout_to_proto
from hostmem.region import RegionError

SHAPE = dict(num_blocks=4, num_layers=2, num_kv_heads=1, block_tokens=8, head_dim=4)


def test_sizes_and_codes_are_distinct_and_fp32_is_code_0():
    assert [kvd.size(d) for d in kvd.KV_DTYPES] == [4, 2, 1]
    assert kvd.code("float32") == 0 and len({kvd.code(d) for d in kvd.KV_DTYPES}) == len(kvd.KV_DTYPES)
    assert all(kvd.name_of(kvd.code(d)) == d for d in kvd.KV_DTYPES)
    with pytest.raises(kvd.KvDtypeError, match="float16"):
        kvd.size("float16")
    with pytest.raises(kvd.KvDtypeError):
        kvd.name_of(6)


@pytest.mark.parametrize("dtype", list(kvd.KV_DTYPES))
def test_a_layout_of_each_dtype_halves_its_bytes_and_travels_in_its_message(dtype):
    layout = KvLayout.of_dtype(dtype, **SHAPE)
    assert layout.kv_dtype == dtype and layout.block_bytes == KvLayout(**SHAPE).block_bytes * kvd.size(dtype) // 4
    assert layout_from_proto(layout_to_proto(layout)) == layout


def test_a_layout_says_its_dtype_or_is_raw_bytes_and_a_wrong_size_is_refused():
    assert KvLayout(**SHAPE).kv_dtype == "float32"        # 4 bytes, no type given: fp32, as before
    assert KvLayout(dtype_bytes=2, **SHAPE).kv_dtype == ""  # raw bytes of no stated type
    with pytest.raises(ValueError, match="2 bytes an element"):
        KvLayout(dtype_bytes=4, kv_dtype="bfloat16", **SHAPE)
    with pytest.raises(ValueError, match="unknown kv_dtype"):
        KvLayout(dtype_bytes=2, kv_dtype="float16", **SHAPE)
    message = layout_to_proto(KvLayout.of_dtype("bfloat16", **SHAPE))
    message.dtype_bytes = 4  # a registration whose type and size disagree
    with pytest.raises(RegionError, match="invalid kv_layout"):
        layout_from_proto(message)
