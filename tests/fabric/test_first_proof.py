"""A host's first-message proof (pure, fixed clocks): made with the host's secret, taken by a node that
derives that secret, bound to its subsystem or to none; forged, altered, stale, unknown and replayed
proofs are refused, and the replay cache stays bounded without letting a pushed-out nonce back in."""
from __future__ import annotations

import pytest

from fabric import first_proof as fp
from kvtb.credentials import host_key

MASTER = b"m" * 32
AGENT = "nqn.2026-11.org.kvtestbed:smartnic-0"
SUBSYSTEM = "nqn.2026-11.org.kvtestbed:storage-0"
NOW = 1_800_000_000.0


def verifier(now: float = NOW, allowed=(AGENT,), **kwargs) -> fp.Verifier:
    clock = kwargs.pop("clock", lambda: now)
    return fp.Verifier(SUBSYSTEM, lambda nqn: host_key(MASTER, nqn) if nqn in allowed else None,
                       clock=clock, **kwargs)


def proof(nqn: str = AGENT, subsystem: str = SUBSYSTEM, at: float = NOW, key: bytes | None = None,
          nonce: bytes | None = None) -> bytes:
    return fp.make(host_key(MASTER, nqn) if key is None else key, nqn, subsystem, at, nonce)


def test_a_hosts_proof_is_taken_once():
    v = verifier()
    p = proof()
    assert len(p) == fp.PROOF_BYTES
    assert v.check(p, AGENT) == fp.OK
    assert v.check(p, AGENT) == fp.REPLAYED
    assert v.check(proof(), AGENT) == fp.OK  # a new nonce is a new proof


def test_an_unbound_proof_is_taken_by_any_node_a_bound_one_by_its_own_only():
    assert verifier().check(proof(subsystem=""), AGENT) == fp.OK
    other = fp.Verifier("nqn.2026-11.org.kvtestbed:storage-1", lambda nqn: host_key(MASTER, nqn),
                        clock=lambda: NOW)
    assert other.check(proof(), AGENT) == fp.FORGED


@pytest.mark.parametrize("what", ["wrong key", "another host's key", "flipped tag", "flipped time",
                                  "flipped nonce", "bound flag cleared"])
def test_a_forged_or_altered_proof_is_refused(what):
    good = bytearray(proof())
    if what == "wrong key":
        bad = proof(key=b"k" * 32)
    elif what == "another host's key":
        bad = proof(key=host_key(MASTER, "nqn.2026-11.org.kvtestbed:compute-0"))
    else:
        at = {"flipped tag": -1, "flipped time": 3, "flipped nonce": 12, "bound flag cleared": 1}[what]
        good[at] ^= 1
        bad = bytes(good)
    assert verifier().check(bad, AGENT) == fp.FORGED


def test_a_proof_for_an_unknown_host_is_refused_before_any_mac():
    calls = []

    def key_of(nqn):
        calls.append(nqn)
        return None

    v = fp.Verifier(SUBSYSTEM, key_of, clock=lambda: NOW)
    evil = "nqn.2026-11.org.evil:bob"
    assert v.check(fp.make(b"e" * 32, evil, SUBSYSTEM, NOW), evil) == fp.UNKNOWN_HOST
    assert v.check(proof(), "") == fp.UNKNOWN_HOST
    assert v.check(proof(), "x" * 300) == fp.UNKNOWN_HOST
    assert calls == [evil]
    assert verifier().check(proof(nqn="nqn.2026-11.org.kvtestbed:compute-0"),
                            "nqn.2026-11.org.kvtestbed:compute-0") == fp.UNKNOWN_HOST  # not on the allow list


def test_a_proof_is_good_within_its_window_only():
    v = verifier()
    assert v.check(proof(at=NOW - fp.WINDOW_S + 1), AGENT) == fp.OK
    assert v.check(proof(at=NOW + fp.WINDOW_S - 1), AGENT) == fp.OK
    assert v.check(proof(at=NOW - fp.WINDOW_S - 1), AGENT) == fp.STALE
    assert v.check(proof(at=NOW + fp.WINDOW_S + 1), AGENT) == fp.STALE


@pytest.mark.parametrize("data", [b"", b"x" * 41, b"x" * 43, b"\x02" + b"\0" * 41, b"\x01\x02" + b"\0" * 40])
def test_what_is_no_proof_is_malformed(data):
    assert verifier().check(data, AGENT) == fp.MALFORMED


def test_making_a_proof_needs_a_key_and_a_whole_nonce():
    with pytest.raises(ValueError):
        fp.make(b"", AGENT)
    with pytest.raises(ValueError):
        fp.make(b"k" * 32, AGENT, nonce=b"short")


def test_the_replay_cache_is_bounded_and_a_nonce_pushed_out_stays_refused():
    cache = fp.ReplayCache(capacity=8, window_s=30)
    nonces = [b"%016d" % i for i in range(100)]
    for i, n in enumerate(nonces):
        assert cache.take(n, NOW + i * 0.001, NOW)
        assert len(cache) <= 8
    for i, n in enumerate(nonces):  # each one again: in the cache, or at or before the floor
        assert not cache.take(n, NOW + i * 0.001, NOW)
    assert cache.take(b"%016d" % 1000, NOW + 1, NOW)  # a newer one still goes in


def test_the_replay_cache_forgets_what_is_past_the_window():
    cache = fp.ReplayCache(capacity=1000, window_s=30)
    for i in range(10):
        cache.take(b"%016d" % i, NOW, NOW)
    assert len(cache) == 10
    assert cache.take(b"%016d" % 99, NOW + 40, NOW + 40)
    assert len(cache) == 1
    assert cache.floor == float("-inf")  # nothing in the window was pushed out


def test_a_replayed_proof_past_its_window_is_stale_even_once_forgotten():
    clock = [NOW]
    v = verifier(clock=lambda: clock[0], replay_entries=2)
    p = proof()
    assert v.check(p, AGENT) == fp.OK
    clock[0] = NOW + fp.WINDOW_S + 1
    assert v.check(p, AGENT) == fp.STALE


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        fp.ReplayCache(capacity=0)
    with pytest.raises(ValueError):
        fp.Verifier(SUBSYSTEM, lambda nqn: None, window_s=0)
    with pytest.raises(ValueError):
        fp.LearnedSubsystems(capacity=0)


def test_a_host_remembers_a_bounded_number_of_subsystems():
    learned = fp.LearnedSubsystems(capacity=3)
    assert learned.get("tcp://a") == ""
    learned.remember("tcp://a", "")  # nothing learned
    assert len(learned) == 0
    for i in range(10):
        learned.remember(f"tcp://n{i}", f"nqn.{i}")
    assert len(learned) == 3 and learned.get("tcp://n9") == "nqn.9" and learned.get("tcp://n0") == ""


def test_the_check_takes_microseconds():
    import time
    v = verifier()
    proofs = [proof() for _ in range(2000)]
    began = time.perf_counter()
    assert all(v.check(p, AGENT) == fp.OK for p in proofs)
    per = (time.perf_counter() - began) / len(proofs)
    assert per < 200e-6, f"{per * 1e6:.0f} us a check"  # a few microseconds; loose for a busy machine
