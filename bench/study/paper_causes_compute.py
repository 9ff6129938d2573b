"""The causes study's compute process: a spawned child holding the CPU-centric path and the triggered
path's trigger writes over one pool the parent registered with its agent (bench.study.paper_get's rig).

put(mode, ...) stores every block of the pool as one context (CPU-centric: compute_node.cpu_offload's
CpuOffload, each block's ack waited for; triggered: TriggeredOffload's descriptor and counter, then the
PUT-done counters polled, that wait not counted as CPU); get(names) retrieves the CPU-centric path's
blocks itself (CpuStore.restore, each block checked before it lands); forget() deletes them.
"""
from __future__ import annotations

import time
import traceback
from typing import Any

from bench.study.child_process import ChildProcess

NSID = 1
SALT = "kvtb-study-causes-salt"
TENANT, KEY = "default", "causes"
TOKEN_ID_SPACE = 49152
# the pool's shape, as `kvtb study paper` has it: 32 layers, 2 KV heads, head_dim 64, fp32: 32 KiB a token
NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, DTYPE_BYTES = 32, 2, 64, 4
TOKEN_KV_BYTES = NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE_BYTES
BLOCK_TOKENS = 32  # 1 MiB blocks
MODES = ("cpu", "triggered")


def layout_for_size(size: int):
    """A pool holding exactly `size` bytes of KV in blocks of up to BLOCK_TOKENS tokens (ValueError otherwise)."""
    from hostmem.kv_layout import KvLayout

    tokens, rest = divmod(size, TOKEN_KV_BYTES)
    if size <= 0 or rest:
        raise ValueError(f"a KV size must be a positive multiple of {TOKEN_KV_BYTES} bytes, got {size}")
    block_tokens = min(BLOCK_TOKENS, tokens)
    if tokens % block_tokens:
        raise ValueError(f"{tokens} tokens do not fill whole blocks of {block_tokens}")
    return KvLayout(num_blocks=tokens // block_tokens, num_layers=NUM_LAYERS, num_kv_heads=NUM_KV_HEADS,
                    block_tokens=block_tokens, head_dim=HEAD_DIM, dtype_bytes=DTYPE_BYTES)


# -- the compute process ---------------------------------------------------------------------------------

