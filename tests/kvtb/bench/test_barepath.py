"""The bare path: its two processes move exactly the chunks' bytes, in the agent benchmark's layout."""
import numpy as np
import pytest

from kvtb.bench import barepath, rawlimits

CHUNK = 16 << 10
WORKING_SET = 4 * CHUNK
RANGES = 8
ROW = CHUNK // RANGES


def rows_of(region: np.ndarray, chunks: int, i: int) -> bytes:
    """Chunk i's bytes as the agent gathers them: row k at (k * chunks + i) * ROW."""
    starts = ((k * chunks + i) * ROW for k in range(RANGES))
    return b"".join(region[start:start + ROW].tobytes() for start in starts)


def test_bare_put_makes_each_gathered_chunk_durable_at_its_slot(tmp_path):
    with barepath.BarePut(CHUNK, tmp_path, WORKING_SET, RANGES) as meter:
        assert meter.window(0.05) > 0
        written = next(tmp_path.glob("kvtb-bare-*/put.bin")).read_bytes()
        region = meter._region
        assert len(written) == WORKING_SET
        for i in range(meter.chunks):
            assert written[i * CHUNK:(i + 1) * CHUNK] == rows_of(region, meter.chunks, i)
    assert list(tmp_path.iterdir()) == []


def test_bare_get_scatters_each_chunk_into_its_rows(tmp_path):
    with barepath.BareGet(CHUNK, tmp_path, WORKING_SET, RANGES) as meter:
        assert not meter._region.any()
        assert meter.window(0.05) > 0
        sent = rawlimits._payload(WORKING_SET).tobytes()  # what the other process's file holds
        for i in range(meter.chunks):
            assert rows_of(meter._region, meter.chunks, i) == sent[i * CHUNK:(i + 1) * CHUNK]
    assert list(tmp_path.iterdir()) == []


def test_bare_get_refuses_a_chunk_that_arrives_changed(tmp_path):
    with barepath.BareGet(CHUNK, tmp_path, WORKING_SET, RANGES) as meter:
        meter._crcs[1] ^= 1  # as if chunk 1 had changed on its way
        with pytest.raises(RuntimeError, match="chunk 1"):
            meter.window(0.05)


def test_a_chunk_must_split_into_whole_rows(tmp_path):
    with pytest.raises(ValueError, match="equal rows"):
        barepath.BarePut(CHUNK + 1, tmp_path, WORKING_SET, RANGES)


def test_meters_sample_beside_the_raw_limits(tmp_path):
    with barepath.meters(CHUNK, tmp_path, WORKING_SET, RANGES) as bare:
        sampler = rawlimits.Sampler(bare, 0.05)
        sampler()
    assert set(sampler.best()) == {"bare_put", "bare_get"}
    assert all(rate > 0 for rate in sampler.best().values())


def test_a_peer_that_cannot_start_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(barepath.sys, "executable", "false")  # the child exits at once
    with pytest.raises(RuntimeError, match="exited with 1"):
        barepath.BareGet(CHUNK, tmp_path, WORKING_SET, RANGES)
    assert list(tmp_path.iterdir()) == []
