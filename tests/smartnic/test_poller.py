"""The compiled poller's descriptor check (smartnic/_poller.c): the same verdict as the Python checks of
Agent.block_put (hostmem.descriptor.decode, the trigger's generation, a shared block full, the block's
name), on descriptors the real Writer wrote, valid and forged; its BLAKE2b and CRC32C against the
libraries; and a checking poller's fires."""
import hashlib
import random
import struct
import uuid

import google_crc32c
import numpy as np
import pytest

from hostmem import descriptor
from hostmem.block_hash import block_hash, salt_for
from hostmem.descriptor import CRC_OFFSET, STAMP_OFFSET, DescriptorError, Writer
from hostmem.kv_layout import DESCRIPTOR_BYTES, KvLayout
from hostmem.region import Region
from kvtb import crc32c as kvtb_crc
from smartnic import standing
from smartnic.standing import StandingPuts

P = standing._poller
pytestmark = pytest.mark.skipif(P is None, reason="the compiled poller was not built")

L = KvLayout(num_blocks=6, num_layers=1, num_kv_heads=1, block_tokens=32, head_dim=2)
OWNER_AT = 58  # tenant_len, user_len, context_len (u16 each), then the ids
IDS_AT = OWNER_AT + 6

# Python's refusals (their messages) -> the C verdict for the same reason
REASONS = [("not a descriptor", "BAD_MAGIC"), ("field lengths", "BAD_LENGTHS"),
           ("crc32c mismatch", "BAD_CRC"), ("token count", "BAD_TOKEN_COUNT"),
           ("chunk index", "BAD_CHUNK_INDEX"), ("generation 0", "GENERATION_ZERO"),
           ("only block 0", "BAD_PARENT"), ("not utf-8", "BAD_UTF8"),
           ("descriptor generation", "STALE_GENERATION"), ("only a full block", "SHARED_PARTIAL"),
           ("name is not", "BAD_HASH")]


def python_verdict(region: np.ndarray, layout: KvLayout, block: int, generation: int) -> int:
    """Agent.block_put's checks, in Python, as a verdict code."""
    buf = memoryview(region)
    try:
        offset, length = layout.descriptor_range(block)
        d = descriptor.decode(buf[offset:offset + length], layout.block_tokens)
        if d.generation != generation:
            raise DescriptorError(f"descriptor generation {d.generation}, trigger {generation}")
        offset, length = layout.token_ids_range(block, d.token_count)
        ids = buf[offset:offset + length]
        if d.shared and d.token_count != layout.block_tokens:
            raise DescriptorError("only a full block can be shared")
        if block_hash(d.parent, ids, salt_for(d.tenant, d.user, d.shared)) != d.hash:
            raise DescriptorError("the descriptor's name is not the block's tokens under its owner")
    except DescriptorError as exc:
        codes = [getattr(P, name) for text, name in REASONS if text in str(exc)]
        assert len(codes) == 1, f"an unmapped refusal: {exc}"
        return codes[0]
    return P.ACCEPTED


def c_verdict(region: np.ndarray, layout: KvLayout, block: int, generation: int) -> int:
    return P.check_descriptor(region, layout.descriptor_range(block)[0], layout.token_ids_range(block)[0],
                              layout.block_tokens, generation)


def verdicts(region, layout, block, generation) -> tuple[int, int]:
    """(C's verdict, Python's): the tests want them equal."""
    return c_verdict(region, layout, block, generation), python_verdict(region, layout, block, generation)


NAMES = ["", "a", "acme", "tenant-7", "é", "用户", "ü" * 20, "🙂x", "x" * 60]


def random_name(rng: random.Random, limit: int) -> str:
    name = rng.choice(NAMES + ["".join(rng.choice("ab€😀z ") for _ in range(rng.randrange(40)))])
    while len(name.encode()) > limit:
        name = name[:-1]
    return name


