"""Helpers for the agent's process tests: a region standing in for the compute node's pool."""
from __future__ import annotations

import json
import time
import uuid

import grpc
import numpy as np

from hostmem import descriptor
from hostmem.block_hash import Salts, block_hash, hash_chain
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_to_proto
from hostmem.region import Region
from kvtb.credentials import AGENT_NQN
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from tests.conftest import TEST_HOST

LAYOUT = KvLayout(num_blocks=8, num_layers=2, num_kv_heads=2, block_tokens=16, head_dim=8, layer_groups=2)
KEY = "secret"
PLAIN_BYTES, PLAIN_COUNTERS = 1 << 20, 16  # a plain region: no layout, counters in its last page


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
    return layout_to_proto(layout)


class Pool:
    """A compute node's paged pool, created here and registered with the agent: this process plays
    the compute node's part of the contract (descriptors, trigger stores, counters)."""

    def __init__(self, stub: smartnic_pb2_grpc.SmartNicStub, layout: KvLayout = LAYOUT, compute_address: str = ""):
        self.layout, self.stub = layout, stub
        self.region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:12]}", layout.region_bytes,
                                    layout.counter_offset, layout.counter_count)
        self.region_id = stub.RegisterMemory(smartnic_pb2.RegisterMemoryRequest(
            shm_name=self.region.name, size_bytes=layout.region_bytes, access_key=KEY,
            counter_offset=layout.counter_offset, counter_count=layout.counter_count,
            kv_layout=layout_msg(layout), owner="test", compute_address=compute_address)).region_id

    # kv: [block, layer, K|V, kv_head, block_tokens, head_dim] fp32 (a pool of bf16 or fp8: their raw bits)
    def kv(self, block: int) -> np.ndarray:
        L = self.layout
        dtype = {4: np.float32, 2: "<u2", 1: np.uint8}[L.dtype_bytes]
        return np.frombuffer(self.region.view(*L.block_range(block)), dtype=dtype).reshape(
            L.num_layers, 2, L.num_kv_heads, L.block_tokens, L.head_dim)

    def token_ids(self, block: int) -> np.ndarray:
        return np.frombuffer(self.region.view(*self.layout.token_ids_range(block)), dtype="<u4")

    def fill(self, block: int, token_ids, seed: int = 0) -> None:
        rng, kv = np.random.default_rng(seed), self.kv(block)
        kv[...] = (rng.standard_normal(kv.shape, dtype=np.float32) if kv.dtype == np.float32
                   else rng.integers(0, np.iinfo(kv.dtype).max, kv.shape, dtype=kv.dtype, endpoint=True))
        self.token_ids(block)[:len(token_ids)] = token_ids

    def store(self, block: int, index: int, ids, user: str, context: str, tenant: str = "default",
              seed: int | None = None, overrides: dict | None = None,
              shared_tokens: int = 0) -> tuple[bytes, tuple[int, int]]:
        """Fill `block` with block `index` of ids (and KV), describe it and store its trigger, as the
        engine does when a block fills (overrides: descriptor fields to get wrong; shared_tokens: the
        tenant's shared prefix); (its name, the PUT-done counter before)."""
        L, bt = self.layout, self.layout.block_tokens
        chunk = list(ids[index * bt:(index + 1) * bt])
        self.fill(block, chunk, index if seed is None else seed)
        salts = Salts.of(tenant, user, shared_tokens, bt)
        chain = hash_chain(list(ids), salts, bt)
        parent = chain[index - 1] if index else b""
        name = chain[index] if len(chunk) == bt else block_hash(parent, chunk, salts.private)
        generation = self.region.read_counter(L.put_trigger(block))[0] + 1
        fields = dict(generation=generation, chunk_index=index, token_count=len(chunk), hash=name, parent=parent,
                      tenant=tenant, user=user, context=context, shared=salts.is_shared(index, len(chunk) == bt))
        fields.update(overrides or {})
        self.region.write(L.descriptor_range(block)[0], descriptor.encode(descriptor.Descriptor(**fields)))
        before = self.region.read_counter(L.put_done(block))
        self.region.store_counter(L.put_trigger(block), generation)  # the GPU thread's flag write
        return name, before

    def offload(self, ids, user: str, context: str, blocks=None, tenant: str = "default",
                shared_tokens: int = 0) -> list[bytes]:
        """Store every block of ids (full ones and the partial last one), wait until each PUT ended well."""
        bt = self.layout.block_tokens
        blocks = list(range(-(-len(ids) // bt))) if blocks is None else blocks
        stored = [self.store(block, i, ids, user, context, tenant, shared_tokens=shared_tokens)
                  for i, block in enumerate(blocks)]
        for block, (_, before) in zip(blocks, stored):
            assert self.wait_counter(self.layout.put_done(block), sum(before) + 1) == (before[0] + 1, before[1])
        return [name for name, _ in stored]

    def wait_counter(self, counter: int, threshold: int, timeout_s: float = 10.0) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_s
        while self.region.counter_total(counter) < threshold:
            assert time.monotonic() < deadline, (
                f"counter {counter} at {self.region.read_counter(counter)}, waiting for {threshold}")
            time.sleep(0.002)
        return self.region.read_counter(counter)

    def close(self) -> None:
        try:
            self.stub.DeregisterMemory(smartnic_pb2.DeregisterMemoryRequest(region_id=self.region_id, access_key=KEY))
        except grpc.RpcError:
            pass
        self.region.close()


class PlainPool(Pool):
    """A plain region (no layout): one-off PUTs and GETs of ranges, counters in its last page."""

    def __init__(self, stub: smartnic_pb2_grpc.SmartNicStub):
        self.layout, self.stub = None, stub
        self.region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:12]}", PLAIN_BYTES, PLAIN_BYTES - 4096,
                                    PLAIN_COUNTERS)
        self.region_id = stub.RegisterMemory(smartnic_pb2.RegisterMemoryRequest(
            shm_name=self.region.name, size_bytes=PLAIN_BYTES, access_key=KEY, counter_offset=PLAIN_BYTES - 4096,
            counter_count=PLAIN_COUNTERS, owner="test")).region_id

    def op(self, kind: str, trigger: int, threshold: int, completion: int, user: str, context: str, index: int,
           ids_range: tuple[int, int], kv_range: tuple[int, int]) -> smartnic_pb2.TriggeredOp:
        """A one-off PUT or GET of (token ids, KV) ranges, fired when `trigger` reaches `threshold`."""
        tokens = ids_range[1] // 4
        data = dict(ranges=[smartnic_pb2.Range(offset=kv_range[0], length=kv_range[1])],
                    token_ids=smartnic_pb2.Range(offset=ids_range[0], length=ids_range[1]),
                    chunk=smartnic_pb2.ChunkRef(user_id=user, context_id=context, chunk_index=index,
                                                token_start=index * tokens, token_end=(index + 1) * tokens))
        op = smartnic_pb2.TriggeredOp(region_id=self.region_id, access_key=KEY, trigger_counter=trigger,
                                      threshold=threshold, completion_counter=completion)
        getattr(op, kind).CopyFrom(smartnic_pb2.PutOp(**data) if kind == "put" else smartnic_pb2.GetOp(**data))
        return op


