"""A pool of bf16 or fp8 KV through the agent and a real storage node: the chunks record the dtype, a
restore lands the same bits, and a restore into a pool of another dtype is refused, never misread."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fabric import chunk_format as cf
from hostmem.kv_layout import KvLayout
from kvtb_proto import smartnic_pb2
from tests.conftest import fabric_client
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import LAYOUT
from tests.smartnic.test_agent_service import CTX, IDS, USER, stats, turn


def layout_of(dtype: str) -> KvLayout:
    fields = {f.name: getattr(LAYOUT, f.name) for f in dataclasses.fields(LAYOUT)
              if f.name not in ("dtype_bytes", "kv_dtype")}
    return KvLayout.of_dtype(dtype, **fields)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_narrow_pool_stores_its_dtype_and_restores_the_same_bits(agent, storage, dtype):
    with compute_beside(agent[0].addresses["grpc"], layout_of(dtype)) as (pool, fake, channel):
        assert pool.layout.block_bytes == LAYOUT.block_bytes * pool.layout.dtype_bytes // 4
        pool.offload(IDS, USER, CTX)
        found = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=CTX))
        with fabric_client(storage[0][1].addresses["fabric"]) as client:
            value = bytes(client.retrieve(1, found.chunks[1].key).payload())
        header, n = cf.decode_header(value)
        assert header.kv_dtype == dtype and cf.value_layout(header, n).kv_bytes == pool.layout.block_bytes
        turn(channel, IDS + [7, 8, 9])
        assert fake.outcomes[-1] == [(2, 0)] * 4
        for source, target in zip(range(4), range(4, 8)):
            assert pool.kv(target).tobytes() == pool.kv(source).tobytes()


def test_a_restore_into_a_pool_of_another_dtype_is_refused_and_counted(agent):
    with compute_beside(agent[0].addresses["grpc"], layout_of("bfloat16")) as (pool, _, _):
        pool.offload(IDS, USER, CTX)
    with compute_beside(agent[0].addresses["grpc"], LAYOUT) as (pool, fake, channel):  # fp32, same names
        before = [pool.kv(b).tobytes() for b in range(4, 8)]
        turn(channel, IDS + [7, 8, 9])
        assert fake.requests[-1].stored_tokens == len(IDS)  # found by name...
        assert fake.outcomes[-1] == [(0, 2)] * 4            # ...but every group ends on its error part
        assert [pool.kv(b).tobytes() for b in range(4, 8)] == before  # nothing was written
        assert stats(pool).errors_by_kind["dtype_mismatch"] == 4
