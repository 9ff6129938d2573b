"""The machine's busy CPU over a window: /proc/stat parsing, tallies, and a real measurement."""
from __future__ import annotations

import time

import pytest

from kvtb.bench import cpu_use, rawlimits

STAT = """cpu  100 5 40 900 30 7 8 50 0 0
cpu0 50 2 20 450 15 3 4 25 0 0
cpu1 50 3 20 450 15 4 4 25 0 0
intr 12345
"""


def test_busy_ticks_are_user_nice_system_irq_softirq_of_the_aggregate_line():
    assert cpu_use.busy_ticks(STAT) == 100 + 5 + 40 + 7 + 8  # not idle 900, iowait 30, steal 50


@pytest.mark.parametrize("text", ["intr 1\n", "cpu  1 2 3\n"])
def test_a_stat_without_a_full_cpu_line_is_refused(text):
    with pytest.raises(ValueError):
        cpu_use.busy_ticks(text)


def test_busy_core_s_reads_a_stat_file_and_is_none_without_one(tmp_path):
    path = tmp_path / "stat"
    path.write_text(STAT)
    assert cpu_use.busy_core_s(str(path)) == pytest.approx(160 / cpu_use.TICKS_PER_S)
    assert cpu_use.busy_core_s(str(tmp_path / "missing")) is None


def test_a_tally_gives_medians_over_its_windows():
    tally = cpu_use.CpuTally()
    tally.add(1.0, 1.5, 1 << 30)   # 1.5 core-s per GiB: 1464.8 µs/MiB, 1.5 cores
    tally.add(2.0, 2.0, 1 << 30)   # 1953.1 µs/MiB, 1.0 core
    tally.add(0.5, 3.0, 1 << 30)   # the slow first round: 2929.7 µs/MiB, 6 cores
    assert tally.us_per_mib() == pytest.approx(2.0 * 1e6 / 1024)
    assert tally.cores() == pytest.approx(1.5)
    assert tally.figures() == {"us_per_mib": tally.us_per_mib(), "busy_cores": tally.cores(), "windows": 3}
    # the window a benchmark reports the rate of (its best round): that window's own figures
    assert tally.figures(best=0)["best_window"] == {"us_per_mib": pytest.approx(1.5 * 1e6 / 1024),
                                                    "busy_cores": pytest.approx(1.5)}
    assert tally.figures(best=2)["best_window"]["busy_cores"] == pytest.approx(6.0)


def test_one_unreadable_window_makes_the_figures_unknown():
    tally = cpu_use.CpuTally()
    assert tally.us_per_mib() is None and tally.cores() is None  # no windows yet
    tally.add(1.0, 1.0, 1 << 20)
    tally.add(1.0, None, 1 << 20)
    assert tally.figures() == {"us_per_mib": None, "busy_cores": None, "windows": 2}
    assert tally.figures(best=0)["best_window"] == {"us_per_mib": None, "busy_cores": None}


def test_the_ceiling_is_every_core_at_the_cost_per_mib():
    assert cpu_use.ceiling_bytes_per_s(1000.0, cores=2) == pytest.approx(2 * (1 << 20) / 1e-3)
    assert cpu_use.ceiling_bytes_per_s(None, cores=2) is None


def _spin(cpu_s: float) -> None:
    """Keep this thread on a core until it has run for cpu_s (however long that takes)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


TICK_S = 2.0 / cpu_use.TICKS_PER_S  # /proc/stat's resolution, at each end of a window


@pytest.mark.skipif(cpu_use.busy_core_s() is None, reason="needs /proc/stat")
def test_a_window_counts_at_least_the_cpu_this_thread_used():
    window = cpu_use.Window()
    start = time.thread_time()
    _spin(0.3)
    used = time.thread_time() - start
    wall_s, busy_s = window.end()
    assert wall_s >= used
    assert busy_s >= used - TICK_S  # the whole machine's busy time includes this thread's


@pytest.mark.skipif(cpu_use.busy_core_s() is None, reason="needs /proc/stat")
def test_a_meter_tallies_the_cpu_and_bytes_of_its_windows():
    class Spinner(rawlimits.Meter):
        size_bytes = 1 << 20

        def _step(self):
            _spin(0.01)  # 10 ms of CPU per MiB: 10,000 core-µs per MiB at least

    meter = Spinner()
    rate = meter.window(0.3)
    meter.window(0.3)
    figures = meter.cpu.figures()
    assert figures["windows"] == 2
    assert figures["us_per_mib"] >= 10_000 * (1 - TICK_S / 0.3)
    wall_s, _, nbytes = meter.cpu.samples[0]
    assert nbytes == pytest.approx(rate * wall_s, rel=0.1)  # the bytes the window's rate counts


@pytest.mark.skipif(cpu_use.busy_core_s() is None, reason="needs /proc/stat")
def test_a_sampler_gives_each_meters_cpu_in_the_window_it_keeps():
    class Slowing(rawlimits.Meter):
        """Each window spins twice as long per MiB as the one before: the first is the best."""

        size_bytes = 1 << 20

        def __init__(self):
            self.cpu_s = 0.005

        def _step(self):
            _spin(self.cpu_s)

        def window(self, seconds):
            rate = super().window(seconds)
            self.cpu_s *= 2
            return rate

    sampler = rawlimits.Sampler({"slowing": Slowing()}, 0.2)
    for _ in range(3):
        sampler()
    figures = sampler.cpu()["slowing"]
    assert figures["windows"] == 3
    assert sampler.samples["slowing"].index(sampler.best()["slowing"]) == 0
    assert figures["best_window"]["us_per_mib"] < figures["us_per_mib"]  # the cheap first window
    assert figures["best_window"]["us_per_mib"] >= 5_000 * (1 - TICK_S / 0.2)