class FakeCompute(compute_pb2_grpc.ComputeNodeServicer):
    """The compute node's side of a turn, without a model: on Generate it asks on the stream for the
    stored prefix the agent announced, into `targets` blocks of its pool, waits for those blocks'
    GET counters (as the engine does), and answers one token and a record of what landed."""

    def __init__(self, pool: Pool, targets=(4, 5, 6, 7), timeout_s: float = 10.0):
        self.pool, self.targets, self.timeout_s = pool, list(targets), timeout_s
        self.requests: list[compute_pb2.TurnRequest] = []
        self.outcomes: list[list[tuple[int, int]]] = []  # per turn: (success, error) added to each block

    def Generate(self, request, context):
        self.requests.append(request)
        L, bt, n = self.pool.layout, self.pool.layout.block_tokens, request.stored_tokens
        salts = Salts.of(request.tenant or "default", request.user_id, request.shared_prefix_tokens, bt)
        ids = list(request.token_ids)
        chain = hash_chain(ids[:n], salts, bt)
        names = chain + ([block_hash(chain[-1] if chain else b"", ids[len(chain) * bt:n], salts.private)]
                         if n % bt else [])
        blocks = self.targets[:len(names)]
        counters = [[L.get_done(b, g) for g in range(L.layer_groups)] for b in blocks]
        before = [[self.pool.region.read_counter(c) for c in cs] for cs in counters]
        if names:
            yield compute_pb2.TurnEvent(restore=compute_pb2.RestoreRequest(layer_groups=L.layer_groups, blocks=[
                compute_pb2.RestoreBlock(block=b, hash=h, token_count=min(bt, n - i * bt), chunk_index=i,
                                         shared=salts.is_shared(i, n - i * bt >= bt))
                for i, (b, h) in enumerate(zip(blocks, names))]))
        deadline = time.monotonic() + self.timeout_s
        landed = []
        for cs, bs in zip(counters, before):
            for c, (s0, e0) in zip(cs, bs):
                while sum(self.pool.region.read_counter(c)) <= s0 + e0 and time.monotonic() < deadline:
                    time.sleep(0.001)
            got = [self.pool.region.read_counter(c) for c in cs]
            landed.append((sum(s for s, _ in got) - sum(s for s, _ in bs), sum(e for _, e in got) - sum(e for _, e in bs)))
        self.outcomes.append(landed)
        ok = sum(1 for s, e in landed if s and not e)
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=7, text="hi"))
        now = time.time_ns()
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, kv_source="restored" if names and ok == len(names) else "none",
            tokens_reused=n if ok == len(names) else 0, blocks_restored=ok, blocks_failed=len(names) - ok,
            steps=[compute_pb2.Step(step=8, name="inference", start_unix_ns=now, end_unix_ns=now)]))

    def Info(self, request, context):
        return compute_pb2.InfoResponse(model="fake", num_blocks=self.pool.layout.num_blocks,
                                        block_tokens=self.pool.layout.block_tokens)
