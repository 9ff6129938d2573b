"""The journal: records replay in order; a torn or corrupt tail is discarded and cut."""
import os

from storage_node import journal as jr
from storage_node.allocator import Extent


def put(key: bytes, n: int) -> jr.Record:
    return jr.Record(jr.PUT, key, n, 0xABCD0000 + n, (Extent(n * 4096, 4096), Extent(0, 4096)))


def test_records_replay_in_order(tmp_path):
    j = jr.Journal(tmp_path / "j")
    assert j.open() == []
    records = [put(b"a", 1), put(b"b", 2), jr.Record(jr.DELETE, b"a")]
    j.append(records[:2])
    j.append(records[2:])
    j.close()
    j2 = jr.Journal(tmp_path / "j")
    assert j2.open() == records
    assert j.records_written == 3 and j.fsyncs == 2


def test_torn_tail_is_discarded_and_cut(tmp_path):
    path = tmp_path / "j"
    j = jr.Journal(path)
    j.open()
    j.append([put(b"a", 1), put(b"b", 2)])
    j.close()
    whole = path.read_bytes()
    for cut in (1, 5, 20):
        path.write_bytes(whole[:-cut])
        j = jr.Journal(path)
        assert j.open() == [put(b"a", 1)]
        assert path.stat().st_size == len(jr.encode(put(b"a", 1)))
        j.append([put(b"c", 3)])          # the journal goes on after the cut
        j.close()
        assert jr.Journal(path).open() == [put(b"a", 1), put(b"c", 3)]


def test_corrupt_or_garbage_tail_is_discarded(tmp_path):
    path = tmp_path / "j"
    good = jr.encode(put(b"a", 1))
    flipped = bytearray(jr.encode(put(b"b", 2)))
    flipped[-1] ^= 0x40
    path.write_bytes(good + bytes(flipped))
    assert jr.Journal(path).open() == [put(b"a", 1)]
    path.write_bytes(good + os.urandom(3) + b"\xff" * 40)
    assert jr.Journal(path).open() == [put(b"a", 1)]


def test_rewrite_compacts_atomically(tmp_path):
    path = tmp_path / "j"
    j = jr.Journal(path)
    j.open()
    j.append([put(b"a", i) for i in range(50)])
    j.rewrite([put(b"a", 49)])
    j.append([put(b"b", 1)])
    j.close()
    assert jr.Journal(path).open() == [put(b"a", 49), put(b"b", 1)]
    assert not os.path.exists(str(path) + ".compact")
