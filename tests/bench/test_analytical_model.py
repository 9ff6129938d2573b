from __future__ import annotations

import dataclasses

import pytest

from bench import analytical_model as am
from bench.analytical_model import KIB, MIB, TIB, ModelParams

P = ModelParams()
M = 32 * KIB  # 32768 bytes


def test_nvme_write_is_latency_in_ms_plus_bandwidth_model():
    latency_s = (3.3 + 4.10e-7 * 32768) * 1e-3  # 3.31343488e-3
    transfer_s = 32768 / (2.34e9 + 6.83 * 32768)  # 32768 / 2340223805.44 = 1.40022e-5
    assert am.nvme_write_s(M, P) == pytest.approx(latency_s + transfer_s, rel=1e-12)
    assert am.nvme_write_s(M, P) == pytest.approx(3.327437e-3, rel=1e-6)


def test_nvme_read_model():
    expected = (2.03 + 2.63e-7 * 1e6) * 1e-3 + 1e6 / (5.22e9 + 19.4 * 1e6)  # 2.293e-3 + 1.9085e-4
    assert am.nvme_read_s(1e6, P) == pytest.approx(expected, rel=1e-12)
    assert am.nvme_read_s(1e6, P) == pytest.approx(2.48385e-3, rel=1e-5)


def test_nvme_latency_reading_in_seconds():
    p = dataclasses.replace(P, nvme_latency_unit_s=1.0)
    assert am.nvme_write_s(M, p) == pytest.approx(3.31343488 + 1.40022e-5, rel=1e-6)


def test_cpu_chunk_stages_by_hand():
    stages = am.cpu_chunk_stages(M, P)
    assert list(stages) == ["gpu_to_host", "host_stack", "host_to_wire", "network", "nvme_write"]
    assert stages["gpu_to_host"] == pytest.approx(3.2e-8 + 32768 * 8.12e-12)  # 2.9807616e-7
    assert stages["host_stack"] == pytest.approx(32768 * (1.21e-12 + 4.55e-13))  # 5.455872e-8
    assert stages["host_to_wire"] == pytest.approx(3.2e-8 + 32768 * 5.13e-11)  # 1.7129984e-6
    assert stages["network"] == 1.21e-12


def test_triggered_chunk_is_bottlenecked_by_serialisation():
    stages = am.triggered_chunk_stages(M, P)
    assert list(stages) == ["gpu_to_wire", "network", "nvme_write"]
    assert stages["gpu_to_wire"] == pytest.approx(1.7129984e-6)


def test_slower_link_replaces_serialisation():
    p = dataclasses.replace(P, link_s_per_byte=8e-11)
    assert am.triggered_chunk_stages(1000, p)["gpu_to_wire"] == pytest.approx(3.2e-8 + 8e-8)


def test_split_chunks():
    assert am.split_chunks(M, 512 * MIB) == [(M, 1)]
    assert am.split_chunks(5 * TIB, 512 * MIB) == [(512 * MIB, 10240)]
    assert am.split_chunks(1000 * 2 + 500, 1000) == [(1000, 2), (500, 1)]


def _toy_stages(m, p):
    return {"a": m * 1.0, "b": 2.0}


def test_path_time_serial_and_pipelined():
    p = dataclasses.replace(P, chunk_bytes=1000)
    assert am.path_time_s(3000, _toy_stages, False, p) == pytest.approx(3 * 1002)
    assert am.path_time_s(3000, _toy_stages, True, p) == pytest.approx(1002 + 2 * 1000)
    assert am.path_time_s(2500, _toy_stages, True, p) == pytest.approx(1002 + 1000 + 500)


def test_small_transfer_is_one_chunk_sum():
    expected_cpu = 2.9807616e-7 + 5.455872e-8 + 1.7129984e-6 + 1.21e-12 + am.nvme_write_s(M, P)
    assert am.cpu_centric_s(M) == pytest.approx(expected_cpu, rel=1e-9)
    expected_trig = 1.7129984e-6 + 1.21e-12 + am.nvme_write_s(M, P)
    assert am.triggered_s(M) == pytest.approx(expected_trig, rel=1e-9)


def test_without_nvme_speedup_is_ratio_of_per_byte_costs_at_scale():
    p = dataclasses.replace(P, include_nvme=False)
    cpu_per_byte = 8.12e-12 + 1.21e-12 + 4.55e-13 + 5.13e-11  # 6.1085e-11
    assert am.cpu_centric_s(5 * TIB, p) / am.triggered_s(5 * TIB, p) == pytest.approx(
        cpu_per_byte / 5.13e-11, rel=1e-3)  # 1.1907


def test_sweep_covers_32k_to_5t():
    sizes = am.default_sizes()
    assert sizes[0] == 32 * KIB and sizes[-1] == 5 * TIB and len(sizes) == 29
    rows = am.sweep([M])
    assert rows[0]["speedup"] == pytest.approx(rows[0]["cpu_s"] / rows[0]["triggered_s"])


def test_chosen_reading_lands_far_below_paper():
    low, high = am.speedup_range(P)
    assert 1.0 <= low <= high < 1.2  # the tables alone give ~1.0-1.1x, not 19-23x
    assert set(am.alternative_readings()) >= {"chosen", "nvme_latency_in_s", "without_nvme"}


def test_overhead_needed():
    extra = am.cpu_overhead_needed_s(19.0, M)
    assert am.cpu_centric_s(M) + extra == pytest.approx(19.0 * am.triggered_s(M))