def write_random(rng: random.Random, region: np.ndarray, layout: KvLayout, block: int, **forced) -> dict:
    """A valid descriptor and token ids for `block`, written as the compute node does; its fields."""
    bt = layout.block_tokens
    f = dict(generation=rng.randrange(1, 1 << 64), chunk_index=rng.choice([0, 1, 2, rng.randrange(1 << 20)]),
             token_count=rng.choice([bt, bt, rng.randrange(1, bt + 1)]), tenant=random_name(rng, 64),
             user=random_name(rng, 128), context=random_name(rng, 240))
    f["shared"] = f["token_count"] == bt and rng.random() < 0.3
    f.update(forced)
    parent = rng.randbytes(16) if f["chunk_index"] else b""
    ids = np.array([rng.randrange(1 << 32) for _ in range(bt)], dtype="<u4")
    offset, _ = layout.token_ids_range(block)
    region[offset:offset + bt * 4] = ids.view(np.uint8)
    name = block_hash(parent, ids[:f["token_count"]].tobytes(), salt_for(f["tenant"], f["user"], f["shared"]))
    Writer(memoryview(region)).write(layout.descriptor_range(block)[0], f["generation"], f["chunk_index"],
                                     f["token_count"], name, parent, f["tenant"], f["user"], f["context"],
                                     f["shared"])
    Writer(memoryview(region)).stamp(layout.descriptor_range(block)[0])
    return f


def reseal(region: np.ndarray, layout: KvLayout, block: int) -> None:
    """The record's crc32c recomputed over what its (possibly forged) lengths cover, as a writer would."""
    offset, _ = layout.descriptor_range(block)
    rec = region[offset:offset + DESCRIPTOR_BYTES]
    tlen, ulen, clen = struct.unpack_from("<HHH", rec, OWNER_AT)
    end = min(IDS_AT + tlen + ulen + clen, STAMP_OFFSET)
    struct.pack_into("<I", rec, CRC_OFFSET, google_crc32c.value(rec[:end].tobytes()))


def poke(region, layout, block, fmt: str, at: int, *values, seal: bool = True) -> None:
    offset, _ = layout.descriptor_range(block)
    struct.pack_into(fmt, region, offset + at, *values)
    if seal:
        reseal(region, layout, block)


@pytest.fixture
def region():
    return np.zeros(L.region_bytes, dtype=np.uint8)


# -- the primitives

@pytest.mark.parametrize("size", [0, 1, 3, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4096, 10007])
def test_blake2b_is_hashlibs(size):
    rng = random.Random(size)
    for _ in range(5):
        data = rng.randbytes(size)
        assert P.blake2b(data) == hashlib.blake2b(data, digest_size=16).digest()
        assert P.blake2b(data, 64) == hashlib.blake2b(data).digest()
        assert P.blake2b(memoryview(data)[1:]) == hashlib.blake2b(data[1:], digest_size=16).digest()


def test_blake2b_of_many_random_lengths():
    rng = random.Random(7)
    for _ in range(300):
        data = rng.randbytes(rng.randrange(2000))
        size = rng.randrange(1, 65)
        assert P.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest()
    with pytest.raises(ValueError):
        P.blake2b(b"x", 65)


