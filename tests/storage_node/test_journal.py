"""The journal: records replay in order; a torn or corrupt tail is discarded and cut."""
import os

from storage_node import journal as jr
from tests.storage_node import journal_fixtures as old_journal
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


def lost(key: bytes) -> jr.Record:
    return jr.Record(jr.LOST, key)


def test_a_torn_tail_is_replaced_by_a_lost_record_of_its_key(tmp_path):
    path = tmp_path / "j"
    j = jr.Journal(path)
    j.open()
    j.append([put(b"a", 1), put(b"b", 2)])
    j.close()
    whole = path.read_bytes()
    for cut in (1, 5, 20):
        path.write_bytes(whole[:-cut])
        j = jr.Journal(path)
        assert j.open() == [put(b"a", 1), lost(b"b")]  # b's older value, had it one, is doubtful
        assert path.stat().st_size == len(jr.encode(put(b"a", 1))) + len(jr.encode(lost(b"b"), 1))
        j.append([put(b"c", 3)])          # the journal goes on after the tail
        j.close()
        assert jr.Journal(path).open() == [put(b"a", 1), lost(b"b"), put(b"c", 3)]  # the mark stays


def test_a_corrupt_last_record_or_a_garbage_tail_is_replaced_by_lost_records(tmp_path):
    path = tmp_path / "j"
    good = jr.encode(put(b"a", 1))
    flipped = bytearray(jr.encode(put(b"b", 2), 1))
    flipped[-1] ^= 0x40
    path.write_bytes(good + bytes(flipped))
    assert jr.Journal(path).open() == [put(b"a", 1), lost(b"b")]
    path.write_bytes(good + os.urandom(3) + b"\xff" * 40)  # no key to read: any key is doubtful
    assert jr.Journal(path).open() == [put(b"a", 1), lost(b"")]
    path.write_bytes(good + bytes(300))  # zeros, as a file system leaves after a crash: no record
    assert jr.Journal(path).open() == [put(b"a", 1)]
    assert path.read_bytes() == good


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


def test_damage_in_the_middle_keeps_every_later_record_and_a_torn_tail_is_still_cut(tmp_path):
    path = tmp_path / "j"
    records = [put(b"k%d" % i, i) for i in range(6)]
    j = jr.Journal(path)
    j.open()
    j.append(records)
    j.close()
    whole = path.read_bytes()
    size = len(jr.encode(records[0]))
    damaged = bytearray(whole)
    damaged[size + 30] ^= 0x01   # record 1
    damaged[3 * size + 5] ^= 0x80  # record 3's length
    path.write_bytes(bytes(damaged[:-7]))  # and record 5 torn
    j = jr.Journal(path)
    assert j.open() == [records[0], lost(b"k1"), records[2], lost(b"k3"), records[4], lost(b"k5")]
    assert [(d.offset, d.nbytes, d.records) for d in j.damage] == [(size, size, 1), (3 * size, size, 1)]
    assert j.skipped_records == 2 and j.torn_bytes == size - 7
    # the tail replaced; the middle left for the owner to rewrite
    assert path.stat().st_size == 5 * size + len(jr.encode(lost(b"k5"), 5))
    j.append([put(b"z", 9)])
    j.close()
    assert jr.Journal(path).open()[-3:] == [records[4], lost(b"k5"), put(b"z", 9)]


def test_a_damaged_span_of_several_records_names_each_of_their_keys_or_any_key(tmp_path):
    path = tmp_path / "j"
    records = [put(b"k%d" % i, i) for i in range(5)]
    data = bytearray(b"".join(jr.encode(r, i) for i, r in enumerate(records)))
    size = len(jr.encode(records[0]))
    data[size + 3] ^= 1      # record 1's magic: its first tag is found by search
    data[2 * size + 14] ^= 1  # record 2's first tag: its last one holds
    path.write_bytes(bytes(data))
    assert jr.Journal(path).open() == [records[0], lost(b"k1"), lost(b"k2"), *records[3:]]
    data[2 * size - 3] ^= 1  # record 1's last tag too: record 1's key is still in its first
    data[3 * size - 3] ^= 1  # record 2's last tag too: no copy of its key is left
    path.write_bytes(bytes(data))
    assert jr.Journal(path).open() == [records[0], lost(b""), *records[3:]]


