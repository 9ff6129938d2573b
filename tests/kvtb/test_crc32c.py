"""crc32c over every kind of buffer the data path meets, on both sides of the GIL threshold."""
from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
import zmq

from kvtb import crc32c as crc

DATA = np.random.default_rng(3).integers(0, 256, 2 * crc.RELEASE_GIL_BYTES + 5, dtype=np.uint8)


@pytest.mark.parametrize("size", [0, 1, 4096, crc.RELEASE_GIL_BYTES - 1, crc.RELEASE_GIL_BYTES, DATA.size])
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "numpy", "memoryview", "readonly", "zmq"])
def test_matches_google_crc32c(size, kind):
    data = DATA[:size]
    buf = {"bytes": lambda: data.tobytes(), "bytearray": lambda: bytearray(data.tobytes()),
           "numpy": lambda: data, "memoryview": lambda: memoryview(data),
           "readonly": lambda: memoryview(data.tobytes()),
           "zmq": lambda: zmq.Frame(data.tobytes()).buffer}[kind]()
    assert crc.crc32c(buf) == google_crc32c.value(data.tobytes())


def test_a_list_of_buffers_is_their_concatenation():
    parts = [DATA[:10].tobytes(), memoryview(DATA)[10:5000], DATA[5000:].reshape(-1, 1)]
    assert crc.crc32c(parts) == google_crc32c.value(DATA.tobytes())


def test_extend_continues_a_crc():
    head, tail = DATA[:777], DATA[777:]
    assert crc.extend(crc.crc32c(head), tail) == crc.crc32c(DATA)