@pytest.mark.parametrize("software", [False, True])
def test_crc32c_is_google_crc32c_and_kvtbs(software):
    rng = random.Random(3)
    for size in [*range(0, 70), 127, 128, 129, 508, 1000, 4096, rng.randrange(20000)]:
        data = rng.randbytes(size + 8)
        for skew in (0, 1, 3, 7):  # unaligned starts
            view = memoryview(data)[skew:skew + size]
            want = google_crc32c.value(view.tobytes())
            assert P.crc32c(view, software=software) == want == kvtb_crc.crc32c(np.frombuffer(view, np.uint8))
        head, tail = data[:size // 2], data[size // 2:]
        head_crc = P.crc32c(head, software=software)
        assert P.crc32c(tail, head_crc, software=software) == google_crc32c.value(data)
    assert P.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


# -- the check against Python's

def test_valid_descriptors_pass_in_c_as_in_python(region):
    rng = random.Random(11)
    for i in range(400):
        block = i % L.num_blocks
        f = write_random(rng, region, L, block)
        assert verdicts(region, L, block, f["generation"]) == (P.ACCEPTED, P.ACCEPTED), f


def test_a_wrong_name_is_refused(region):
    rng = random.Random(1)
    f = write_random(rng, region, L, 2, token_count=L.block_tokens)
    offset, _ = L.token_ids_range(2)
    region[offset + 5] ^= 1  # a token id changed after its descriptor was written
    assert verdicts(region, L, 2, f["generation"]) == (P.BAD_HASH, P.BAD_HASH)
    region[offset + 5] ^= 1
    assert verdicts(region, L, 2, f["generation"]) == (P.ACCEPTED, P.ACCEPTED)
    poke(region, L, 2, "<B", 26, region[L.descriptor_range(2)[0] + 26] ^ 0x80)  # the name itself, resealed
    assert verdicts(region, L, 2, f["generation"]) == (P.BAD_HASH, P.BAD_HASH)


def test_ids_past_the_token_count_are_not_part_of_the_name(region):
    rng = random.Random(2)
    f = write_random(rng, region, L, 1, token_count=5, shared=False)
    offset, _ = L.token_ids_range(1)
    region[offset + 5 * 4] ^= 0xFF  # token 5: not the block's
    assert verdicts(region, L, 1, f["generation"]) == (P.ACCEPTED, P.ACCEPTED)
    region[offset + 4 * 4] ^= 0xFF  # token 4 is
    assert verdicts(region, L, 1, f["generation"]) == (P.BAD_HASH, P.BAD_HASH)


def test_every_flipped_byte_of_the_record(region):
    rng = random.Random(5)
    f = write_random(rng, region, L, 3, tenant="acme", user="ü-user", context="ctx")
    offset, _ = L.descriptor_range(3)
    end = IDS_AT + len(b"acme") + len("ü-user".encode()) + len(b"ctx")
    for at in range(DESCRIPTOR_BYTES):
        bit = 1 << rng.randrange(8)
        region[offset + at] ^= bit
        c, py = verdicts(region, L, 3, f["generation"])
        region[offset + at] ^= bit
        assert c == py, (at, c, py)
        covered = at < end or at >= CRC_OFFSET  # the unused bytes and the stamp are not
        assert (c != P.ACCEPTED) == covered, (at, c)
    assert verdicts(region, L, 3, f["generation"]) == (P.ACCEPTED, P.ACCEPTED)


@pytest.mark.parametrize("forgery, fmt, at, value, expected", [
    ("magic", "<4s", 0, b"KVBX", "BAD_MAGIC"),
    ("version 1", "<H", 4, 1, "BAD_MAGIC"),
    ("version 3", "<H", 4, 3, "BAD_MAGIC"),
    ("tenant too long", "<H", OWNER_AT, 65, "BAD_LENGTHS"),
    ("user too long", "<H", OWNER_AT + 2, 129, "BAD_LENGTHS"),
    ("context too long", "<H", OWNER_AT + 4, 241, "BAD_LENGTHS"),
    ("lengths far too long", "<H", OWNER_AT + 4, 0xFFFF, "BAD_LENGTHS"),
    ("parent of 8 bytes", "<H", 24, 8, "BAD_LENGTHS"),
    ("no tokens", "<I", 20, 0, "BAD_TOKEN_COUNT"),
    ("a token too many", "<I", 20, L.block_tokens + 1, "BAD_TOKEN_COUNT"),
    ("huge token count", "<I", 20, 0xFFFFFFFF, "BAD_TOKEN_COUNT"),
    ("chunk past u32", "<I", 16, 0xFFFFFFFF, "BAD_CHUNK_INDEX"),
    ("generation 0", "<Q", 8, 0, "GENERATION_ZERO"),
    ("block 0 with a parent", "<I", 16, 0, "BAD_PARENT"),
    ("a later block without one", "<H", 24, 0, "BAD_PARENT"),
    ("unused flags", "<H", 6, 0xFFFE, "ACCEPTED"),
])
def test_forged_fields_resealed_are_refused_as_python_refuses_them(region, forgery, fmt, at, value, expected):
    rng = random.Random(forgery)
    f = write_random(rng, region, L, 4, chunk_index=3, token_count=L.block_tokens, shared=False)
    generation = f["generation"] if at != 8 else 0
    poke(region, L, 4, fmt, at, value)
    assert verdicts(region, L, 4, generation) == (getattr(P, expected),) * 2


def test_a_forged_record_without_a_new_crc_is_torn(region):
    rng = random.Random(9)
    f = write_random(rng, region, L, 0)
    poke(region, L, 0, "<I", 20, 1, seal=False)
    assert verdicts(region, L, 0, f["generation"]) == (P.BAD_CRC, P.BAD_CRC)


def test_a_stale_generation_is_refused(region):
    rng = random.Random(4)
    f = write_random(rng, region, L, 5, generation=41)
    assert verdicts(region, L, 5, 42) == (P.STALE_GENERATION,) * 2
    assert verdicts(region, L, 5, 40) == (P.STALE_GENERATION,) * 2
    assert verdicts(region, L, 5, 41) == (P.ACCEPTED,) * 2 and f["generation"] == 41


def test_only_a_full_block_can_be_shared(region):
    rng = random.Random(6)
    f = write_random(rng, region, L, 1, token_count=L.block_tokens - 1, shared=True)
    assert verdicts(region, L, 1, f["generation"]) == (P.SHARED_PARTIAL,) * 2
    f = write_random(rng, region, L, 1, token_count=L.block_tokens, shared=True)
    assert verdicts(region, L, 1, f["generation"]) == (P.ACCEPTED,) * 2
    poke(region, L, 1, "<H", 6, 0)  # named under the tenant's salt, but no longer marked shared
    assert verdicts(region, L, 1, f["generation"]) == (P.BAD_HASH,) * 2


@pytest.mark.parametrize("ids", [
    b"\xff", b"\x80", b"a\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x99",
    b"\xe2\x28\xa1", b"ok\xc3",
])
def test_ids_that_are_not_utf8_are_refused_even_resealed(region, ids):
    rng = random.Random(8)
    for field in range(3):
        f = write_random(rng, region, L, 2, tenant="t", user="u", context="c")
        lengths = [1, 1, 1]
        lengths[field] = len(ids)
        offset, _ = L.descriptor_range(2)
        names = [b"t", b"u", b"c"]
        names[field] = ids
        region[offset + IDS_AT:offset + IDS_AT + sum(lengths)] = np.frombuffer(b"".join(names), np.uint8)
        poke(region, L, 2, "<HHH", OWNER_AT, *lengths)
        assert verdicts(region, L, 2, f["generation"]) == (P.BAD_UTF8,) * 2, (field, ids)


def test_a_character_split_between_two_ids_is_not_utf8(region):
    rng = random.Random(10)
    f = write_random(rng, region, L, 2, tenant="é", user="x", context="")
    offset, _ = L.descriptor_range(2)
    poke(region, L, 2, "<HH", OWNER_AT, 1, 2)  # "é" is c3 a9: tenant b"\xc3", user b"\xa9x"
    assert verdicts(region, L, 2, f["generation"]) == (P.BAD_UTF8,) * 2
    poke(region, L, 2, "<HH", OWNER_AT, 2, 1)
    assert verdicts(region, L, 2, f["generation"]) == (P.ACCEPTED,) * 2


def test_random_utf8_in_the_ids_is_judged_as_python_judges_it(region):
    rng = random.Random(12)
    alphabet = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
                0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFE, 0xFF]
    seen = set()
    f = write_random(rng, region, L, 0, tenant="", user="", context="")
    offset, _ = L.descriptor_range(0)
    for _ in range(3000):
        lengths = [rng.randrange(5) for _ in range(3)]
        raw = bytes(rng.choice(alphabet) for _ in range(sum(lengths)))
        region[offset + IDS_AT:offset + IDS_AT + len(raw)] = np.frombuffer(raw, np.uint8)
        poke(region, L, 0, "<HHH", OWNER_AT, *lengths)
        c, py = verdicts(region, L, 0, f["generation"])
        assert c == py, (raw, lengths, c, py)
        seen.add(c)
    assert seen == {P.ACCEPTED, P.BAD_UTF8, P.BAD_HASH}  # a new tenant or user is a new salt: another name