def test_a_tear_at_a_sector_boundary_never_hides_a_key(tmp_path):
    """A crash tears a file at a sector (or page) boundary: no record's key is cut there."""
    path = tmp_path / "j"
    records = [put(b"k" * (1 + i % 16), i) if i % 3 else jr.Record(jr.DELETE, b"d" * (1 + i % 16))
               for i in range(300)]
    j = jr.Journal(path)
    j.open()
    j.append(records[:7])
    j.append(records[7:])
    j.close()
    whole = path.read_bytes()
    assert jr.Journal(path).open() == records
    for cut in range(jr.SECTOR, len(whole), jr.SECTOR):
        path.write_bytes(whole[:cut])
        found = jr.Journal(path).open()
        kept = [r for r in found if r.kind != jr.LOST]
        assert kept == records[:len(kept)]
        assert found[len(kept):] in ([], [lost(records[len(kept)].key)]), f"cut at {cut}"


def test_a_tail_of_several_damaged_records_names_each_key_or_any_key(tmp_path):
    path = tmp_path / "j"
    records = [put(b"a", 1), put(b"x", 2), jr.Record(jr.DELETE, b"y")]
    x, y = jr.encode(records[1], 1), jr.encode(records[2], 2)
    head = jr.encode(records[0], 0)

    def tail(x_at: int, y_cut: int) -> list[jr.Record]:
        damaged = bytearray(x)
        damaged[x_at] ^= 0x20
        path.write_bytes(head + bytes(damaged) + y[:len(y) - y_cut])
        return jr.Journal(path).open()

    assert tail(5, 3) == [records[0], lost(b"x"), lost(b"y")]           # x's length, y torn
    assert tail(len(x) - 2, 3) == [records[0], lost(b"x"), lost(b"y")]  # x's last tag, y torn
    assert tail(14, 3) == [records[0], lost(b"x"), lost(b"y")]          # x's first tag, y torn
    assert tail(14, len(y) - 20) == [records[0], lost(b"")]             # y cut before its key


