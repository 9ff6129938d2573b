"""Commands under a hardware profile: a store ends when the modeled drive says, one after another,
and data that came after its sender's modeled link delivered it is a counted violation."""
from __future__ import annotations

import time

import pytest

from fabric import status as st
from scale import costs, profile as pf
from scale import settings as scale_settings

from .conftest import Harness, settings_for
from .test_commands import status, store


@pytest.fixture
def paper_at_10():
    _, pacer = scale_settings.install_from(scale_settings.ScaleSettings("paper", 10.0))
    yield pacer
    scale_settings.install_from(scale_settings.ScaleSettings())


def test_a_store_takes_d_times_the_modeled_nvme_write(tmp_path, paper_at_10):
    h = Harness(settings_for(tmp_path))
    h.connect()
    value = b"v" * 4096
    budget = 10.0 * costs.nvme_write_s(pf.load("paper"), len(value))  # 3.3 ms + ... x 10: about 33 ms
    start = time.perf_counter()
    assert status(store(h, b"k1", value)) == st.SUCCESS
    took = time.perf_counter() - start
    assert budget <= took < budget + 1.0
    kinds = paper_at_10.snapshot()["kinds"]
    assert kinds["nvme_write"]["ops"] == 1 and kinds["nvme_write"]["violations"] == 0


def test_data_later_than_its_paced_until_is_a_delivery_violation(tmp_path, paper_at_10):
    h = Harness(settings_for(tmp_path))
    h.connect()
    assert status(store(h, b"late", b"x" * 100, paced_until=time.perf_counter() - 1.0)) == st.SUCCESS
    assert status(store(h, b"early", b"x" * 100, paced_until=time.perf_counter() + 0.05)) == st.SUCCESS
    delivery = paper_at_10.snapshot()["kinds"]["delivery"]
    assert delivery["ops"] == 2 and delivery["violations"] == 1


def test_the_drive_serves_one_command_at_a_time(tmp_path, paper_at_10):
    """Two stores sent back to back: the second's modeled time starts when the first's ends."""
    h = Harness(settings_for(tmp_path))
    h.connect()
    one = 10.0 * costs.nvme_write_s(pf.load("paper"), 100)
    start = time.perf_counter()
    for key in (b"a", b"b"):
        h.processor.receive(b"s1", [memoryview(_store_capsule(h, key)), memoryview(b"x" * 100)])
    for _ in range(2):
        cmd, result = h.done.get(timeout=10)
        h.processor.complete(cmd, result)
    assert time.perf_counter() - start >= 2 * one


def test_without_a_profile_nothing_waits(tmp_path):
    h = Harness(settings_for(tmp_path))
    h.connect()
    start = time.perf_counter()
    assert status(store(h, b"k", b"v" * 100)) == st.SUCCESS
    assert time.perf_counter() - start < 1.0


def _store_capsule(h: Harness, key: bytes) -> bytes:
    from kvtb.crc32c import crc32c
    from kvtb_proto import nvmeof_pb2 as pb
    h.next_cid += 1
    return pb.CommandCapsule(command_id=h.next_cid, command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1,
                             key=key, value_length=100, crc32c=crc32c(b"x" * 100), has_crc32c=True).SerializeToString()