def test_random_forgeries_are_judged_as_python_judges_them(region):
    rng = random.Random(13)
    seen = set()
    for i in range(3000):
        block = i % L.num_blocks
        f = write_random(rng, region, L, block)
        offset, _ = L.descriptor_range(block)
        for _ in range(rng.randrange(1, 4)):
            at = rng.choice([rng.randrange(DESCRIPTOR_BYTES), rng.randrange(IDS_AT)])
            region[offset + at] = rng.choice([0, 1, 0xFF, rng.randrange(256), region[offset + at] ^ 1])
        if rng.random() < 0.7:
            reseal(region, L, block)
        if rng.random() < 0.2:
            ids_at, _ = L.token_ids_range(block)
            region[ids_at + rng.randrange(L.block_tokens * 4)] ^= 1
        generation = f["generation"] if rng.random() < 0.9 else rng.randrange(1 << 64)
        c, py = verdicts(region, L, block, generation)
        assert c == py, (i, c, py)
        seen.add(c)
    assert seen >= {P.ACCEPTED, P.BAD_MAGIC, P.BAD_LENGTHS, P.BAD_CRC, P.BAD_TOKEN_COUNT, P.BAD_PARENT,
                    P.STALE_GENERATION, P.BAD_HASH}


def test_a_check_outside_the_region_raises(region):
    d, i = L.descriptor_range(L.num_blocks - 1)[0], L.token_ids_range(L.num_blocks - 1)[0]
    assert P.check_descriptor(region, d, i, L.block_tokens, 1) == P.BAD_MAGIC  # zeros: not a descriptor
    for args in [(region.nbytes - DESCRIPTOR_BYTES + 1, i, L.block_tokens), (-1, i, L.block_tokens),
                 (d, region.nbytes - L.block_tokens * 4 + 1, L.block_tokens), (d, -4, L.block_tokens),
                 (d, i, 0), (d, i, 1 << 40)]:
        with pytest.raises(ValueError):
            P.check_descriptor(region, *args, 1)
    with pytest.raises(ValueError):
        P.check_descriptor(region[:100], 0, 0, 1, 1)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        P.check_descriptor(region[::2], 0, 0, 1, 1)


