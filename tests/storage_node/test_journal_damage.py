"""A damaged journal never brings back a deleted or replaced value (issue 31, item 5).

Each test stores and deletes through a real key-value namespace on real files, damages the
journal's bytes as a flipped byte or a cut would, and opens a fresh namespace on the files.
"""
import random

from fabric import status as st
from fabric.status import NvmeError
from storage_node import journal as jr
from storage_node.kv_namespace import KvNamespace, PendingDelete
from tests.conftest import fabric_client

from .conftest import GOOD_HOST

MIB = 1 << 20


def open_namespace(path) -> KvNamespace:
    ns = KvNamespace(1, path, 32 * MIB, fsync=False)
    ns.open()
    return ns


def store(ns: KvNamespace, key: bytes, data: bytes) -> tuple[int, int]:
    """Store data under key; the byte span of its journal record."""
    start = ns.journal.size_bytes
    pending = ns.reserve(key, len(data))
    ns.write(pending, [data])
    assert ns.commit([pending]) == [st.SUCCESS]
    return start, ns.journal.size_bytes


def delete(ns: KvNamespace, key: bytes) -> tuple[int, int]:
    """Delete key; the byte span of its journal record."""
    start = ns.journal.size_bytes
    assert ns.commit([PendingDelete(key)]) == [st.SUCCESS]
    return start, ns.journal.size_bytes


def read(ns: KvNamespace, key: bytes) -> bytes | None:
    """The value's bytes, or None when the key is absent."""
    try:
        data, _, _ = ns.retrieve(key)
    except NvmeError as exc:
        assert exc.status == st.KEY_DOES_NOT_EXIST, exc
        return None
    out = bytes(data)
    del data
    return out


def build(tmp_path, steps) -> tuple:
    """Run steps (("store", key, value) or ("delete", key)) on a fresh namespace; its path, the
    journal's bytes and each step's record span."""
    path = tmp_path / "ns1.data"
    ns = open_namespace(path)
    spans = [store(ns, step[1], step[2]) if step[0] == "store" else delete(ns, step[1]) for step in steps]
    ns.close()
    journal = path.parent / "ns1.data.journal"
    return path, journal, journal.read_bytes(), spans


def reopen(path, journal, damaged: bytes) -> dict[bytes, bytes | None]:
    """Write the damaged journal, open the namespace twice (the second time on the journal the first
    rewrote), and what each open reads of keys A, B, C; both must agree."""
    journal.write_bytes(damaged)
    seen = []
    for _ in range(2):
        ns = open_namespace(path)
        seen.append({k: read(ns, k) for k in (b"A", b"B", b"C")})
        ns.close()
    assert seen[0] == seen[1], "a second replay reads differently"
    return seen[0]


# D keeps C off A's freed space (a value on a newer value's extents is set aside anyway)
DELETE_STEPS = [("store", b"B", b"b" * 5000), ("store", b"A", b"a" * 5000), ("store", b"D", b"d"),
                ("delete", b"A"), ("store", b"C", b"c" * 20000)]


def test_a_flipped_byte_anywhere_in_a_delete_record_never_brings_the_value_back(tmp_path):
    path, journal, whole, spans = build(tmp_path, DELETE_STEPS)
    start, end = spans[3]
    for at in range(start, end):
        for bit in (0x01, 0x80):
            damaged = bytearray(whole)
            damaged[at] ^= bit
            got = reopen(path, journal, bytes(damaged))
            assert got[b"A"] is None, f"the deleted value came back (byte {at - start} of the Delete)"
            # one flip leaves one of the record's two checksummed copies of its key: only A is doubtful
            assert got[b"B"] == b"b" * 5000 and got[b"C"] == b"c" * 20000, f"byte {at - start}"


def test_a_torn_last_record_that_was_a_delete_never_brings_the_value_back(tmp_path):
    path, journal, whole, spans = build(tmp_path, DELETE_STEPS[:4])
    start, end = whole.index(jr.MAGIC3, spans[3][0]), spans[3][1]  # after the zeros that may come first
    key_end = start + jr.head_size(jr.Record(jr.DELETE, b"A"))  # where its first copy of its key ends
    for cut in range(start + 1, end):
        got = reopen(path, journal, whole[:cut])
        assert got[b"A"] is None, f"the deleted value came back (record cut after {cut - start} bytes)"
        # with the key readable only A is doubtful; without it every older value is
        assert got[b"B"] == (b"b" * 5000 if cut >= key_end else None), f"cut after {cut - start} bytes"
    assert reopen(path, journal, whole[:start]) == {b"A": b"a" * 5000, b"B": b"b" * 5000, b"C": None}


