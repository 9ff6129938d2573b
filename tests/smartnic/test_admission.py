"""Which blocks a standing PUT keeps: always, or only once a name is seen twice (pure)."""
import pytest

from smartnic.admission import Admission


def test_always_admits_every_block():
    a = Admission("always")
    assert all(a.admit(bytes([i]) * 16) for i in range(5)) and len(a) == 0


def test_on_reuse_stores_a_name_at_its_second_sighting_only():
    a = Admission("on_reuse")
    assert not a.admit(b"x" * 16) and not a.admit(b"y" * 16)
    assert a.admit(b"x" * 16)  # seen twice: stored
    assert not a.admit(b"x" * 16)  # stored, then gone (evicted): it must be seen twice again
    assert a.admit(b"z" * 16, stored=lambda name: True)  # a copy is on storage: refreshed as it is


def test_on_reuse_remembers_a_bounded_number_of_names_least_recently_seen_forgotten():
    a = Admission("on_reuse", max_names=2)
    for name in (b"a", b"b", b"c"):
        assert not a.admit(name)
    assert len(a) == 2
    assert not a.admit(b"a")  # forgotten: a first sighting again
    assert a.admit(b"c")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="admission: one of"):
        Admission("sometimes")
    with pytest.raises(ValueError, match="max_names"):
        Admission("on_reuse", max_names=0)