class _Compute:
    """The child's state: its CpuStore, and the pool it attached (with both offloaders)."""

    def __init__(self, fabric_address: str, host_nqn: str):
        from compute_node.cpu_offload import CpuStore
        from fabric.auth import FabricSecurity
        from kvtb.credentials import Credentials, resolve_dir

        mac_key = Credentials(resolve_dir(""), "compute").kv_mac_key()
        self.address = fabric_address
        self.store = CpuStore((fabric_address,), host_nqn, NSID, SALT, timeout_s=60.0,
                              security=FabricSecurity.for_host("auth", "", host_nqn), mac_key=mac_key)
        self.pool = self.trig = self.cpu = None
        self.store.client(fabric_address)  # connect and authenticate now: no sample pays the handshake

    def attach(self, name: str, fields: dict) -> None:
        from compute_node.cpu_offload import CpuOffload
        from compute_node.kv_pool import KvPool
        from compute_node.offload import TriggeredOffload
        from hostmem.kv_layout import KvLayout
        from hostmem.region import Region

        L = KvLayout(**fields)
        self.pool = KvPool(L, Region.attach(name, L.region_bytes, L.counter_offset, L.counter_count))
        self.trig, self.cpu = TriggeredOffload(self.pool, drain_timeout_s=300.0), CpuOffload(self.pool, self.store)

    def detach(self) -> None:
        self.trig = self.cpu = None
        self.pool.close()
        self.pool = None

    def put(self, mode: str, user: str, context: str) -> dict:
        """Store every block of the pool as `user`'s context; timed, with this process's CPU time."""
        import numpy as np

        from compute_node.offload import Block, OffloadStats
        from hostmem.block_hash import hash_chain, salt_for

        pool, L = self.pool, self.pool.layout
        n, bt = L.num_blocks, L.block_tokens
        ids = (np.arange(n * bt, dtype=np.int64) % TOKEN_ID_SPACE).astype("<u4")
        pool.token_ids[:] = ids.reshape(n, bt)
        names = hash_chain(ids.tolist(), salt_for(TENANT, user), bt)
        blocks = [Block(b, b, bt, names[b], names[b - 1] if b else b"", TENANT, user, context) for b in range(n)]
        stats, step = OffloadStats(), L.counters_per_block
        done = pool.counters[1:n * step:step]  # [block, success|error]: the PUT-done counters
        base, base_errors, errors = int(done.sum()), int(done[:, 1].sum()), self.cpu.errors
        start, cpu0 = time.perf_counter(), time.process_time()
        if mode == "triggered":
            for block in blocks:
                self.trig.store(block, stats)
            cpu1 = time.process_time()  # the trigger writes: the compute process's part
            deadline = time.perf_counter() + 300.0
            while int(done.sum()) < base + n:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{base + n - int(done.sum())} of {n} triggered PUTs did not end")
                time.sleep(0.0002)
            end = time.perf_counter()
            failed = int(done[:, 1].sum()) - base_errors
        elif mode == "cpu":
            for block in blocks:
                self.cpu.store(block, stats)
            end, cpu1 = time.perf_counter(), time.process_time()
            failed = self.cpu.errors - errors
        else:
            raise ValueError(f"mode {mode!r}")
        if failed:
            raise RuntimeError(f"{failed} of {n} {mode} stores failed ({self.cpu.last_error})")
        return {"e2e_s": end - start, "compute_cpu_s": cpu1 - cpu0, "names": names,
                "bytes": n * L.block_bytes, "blocks": n}

    def get(self, names: list[bytes]) -> dict:
        """Retrieve every block (stored by put("cpu", ...)) into its pool block, checked; timed."""
        from compute_node.restore import BlockRestore, PendingRestore

        pool, L = self.pool, self.pool.layout
        pool.region.array[:L.num_blocks * L.block_bytes] = 0  # untimed: the bytes must land again
        blocks = []
        for b, name in enumerate(names):
            counters = tuple(L.get_done(b, g) for g in range(L.layer_groups))
            blocks.append(BlockRestore(b, b, name, L.block_tokens, counters,
                                       tuple(pool.read_counter(c) for c in counters)))
        pending = PendingRestore(blocks, 0, L.num_blocks * L.block_tokens, time.time_ns(), time.monotonic() + 300)
        start, cpu0 = time.perf_counter(), time.process_time()
        self.store.restore(pool, None, pending)
        end, cpu1 = time.perf_counter(), time.process_time()
        failed = sum(pool.read_counter(c)[1] - base[1] for b in blocks for c, base in zip(b.counters, b.bases))
        if failed:
            raise RuntimeError(f"{failed} of {len(blocks)} CPU-centric GETs failed")
        return {"e2e_s": end - start, "compute_cpu_s": cpu1 - cpu0, "bytes": L.num_blocks * L.block_bytes}

    def forget(self) -> None:
        """Delete every block this process stored (untimed)."""
        client = self.store.client(self.address)
        for stored in self.store.index.values():
            client.delete(NSID, stored.key)
        self.store.index.clear()


def _compute_main(conn, fabric_address: str, host_nqn: str) -> None:
    """Child process: answers (kind, *args) messages with ("ok", value) or ("error", text) until None."""
    compute = None
    try:
        compute = _Compute(fabric_address, host_nqn)
        conn.send(("ok", None))
        while (message := conn.recv()) is not None:
            try:
                conn.send(("ok", getattr(compute, message[0])(*message[1:])))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    except EOFError:
        pass
    except Exception as exc:  # noqa: BLE001 - the start failed: say so
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if compute is not None:
            compute.store.close()
            if compute.pool is not None:
                compute.pool.close()


class ComputeProcess(ChildProcess):
    """The rig's compute process: call(kind, *args) runs _Compute.kind in it."""

    def __init__(self, fabric_address: str, host_nqn: str, timeout_s: float = 120.0):
        super().__init__(_compute_main, (fabric_address, host_nqn), "kvtb-study-causes-compute", timeout_s)

    def call(self, kind: str, *args: Any, timeout_s: float = 900.0) -> Any:  # type: ignore[override]
        return super().call((kind, *args), timeout_s)