def test_a_damaged_put_in_the_middle_does_not_bring_back_the_older_version(tmp_path):
    steps = [("store", b"B", b"b" * 5000), ("store", b"A", b"old" * 2000), ("store", b"A", b"new" * 2000),
             ("store", b"C", b"c" * 20000)]
    path, journal, whole, spans = build(tmp_path, steps)
    start, end = spans[2]
    for at in range(start, end, 3):
        damaged = bytearray(whole)
        damaged[at] ^= 0x10
        got = reopen(path, journal, bytes(damaged))
        assert got[b"A"] is None, f"byte {at - start}: A read {got[b'A'][:6]!r}"
        assert got[b"B"] == b"b" * 5000 and got[b"C"] == b"c" * 20000


def test_a_record_whose_key_cannot_be_read_drops_every_older_value_and_keeps_the_later_ones(tmp_path):
    path, journal, whole, spans = build(tmp_path, DELETE_STEPS)
    start, end = spans[3]
    damaged = whole[:start] + bytes(end - start) + whole[end:]  # the Delete zeroed: both copies gone
    assert reopen(path, journal, damaged) == {b"A": None, b"B": None, b"C": b"c" * 20000}


def test_random_damage_never_serves_a_deleted_or_older_value(tmp_path):
    """Seeded: batches of Stores and Deletes, then flips, inserted garbage and a torn last record;
    each key reads as its last stored value or not at all. (A cut that takes whole records off
    the end is out of replay's sight: see docs/contracts.md.)"""
    rng = random.Random(31)
    for trial in range(200):
        path = tmp_path / f"t{trial}" / "ns1.data"
        path.parent.mkdir()
        ns = open_namespace(path)
        latest: dict[bytes, bytes | None] = {}
        for _ in range(rng.randrange(3, 25)):
            ops, values = [], []
            for _ in range(rng.randrange(1, 5)):
                key = b"k%d" % rng.randrange(10)
                if latest.get(key) is not None and rng.random() < 0.3:
                    ops.append(PendingDelete(key))
                    values.append(None)
                else:
                    values.append(rng.randbytes(rng.randrange(1, 9000)))
                    ops.append(ns.reserve(key, len(values[-1])))
                    ns.write(ops[-1], [values[-1]])
            for op, value, status in zip(ops, values, ns.commit(ops)):
                if status.ok:
                    latest[op.key] = value
        ns.close()
        journal = path.parent / "ns1.data.journal"
        whole = journal.read_bytes()
        data, last = bytearray(whole), whole.rindex(jr.MAGIC3)
        for _ in range(rng.randrange(1, 4)):
            kind, at = rng.randrange(3), rng.randrange(len(data))
            if kind == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif kind == 1 and len(data) == len(whole):  # torn inside the last record
                del data[rng.randrange(last + 1, len(whole)):]
            elif kind == 2:
                data[at:at] = rng.randbytes(rng.randrange(1, 64))
        journal.write_bytes(bytes(data))
        for _ in range(2):  # and again on the journal the first open rewrote
            ns = open_namespace(path)
            for key, value in latest.items():
                got = read(ns, key)
                assert got is None or got == value, f"trial {trial}: {key!r} read back an older or deleted value"
            ns.close()


def test_a_real_node_killed_after_a_delete_whose_record_is_then_damaged_does_not_serve_the_value(
        start_service, node_config, tmp_path):
    config = node_config()
    node = start_service("storage", "serve", "storage", "--config", config)
    journal = tmp_path / "data" / "ns1.data.journal"
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
        client.store(1, b"B", [b"b" * 5000])
        client.store(1, b"A", [b"a" * 5000])
        client.store(1, b"D", [b"d"])
        start = journal.stat().st_size  # acknowledged: the records are durable, the file this long
        client.delete(1, b"A")
        end = journal.stat().st_size
        client.store(1, b"C", [b"c" * 20000])
    node.kill()  # kill -9: no clean shutdown
    whole = journal.read_bytes()
    for name, damaged in (("flipped", whole[:start + 20] + bytes([whole[start + 20] ^ 4]) + whole[start + 21:]),
                          ("torn", whole[:end - 3])):
        journal.write_bytes(damaged)
        node = start_service(f"storage-{name}", "serve", "storage", "--config", config)
        with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
            assert not client.exist(1, b"A"), f"{name}: the deleted value came back"
            assert bytes(client.retrieve(1, b"B").payload()) == b"b" * 5000
            if name == "flipped":
                assert bytes(client.retrieve(1, b"C").payload()) == b"c" * 20000
        node.kill()
