"""Many values from two hosts at once, and kill -9 in the middle of a stream of Stores."""
import threading
import time

import numpy as np
import pytest

from kvtb.crc32c import crc32c
from kvtb_proto import nvmeof_pb2 as pb
from fabric import status as st
from fabric.client import FabricClient, StorageStatusError

from .conftest import GOOD_HOST
from tests.conftest import fabric_client

MIB = 1 << 20
POOL = np.random.default_rng(7).integers(0, 256, 17 * MIB, dtype=np.uint8)  # [17 MiB] uint8


def value_frames(key: bytes, size: int, offset: int) -> list:
    """A value of size bytes: the key (16-byte padded) then a slice of POOL; as two frames."""
    prefix = key.ljust(16, b"\0")[:min(16, size)]
    return [prefix, memoryview(POOL)[offset:offset + size - len(prefix)]]


def same(payload: memoryview, frames: list) -> bool:
    """payload equals the concatenation of frames (compared without joining them)."""
    pos = 0
    for frame in frames:
        n = len(frame)
        if payload[pos:pos + n] != memoryview(frame):
            return False
        pos += n
    return pos == payload.nbytes


def random_sizes(rng: np.random.Generator, count: int) -> list[int]:
    """Mostly small values (1 B..64 KiB, log-uniform), one in 25 up to 16 MiB."""
    small = np.exp(rng.uniform(0, np.log(64 * 1024), count)).astype(int)
    large = rng.integers(1, 16 * MIB + 1, count)
    return [int(l if rng.random() < 0.04 else s) for s, l in zip(small, large)]


def pipelined(client: FabricClient, calls, window: int = 16) -> list:
    """Run calls (each returning a Future) with at most window in flight; return their completions."""
    done, inflight = [], []
    for call in calls:
        if len(inflight) >= window:
            done.append(inflight.pop(0).result())
        inflight.append(call())
    done.extend(f.result() for f in inflight)
    return done


def store_future(client, key, frames):
    length = sum(len(f) for f in frames)
    capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=key,
                                value_length=length, crc32c=crc32c(frames), has_crc32c=True)
    return client.submit(capsule, frames)


def retrieve_future(client, key):
    return client.submit(pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1,
                                           key=key))


@pytest.mark.slow
def test_two_hosts_store_and_retrieve_1000_values_each_concurrently(start_service, node_config):
    node = start_service("storage", "serve", "storage", "--config",
                         node_config(allowed_hosts={"*": "*"}, namespace_size_bytes=8 << 30))
    failures: list[str] = []

    def host(n: int) -> None:
        rng = np.random.default_rng(n)
        sizes = random_sizes(rng, 1000)
        offsets = [int(rng.integers(0, MIB)) for _ in sizes]
        keys = [b"h%d-%d" % (n, i) for i in range(1000)]
        values = [value_frames(k, s, o) for k, s, o in zip(keys, sizes, offsets)]
        with fabric_client(node.addresses["fabric"], f"{GOOD_HOST}-{n}", timeout_s=60) as client:
            calls = [lambda k=k, v=v: store_future(client, k, v) for k, v in zip(keys, values)]
            stored = pipelined(client, calls)
            failures.extend(f"host {n} store: {c.response}" for c in stored if not c.ok)
            got = pipelined(client, [lambda k=k: retrieve_future(client, k) for k in keys])
            for key, size, frames, c in zip(keys, sizes, values, got):
                if not c.ok or c.response.value_length != size or not same(c.payload(), frames):
                    failures.append(f"host {n}: {key!r} ({size} bytes) read back wrong: {c.response}")

    threads = [threading.Thread(target=host, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


@pytest.mark.slow
def test_kill_9_during_stores_loses_no_acknowledged_value_and_shows_no_half_value(start_service, node_config):
    config = node_config(namespace_size_bytes=4 << 30)
    node = start_service("storage", "serve", "storage", "--config", config)
    rng = np.random.default_rng(3)
    sizes = [int(s) for s in rng.integers(1, 2 * MIB, 100_000)]
    acked: set[int] = set()
    sent: set[int] = set()
    stop = threading.Event()
    ended_by: list[Exception] = []

    def stream() -> None:
        client = fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=3)
        client.connect()
        try:
            inflight = []
            for i, size in enumerate(sizes):
                if stop.is_set():
                    break
                if len(inflight) >= 8:
                    j, future = inflight.pop(0)
                    if future.result().ok:
                        acked.add(j)
                sent.add(i)
                inflight.append((i, store_future(client, b"k%d" % i, value_frames(b"k%d" % i, size, i))))
        except Exception as exc:  # noqa: BLE001 - the node was killed under us: expected
            ended_by.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 20
    while len(acked) < 150 and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.01)
    node.kill()
    thread.join(30)
    assert len(acked) >= 150, "too few stores acknowledged before the kill"
    assert sent - acked, "no store was in flight at the kill"

    node = start_service("storage-restarted", "serve", "storage", "--config", config)
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
        for i in sorted(sent):
            key = b"k%d" % i
            try:
                done = client.retrieve(1, key)
            except StorageStatusError as err:
                assert i not in acked, f"acknowledged store {i} lost: {err}"
                assert err.status == st.KEY_DOES_NOT_EXIST, f"store {i}: {err}"
                continue
            assert same(done.payload(), value_frames(key, sizes[i], i)), f"store {i} reads back wrong"
        assert set(client.list_keys(1, max_keys=100_000)) <= {b"k%d" % i for i in sent}
