"""Helpers for the agent's process tests: a region standing in for the compute node's pool."""
from __future__ import annotations

import json
import time
import uuid

import grpc
import numpy as np

from fabric.auth import AGENT_NQN
from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc
from tests.conftest import TEST_HOST
from hostmem.kv_layout import KvLayout
from hostmem.region import Region

LAYOUT = KvLayout(num_slots=2, num_layers=2, num_kv_heads=2, max_tokens=64, head_dim=8, chunk_tokens=16)
KEY = "secret"


def storage_env(tmp_path, name: str) -> dict[str, str]:
    """A storage node's environment: its allow list is the agent's NQN and the tests' own host."""
    return {"KVTB_STORAGE_NODE_NAME": name, "KVTB_STORAGE_DATA_DIR": str(tmp_path / name),
            "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
            "KVTB_STORAGE_SUBSYSTEM_NQN": f"nqn.2026-11.org.kvtestbed:{name}",
            "KVTB_STORAGE_NAMESPACE_SIZE_BYTES": str(1 << 30),
            "KVTB_STORAGE_ALLOWED_HOSTS": json.dumps({AGENT_NQN: "*", TEST_HOST: "*"})}


def agent_env(storage_procs, **extra) -> dict[str, str]:
    """Environment of an agent using (name, process or its addresses) as storage nodes."""
    addrs = [(name, getattr(p, "addresses", p)) for name, p in storage_procs]
    nodes = ",".join(f"{name}={a['admin']}={a['fabric']}" for name, a in addrs)
    env = {"KVTB_SMARTNIC_LISTEN_ADDRESS": "127.0.0.1:0", "KVTB_SMARTNIC_STORAGE_NODES": nodes,
           "KVTB_SMARTNIC_SALT": "test-salt", "KVTB_SMARTNIC_GET_TIMEOUT_S": "1.0",
           "KVTB_SMARTNIC_RECONNECT_INTERVAL_S": "0.3"}
    env.update({f"KVTB_SMARTNIC_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def layout_msg(layout: KvLayout = LAYOUT) -> smartnic_pb2.KvLayout:
    s = range(layout.num_slots)
    return smartnic_pb2.KvLayout(
        num_slots=layout.num_slots,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        max_tokens=layout.max_tokens,
        head_dim=layout.head_dim,
        dtype_bytes=layout.dtype_bytes,
        chunk_tokens=layout.chunk_tokens,
        kv_offset=layout.kv_offset,
        token_ids_offset=layout.token_ids_offset,
        slot_token_counter=[layout.token_counter(i) for i in s],
        slot_restore_counter=[layout.restore_counter(i) for i in s],
        slot_offload_counter=[layout.offload_counter(i) for i in s],
    )


class Pool:
    """A compute node's KV pool: a region created here and registered with the agent."""

    def __init__(
        self, stub: smartnic_pb2_grpc.SmartNicStub, layout: KvLayout = LAYOUT, compute_address: str = ""
    ):
        self.layout, self.stub = layout, stub
        self.region = Region.create(
            f"kvtb-test-{uuid.uuid4().hex[:12]}",
            layout.region_bytes,
            layout.counter_offset,
            layout.counter_count,
        )
        self.region_id = stub.RegisterMemory(
            smartnic_pb2.RegisterMemoryRequest(
                shm_name=self.region.name,
                size_bytes=layout.region_bytes,
                access_key=KEY,
                counter_offset=layout.counter_offset,
                counter_count=layout.counter_count,
                kv_layout=layout_msg(layout),
                owner="test",
                compute_address=compute_address,
            )
        ).region_id

    # kv: [slot, layer, K|V, kv_head, token, head_dim] fp32
    def kv(self, slot: int) -> np.ndarray:
        lay = self.layout
        view = self.region.view(lay.row_offset(slot, 0, 0, 0), lay.slot_bytes)
        return np.frombuffer(view, dtype=np.float32).reshape(
            lay.num_layers, 2, lay.num_kv_heads, lay.max_tokens, lay.head_dim
        )

    def token_ids(self, slot: int) -> np.ndarray:
        off, n = self.layout.token_ids_range(slot, 0, self.layout.max_tokens)
        return np.frombuffer(self.region.view(off, n), dtype="<u4")

    def fill(self, slot: int, token_ids, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.kv(slot)[...] = rng.standard_normal(self.kv(slot).shape, dtype=np.float32)
        self.token_ids(slot)[: len(token_ids)] = token_ids

    def put_ops(self, slot: int, user: str, context: str, num_tokens: int,
                by_ranges: bool = False) -> list[smartnic_pb2.TriggeredOp]:
        """PUTs of a slot's chunks, named as the compute node names them (slot and tokens) or by ranges."""
        lay, ops = self.layout, []
        for i in range(-(-num_tokens // lay.chunk_tokens)):
            start, end = lay.chunk_tokens_range(i, num_tokens)
            ids_off, ids_len = lay.token_ids_range(slot, start, end)
            ops.append(
                smartnic_pb2.TriggeredOp(
                    region_id=self.region_id,
                    access_key=KEY,
                    trigger_counter=lay.token_counter(slot),
                    threshold=end,
                    completion_counter=lay.offload_counter(slot),
                    put=smartnic_pb2.PutOp(
                        chunk=smartnic_pb2.ChunkRef(
                            user_id=user, context_id=context, chunk_index=i, token_start=start, token_end=end
                        ),
                    ),
                )
            )
            if by_ranges:
                ops[-1].put.ranges.extend(
                    smartnic_pb2.Range(offset=o, length=n) for o, n in lay.kv_ranges(slot, start, end))
                ops[-1].put.token_ids.CopyFrom(smartnic_pb2.Range(offset=ids_off, length=ids_len))
            else:
                ops[-1].put.slot = slot
        return ops

    def wait_counter(self, counter: int, threshold: int, timeout_s: float = 10.0) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_s
        while self.region.counter_total(counter) < threshold:
            assert time.monotonic() < deadline, (
                f"counter {counter} at {self.region.read_counter(counter)}, waiting for {threshold}"
            )
            time.sleep(0.002)
        return self.region.read_counter(counter)

    def close(self) -> None:
        try:
            self.stub.DeregisterMemory(
                smartnic_pb2.DeregisterMemoryRequest(region_id=self.region_id, access_key=KEY)
            )
        except grpc.RpcError:
            pass
        self.region.close()
