"""The element types a KV pool may hold, by name, as torch and vLLM's `kv_cache_dtype` name them (pure).

    float32        4 bytes  the model's compute precision; exact
    bfloat16       2 bytes  fp32's range, 8 bits of mantissa (vLLM's CPU backend keeps KV so)
    float8_e4m3fn  1 byte   range +-448, 3 bits of mantissa; values beyond are clamped on write

A pool's dtype is part of its layout (hostmem.kv_layout), registered with the agent, and recorded in
every stored chunk's header (fabric.chunk_format: its code in the flags byte), so a restore into a pool
of another dtype is refused (and the KV recomputed), never misread.
"""
from __future__ import annotations

# name -> (bytes per element, code in a chunk header's flags); code 0 is what every chunk written
# before the dtype was recorded holds: fp32, the only pool there was
KV_DTYPES: dict[str, tuple[int, int]] = {"float32": (4, 0), "bfloat16": (2, 1), "float8_e4m3fn": (1, 2)}
DEFAULT = "float32"
_BY_CODE = {code: name for name, (_, code) in KV_DTYPES.items()}


class KvDtypeError(ValueError):
    """A KV dtype this testbed does not know."""


def check(name: str) -> str:
    """`name` if it is a known KV dtype, else KvDtypeError naming the known ones."""
    if name not in KV_DTYPES:
        raise KvDtypeError(f"unknown KV dtype {name!r} (one of {', '.join(KV_DTYPES)})")
    return name


def size(name: str) -> int:
    """Bytes per element."""
    return KV_DTYPES[check(name)][0]


def code(name: str) -> int:
    """Its code in a chunk header (0 to 7)."""
    return KV_DTYPES[check(name)][1]


def name_of(value: int) -> str:
    """The dtype of a header's code; KvDtypeError for a code no writer uses."""
    if value not in _BY_CODE:
        raise KvDtypeError(f"unknown KV dtype code {value}")
    return _BY_CODE[value]