def test_verdicts_name_every_code():
    assert len(P.VERDICTS) == P.BAD_HASH + 1 and P.VERDICTS[P.ACCEPTED] == "accepted"
    assert standing.VERDICTS == P.VERDICTS and standing.ACCEPTED == P.ACCEPTED == 0
    assert len({getattr(P, name) for _, name in REASONS}) == len(REASONS)


# -- a checking poller

def counters_of(region: np.ndarray, layout: KvLayout) -> np.ndarray:
    return region[layout.counter_offset:layout.counter_offset + layout.counter_count * 16].view(
        np.uint64).reshape(layout.counter_count, 2)


def test_a_checking_poller_returns_the_verdict_of_each_fire(region):
    rng = random.Random(14)
    counters = counters_of(region, L)
    puts = StandingPuts(L, counters, region)
    assert puts.start_compiled(check=True) and puts.checking
    try:
        good = write_random(rng, region, L, 1)
        bad = write_random(rng, region, L, 4)
        ids_at, _ = L.token_ids_range(4)
        region[ids_at] ^= 1
        write_random(rng, region, L, 5, generation=7)
        counters[L.put_trigger(1), 0] = good["generation"]
        counters[L.put_trigger(4), 0] = bad["generation"]
        counters[L.put_trigger(5), 0] = 8
        fired = puts.fired()
        assert [f[:2] + f[3:4] for f in fired] == [(1, good["generation"], P.ACCEPTED),
                                                   (4, bad["generation"], P.BAD_HASH),
                                                   (5, 8, P.STALE_GENERATION)]
        for block, generation, seen_ns, verdict, checked_ns in fired:
            assert 0 < seen_ns <= checked_ns
            assert verdict == python_verdict(region, L, block, generation)
        assert puts.fired() == []
        counters[L.put_trigger(0), 0] = 3  # nothing written there: not a descriptor
        assert [f[3] for f in puts.wait(0.001, 1.0)] == [P.BAD_MAGIC]
        puts.poller.check_descriptors(None)  # off: the old shape again
        counters[L.put_trigger(0), 0] = 4
        assert [len(f) for f in puts.fired()] == [3]
    finally:
        puts.close()