def test_a_version_2_record_is_still_read(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(old_journal.encode_v2(put(b"a", 1), 0) + old_journal.encode_v2(jr.Record(jr.DELETE, b"a"), 1))
    j = jr.Journal(path)
    assert j.open() == [put(b"a", 1), jr.Record(jr.DELETE, b"a")] and j.legacy_records == 2
    j.append([put(b"b", 2)])
    j.close()
    data = bytearray(path.read_bytes())
    data[len(old_journal.encode_v2(put(b"a", 1), 0)) + 14] ^= 1  # the version-2 Delete: no tag to name its key
    path.write_bytes(bytes(data))
    assert jr.Journal(path).open() == [put(b"a", 1), lost(b""), put(b"b", 2)]


def test_garbage_inserted_between_records_loses_nothing_and_is_reported(tmp_path):
    path = tmp_path / "j"
    a, b = jr.encode(put(b"a", 1), 0), jr.encode(put(b"b", 2), 1)
    path.write_bytes(a + b"\x00" * 100 + bytes(range(40)) + b)
    j = jr.Journal(path)
    assert j.open() == [put(b"a", 1), put(b"b", 2)]
    assert [(d.offset, d.nbytes, d.records) for d in j.damage] == [(len(a), 140, 0)]


def test_a_version_1_journal_is_read_and_appended_to(tmp_path):
    path = tmp_path / "j"
    old = [put(b"a", 1), jr.Record(jr.DELETE, b"a"), put(b"b", 2)]
    path.write_bytes(b"".join(old_journal.encode_v1(r) for r in old))
    j = jr.Journal(path)
    assert j.open() == old and j.legacy_records == 3 and not j.damage
    j.append([put(b"c", 3)])
    j.close()
    assert jr.Journal(path).open() == old + [put(b"c", 3)]
    damaged = bytearray(path.read_bytes())
    damaged[len(old_journal.encode_v1(old[0])) + 2] ^= 4  # the version-1 Delete
    path.write_bytes(bytes(damaged))
    j = jr.Journal(path)
    assert j.open() == [old[0], lost(b""), old[2], put(b"c", 3)] and j.skipped_records == 1


def layout(records: list[jr.Record]) -> tuple[bytearray, list[int]]:
    """A version-2 journal of records, and the record each byte belongs to."""
    data, owner = bytearray(), []
    for i, record in enumerate(records):
        encoded = jr.encode(record, i)
        data += encoded
        owner += [i] * len(encoded)
    return data, owner


def random_damage(rng, data: bytearray, owner: list[int], hurt: set[int]) -> None:
    """One flip, cut of the tail, cut of a span or insertion of garbage; hurt gets the records it touched."""
    kind, at = rng.randrange(4), rng.randrange(len(data))
    if kind == 0:
        data[at] ^= 1 << rng.randrange(8)
        hurt.add(owner[at])
    elif kind == 1:
        hurt.update(owner[at:])
        del data[at:], owner[at:]
    elif kind == 2:
        end = at + rng.randrange(1, 200)
        hurt.update(owner[at:end])
        del data[at:end], owner[at:end]
    else:
        if 0 < at and owner[at - 1] == owner[at]:
            hurt.add(owner[at])  # inside a record
        garbage = rng.randbytes(rng.randrange(1, 200))
        data[at:at] = garbage
        owner[at:at] = [-1] * len(garbage)


def test_random_damage_recovers_every_intact_record_and_counts_the_damaged_ones():
    """Seeded: 400 journals, each hit 1 to 5 times by flips, cuts and garbage, then scanned."""
    import random
    rng = random.Random(5)
    for trial in range(400):
        records = [put(b"k%d" % rng.randrange(50), rng.randrange(1, 1000)) if rng.random() < 0.8
                   else jr.Record(jr.DELETE, b"k%d" % rng.randrange(50)) for _ in range(rng.randrange(1, 60))]
        data, owner = layout(records)
        hurt: set[int] = set()
        for _ in range(rng.randrange(1, 6)):
            if data:
                random_damage(rng, data, owner, hurt)
        found = jr.scan(bytes(data))  # never raises
        kept = match(found.records, records, hurt, bytes(data))
        assert kept is not None, f"trial {trial}: a record came back that was not written whole"
        intact = {i for i in range(len(records)) if i not in hurt and i in owner}
        assert intact <= set(kept), f"trial {trial}: intact records {sorted(intact - set(kept))} lost"
        skipped = sum(1 for i in range(kept[-1]) if i not in kept) if kept else 0
        assert sum(d.records for d in found.damage) == skipped, f"trial {trial}"
        assert found.end <= len(data)


def match(found: list[jr.Record], records: list[jr.Record], hurt: set[int], data: bytes) -> list[int] | None:
    """The index of each found record in records, in order; a hurt one counts only if its bytes
    are all there (a cut can rejoin a record's head to an identical tail). None if one matches none."""
    kept, i = [], 0
    for record in found:
        while i < len(records) and not (records[i] == record and (
                i not in hurt or jr.encode(records[i], i) in data)):
            i += 1
        if i == len(records):
            return None
        kept.append(i)
        i += 1
    return kept


def test_journal_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "j"
        j = jr.Journal(path)
        j.open()
        j.append([put(b"a", 1), put(b"b", 2)])
        assert path.stat().st_mode & 0o777 == 0o600
        j.rewrite([put(b"b", 2)])  # a new file replaces it
        j.append([put(b"c", 3), put(b"d", 4)])
        j.close()
        data = bytearray(path.read_bytes())
        data[len(jr.encode(put(b"b", 2))) + 20] ^= 1
        path.write_bytes(bytes(data))
        assert jr.Journal(path).open()[1] == lost(b"c")  # damage in the middle: a copy is kept beside it
        assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {"j": 0o600, "j.damaged": 0o600}
    finally:
        os.umask(old)
