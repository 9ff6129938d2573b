"""scale.software: a thread's CPU time stretched by D (a fake CPU clock and a fake sleep), and the loop
ticker on a real loop with a real CPU-bound slice."""
from __future__ import annotations

import asyncio
import time

import pytest

from scale import dilation as dl
from scale import software


class FakeCpu:
    def __init__(self):
        self.cpu = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_owed_is_d_minus_one_times_the_cpu_time():
    assert software.owed_s(0.25, 8) == 1.75
    assert software.owed_s(0.25, 1) == 0.0
    assert software.owed_s(-1.0, 8) == 0.0


def test_a_slice_of_cpu_blocks_the_thread_d_minus_one_times_it():
    cpu = FakeCpu()
    pacer = dl.Pacer(8, sleep=cpu.sleep)
    stretch = software.Stretch(pacer, "frontend_software", cpu_clock=cpu.clock)
    assert stretch.tick() == 0.0          # the first tick only starts the count
    cpu.cpu += 0.125
    assert stretch.tick() == 0.875
    assert cpu.sleeps == [0.875]
    kinds = pacer.snapshot()["kinds"]
    assert kinds["frontend_software"]["real_s"] == 0.125 and kinds["frontend_software"]["violations"] == 0
    assert kinds["frontend_software"]["worst_ratio"] == 1.0   # software never drives D up


def test_small_debts_are_carried_until_they_are_worth_a_sleep():
    cpu = FakeCpu()
    pacer = dl.Pacer(2, sleep=cpu.sleep)
    stretch = software.Stretch(pacer, "agent_software", cpu_clock=cpu.clock, min_block_s=0.5)
    stretch.tick()
    cpu.cpu += 0.25
    assert stretch.tick() == 0.0 and cpu.sleeps == []
    cpu.cpu += 0.25
    assert stretch.tick() == 0.5 and cpu.sleeps == [0.5]
    assert stretch.blocked_s == 0.5


def test_idle_ticks_record_nothing():
    cpu = FakeCpu()
    pacer = dl.Pacer(4, sleep=cpu.sleep)
    stretch = software.Stretch(pacer, "frontend_software", cpu_clock=cpu.clock)
    for _ in range(3):
        stretch.tick()
    assert pacer.snapshot()["ops"] == 0 and cpu.sleeps == []


def test_a_stretch_needs_a_kind():
    with pytest.raises(ValueError):
        software.Stretch(dl.Pacer(2), "")


def test_no_pacer_or_d_of_one_starts_nothing():
    async def go():
        return await software.on_loop(None, "x"), await software.on_loop(dl.Pacer(1.0), "x")
    assert asyncio.run(go()) == (None, None)


def test_on_a_real_loop_cpu_work_takes_about_d_times_its_cpu_time():
    """A CPU-bound slice of ~40 ms on the loop at D = 3, after a short idle calibration: the loop's
    thread is blocked ~80 ms more."""
    pacer = dl.Pacer(3)

    async def go() -> float:
        task = await software.on_loop(pacer, "frontend_software", virtual_interval_s=0.002, calibration_s=0.05)
        await asyncio.sleep(0.02)   # charging
        begin = time.perf_counter()
        end_cpu = time.thread_time() + 0.04
        while time.thread_time() < end_cpu:
            pass
        await asyncio.sleep(0.03)   # the next tick charges the slice
        wall = time.perf_counter() - begin
        task.cancel()
        return wall

    wall = asyncio.run(go())
    kind = pacer.snapshot()["kinds"]["frontend_software"]
    assert kind["real_s"] >= 0.03
    assert wall >= 0.04 + 2 * 0.03   # the slice, and (D - 1) x (it less the idle rate's share) blocked
    assert "frontend_software_idle_cpu_rate" in pacer.snapshot()["marks"]


def test_the_idle_rate_is_not_charged():
    """0.5 s of CPU over 10 s of wall time at an idle rate of 0.01: 0.4 s charged."""
    cpu, wall = FakeCpu(), [0.0]
    pacer = dl.Pacer(2, sleep=cpu.sleep)
    stretch = software.Stretch(pacer, "frontend_software", cpu_clock=cpu.clock, wall_clock=lambda: wall[0],
                               idle_rate=0.01)
    stretch.tick()
    cpu.cpu, wall[0] = 0.5, 10.0
    assert stretch.tick() == pytest.approx(0.4)
    cpu.cpu, wall[0] = 0.55, 20.0   # idle: less than the idle rate
    assert stretch.tick() == 0.0 and len(cpu.sleeps) == 1


def test_charged_blocks_a_pool_thread_after_its_slice():
    cpu = FakeCpu()
    pacer = dl.Pacer(5, sleep=cpu.sleep)
    with software.charged(pacer, "agent_software", cpu_clock=cpu.clock):
        cpu.cpu += 0.25
    assert cpu.sleeps == [1.0]
    assert pacer.snapshot()["kinds"]["agent_software"]["ops"] == 1


def test_charged_without_a_pacer_is_free():
    with software.charged(None, "agent_software"):
        pass
    with software.charged(dl.Pacer(1.0), "agent_software"):
        pass


class Servicer:
    """Each call uses 0.5 s of (fake) CPU, each streamed reply 0.25 s."""

    def __init__(self, cpu: FakeCpu):
        self.cpu = cpu

    def Lookup(self, request, context):
        self.cpu.cpu += 0.5
        return request * 2

    def Watch(self, request, context):
        for i in range(request):
            self.cpu.cpu += 0.25
            yield i

    def _private(self):
        return "private"


def test_a_charged_servicer_charges_every_call_and_every_streamed_reply():
    cpu = FakeCpu()
    pacer = dl.Pacer(3, sleep=cpu.sleep)
    wrapped = software.ChargedServicer(Servicer(cpu), pacer, "agent_software", cpu_clock=cpu.clock)
    assert wrapped.Lookup(21, None) == 42
    assert cpu.sleeps == [1.0]
    assert list(wrapped.Watch(2, None)) == [0, 1]
    assert cpu.sleeps == [1.0, 0.5, 0.5]      # each reply's slice; the generator's end used none
    assert wrapped._private() == "private" and wrapped.Lookup.__name__ == "Lookup"
    kind = pacer.snapshot()["kinds"]["agent_software"]
    assert kind["ops"] == 3 and kind["real_s"] == 1.0


def test_excluded_methods_are_not_charged():
    cpu = FakeCpu()
    pacer = dl.Pacer(3, sleep=cpu.sleep)
    wrapped = software.ChargedServicer(Servicer(cpu), pacer, "agent_software", cpu_clock=cpu.clock,
                                       exclude=frozenset({"Lookup"}))
    assert wrapped.Lookup(1, None) == 2 and cpu.sleeps == [] and pacer.snapshot()["ops"] == 0