def test_a_real_region_registered_as_the_agent_maps_it():
    L2 = KvLayout(num_blocks=4, num_layers=2, num_kv_heads=2, block_tokens=16, head_dim=4)
    name = f"kvtb-test-{uuid.uuid4().hex[:12]}"
    owner = Region.create(name, L2.region_bytes, L2.counter_offset, L2.counter_count)
    agent_side = Region.attach(name, L2.region_bytes, L2.counter_offset, L2.counter_count)
    puts = StandingPuts(L2, agent_side.counters, agent_side.array)
    try:
        assert puts.start_compiled(check=True)
        rng = random.Random(15)
        f = write_random(rng, owner.array, L2, 2)  # the compute node's mapping
        owner.store_counter(L2.put_trigger(2), f["generation"])
        (block, generation, _, verdict, _), = puts.wait(0.001, 1.0)
        assert (block, generation, verdict) == (2, f["generation"], P.ACCEPTED)
        g = write_random(rng, owner.array, L2, 3, token_count=L2.block_tokens - 2, shared=True)
        owner.store_counter(L2.put_trigger(3), g["generation"])
        assert [f[3] for f in puts.wait(0.001, 1.0)] == [P.SHARED_PARTIAL]
    finally:
        puts.close()
        agent_side.close()
        owner.close()


def test_checking_needs_the_region_the_counters_are_in(region):
    counters = counters_of(region, L)
    puts = StandingPuts(L, counters)
    with pytest.raises(ValueError, match="region_array"):
        puts.start_compiled(check=True)
    assert puts.poller is None
    other = np.zeros_like(region)
    puts = StandingPuts(L, counters, other)  # another region's bytes
    with pytest.raises(ValueError, match="not the region"):
        puts.start_compiled(check=True)
    puts = StandingPuts(L, counters, region[:L.counter_offset])  # too short
    with pytest.raises(ValueError, match="not the region"):
        puts.start_compiled(check=True)
    puts = StandingPuts(L, counters, region)
    assert puts.start_compiled() and not puts.checking  # off by default: the 3-tuples the agent reads
    counters[L.put_trigger(0), 0] = 1
    assert [len(f) for f in puts.fired()] == [3]
    assert puts.start_compiled(check=True) and puts.checking  # turned on later
    counters[L.put_trigger(0), 0] = 2
    assert [f[3] for f in puts.fired()] == [P.BAD_MAGIC]
    puts.close()


def test_a_poller_refuses_a_layout_outside_the_region(region):
    counters = counters_of(region, L)
    poller = P.Poller(counters, 0, 16 * L.counters_per_block, L.num_blocks)
    d0, i0 = L.descriptor_offset, L.token_ids_offset
    bad = [(region, region.nbytes - DESCRIPTOR_BYTES, DESCRIPTOR_BYTES, i0, L.block_tokens * 4,
            L.block_tokens),
           (region, d0, 1 << 60, i0, L.block_tokens * 4, L.block_tokens),
           (region, d0, DESCRIPTOR_BYTES, i0, 1 << 61, L.block_tokens),
           (region, d0, DESCRIPTOR_BYTES, region.nbytes, 4, 1),
           (region, d0, DESCRIPTOR_BYTES, i0, L.block_tokens * 4, 0),
           (region, -512, DESCRIPTOR_BYTES, i0, L.block_tokens * 4, L.block_tokens),
           (region, d0, 0, i0, L.block_tokens * 4, L.block_tokens),
           (region[:d0 + 2 * DESCRIPTOR_BYTES], d0, DESCRIPTOR_BYTES, i0, L.block_tokens * 4, L.block_tokens)]
    for args in bad:
        with pytest.raises(ValueError, match="pass the region|block_tokens"):
            poller.check_descriptors(*args)
        assert not poller.checking
    poller.check_descriptors(region, d0, DESCRIPTOR_BYTES, i0, L.block_tokens * 4, L.block_tokens)
    assert poller.checking
    poller.close()
    assert not poller.checking


def test_a_poller_refuses_triggers_or_a_bell_past_its_buffer_even_where_the_arithmetic_wraps(region):
    counters = counters_of(region, L)
    size = counters.nbytes
    for args in ((0, 1 << 62, 5), (16, 16, size // 16), (1 << 62, 16, 1)):  # 4 * 2**62 wraps to 0 in 64 bits
        with pytest.raises(ValueError, match="pass the"):
            P.Poller(counters, *args)
    for bell in (size - 2 if size % 4 == 0 else size, (1 << 63) - 4):  # bell + 4 overflowed before
        with pytest.raises(ValueError, match="pass the|multiple of 4"):
            P.Poller(counters, 0, 16, 1, bell)
    P.Poller(counters, 0, 16, size // 16).close()  # the whole buffer, exactly
