"""scale.dilation: the Pacer under a fake clock and a fake sleep, resources across real threads, and
the helpers that read its snapshots. Times are powers of two, so float arithmetic is exact."""
from __future__ import annotations

import threading

import pytest

from scale import dilation as dl


class FakeTime:
    """A clock that only moves when the work advances it or the pacer sleeps."""

    def __init__(self, start: float = 0.0):
        self.now = start
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def work(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def time_() -> FakeTime:
    return FakeTime(start=16.0)


def pacer(time_: FakeTime, dilation: float = 8, **kwargs) -> dl.Pacer:
    return dl.Pacer(dilation, clock=time_.clock, sleep=time_.sleep, **kwargs)


# -- one operation --------------------------------------------------------------------------------------

def test_an_op_faster_than_its_budget_is_stretched_to_exactly_the_budget(time_):
    p = pacer(time_, dilation=8)
    start = time_.now
    with p.op("nvme_write", modeled_s=0.0625):  # budget 8 x 0.0625 = 0.5 s
        time_.work(0.25)                         # real work 0.25 s
    assert time_.sleeps == [0.25]                # the rest of the budget
    assert time_.now - start == 0.5              # wall = D x modeled exactly
    s = p.snapshot()["kinds"]["nvme_write"]
    assert (s["ops"], s["violations"], s["real_s"], s["modeled_s"]) == (1, 0, 0.25, 0.0625)
    assert s["overrun_s"] == 0.0
    assert s["worst_ratio"] == 4.0               # 0.25 / 0.0625: it needs D >= 4


def test_an_op_slower_than_its_budget_is_a_violation_and_not_slept(time_):
    p = pacer(time_, dilation=8)
    start = time_.now
    with p.op("gpu_step", modeled_s=0.0625):     # budget 0.5 s
        time_.work(0.75)                         # real 0.75 s: over by 0.25
    assert time_.sleeps == []
    assert time_.now - start == 0.75
    snap = p.snapshot()
    s = snap["kinds"]["gpu_step"]
    assert (s["ops"], s["violations"], s["overrun_s"], s["violation_fraction"]) == (1, 1, 0.25, 1.0)
    assert s["worst_ratio"] == 12.0              # 0.75 / 0.0625
    assert (snap["ops"], snap["violations"], snap["dilation"]) == (1, 1, 8.0)


def test_the_wait_runs_when_the_work_raises(time_):
    p = pacer(time_, dilation=2)
    with pytest.raises(RuntimeError, match="disk"):
        with p.op("nvme_read", modeled_s=0.5):   # budget 1 s
            time_.work(0.25)
            raise RuntimeError("disk gone")
    assert time_.sleeps == [0.75]
    assert p.snapshot()["kinds"]["nvme_read"]["ops"] == 1


def test_budget_virtual_and_reset(time_):
    p = pacer(time_, dilation=40)
    assert p.budget_s(0.25) == 10.0 and p.budget_s(-1.0) == 0.0
    assert p.virtual(10.0) == 0.25
    with p.op("x", 0.0):
        pass
    assert p.snapshot()["ops"] == 1
    p.reset()
    assert p.snapshot()["ops"] == 0 and p.snapshot()["violation_fraction"] == 0.0


# -- resources across threads ---------------------------------------------------------------------------
#
# A resource is a server of one, kept as a timeline in wall time: an operation's slot starts when the
# previous slot on it ends. Two threads that start an operation on it at once are served one after
# the other: the second waits out its own budget after the first's.

def _two_threads_at_once(resource_of: dict[str, str | None]) -> dict[str, float]:
    """Threads A and B each run one operation (modeled 0.0625 s, D = 8: budget 0.5 s, no real work)
    at the same instant of a frozen clock; returns how long each slept."""
    slept: dict[str, float] = {}
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            slept[threading.current_thread().name] = seconds

    p = dl.Pacer(8, clock=lambda: 16.0, sleep=sleep, resources=("nvme", "nic"))
    both_ready = threading.Barrier(2, timeout=5)

    def work() -> None:
        name = threading.current_thread().name
        both_ready.wait()
        with p.op("transfer", 0.0625, resource=resource_of[name]):
            pass

    threads = [threading.Thread(target=work, name=n) for n in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert p.snapshot()["violations"] == 0
    return slept


def test_a_resource_serialises_two_threads():
    slept = _two_threads_at_once({"A": "nvme", "B": "nvme"})
    # whichever came first: its slot is 16.0-16.5, the other's 16.5-17.0
    assert sorted(slept.values()) == [0.5, 1.0]


def test_two_resources_or_none_do_not_serialise():
    assert _two_threads_at_once({"A": "nvme", "B": "nic"}) == {"A": 0.5, "B": 0.5}
    assert _two_threads_at_once({"A": None, "B": None}) == {"A": 0.5, "B": 0.5}


def test_a_resource_queues_in_order_with_reserve_and_settle(time_):
    p = pacer(time_, dilation=8, resources=("nvme",))
    first = p.reserve("nvme_write", 0.0625, "nvme")       # slot 16.0-16.5
    second = p.reserve("nvme_write", 0.0625, "nvme")      # slot 16.5-17.0
    later = p.reserve("nvme_write", 0.0625, "nvme", not_before=18.0)  # data arrives at 18.0: 18.0-18.5
    assert (first.end, second.end, later.end) == (16.5, 17.0, 18.5)
    time_.work(0.25)
    assert p.settle(first) == 0.25 and p.settle(second) == 0.75  # seconds left of each slot
    assert p.snapshot()["violations"] == 0


# -- reading snapshots ----------------------------------------------------------------------------------

def test_dilation_needed():
    kinds = {"gpu_step": {"ops": 3, "worst_ratio": 4.0},
             "nvme_write": {"ops": 2, "worst_ratio": 10.0},
             "unused": {"ops": 0, "worst_ratio": 99.0}}  # no operations: no say
    d, need = dl.dilation_needed(kinds)
    assert need == {"gpu_step": 4.0, "nvme_write": 10.0}
    assert d == 20.0                                       # the worst (10) x the margin (2)
    assert dl.dilation_needed(kinds, margin=1.5)[0] == 15.0
    # hardware faster than real time: D is never below 1
    assert dl.dilation_needed({"copy": {"ops": 5, "worst_ratio": 0.25}}) == (1.0, {"copy": 0.25})


def _snap(profile: str, dilation: float, kinds: dict) -> dict:
    return {"profile": profile, "dilation": dilation, "kinds": kinds}


def test_merge_adds_per_kind():
    a = _snap("polaris-a100", 40.0, {
        "gpu_step": {"ops": 10, "violations": 1, "real_s": 1.0, "modeled_s": 0.5, "overrun_s": 0.25,
                     "worst_ratio": 3.0}})
    b = _snap("polaris-a100", 40.0, {
        "gpu_step": {"ops": 30, "violations": 0, "real_s": 2.0, "modeled_s": 1.5, "overrun_s": 0.0,
                     "worst_ratio": 5.0},
        "nvme_write": {"ops": 4, "violations": 2, "real_s": 0.5, "modeled_s": 0.25, "overrun_s": 0.125,
                       "worst_ratio": 9.0}})
    merged = dl.merge([None, a, b, {}])
    g = merged["kinds"]["gpu_step"]
    assert (g["ops"], g["violations"], g["real_s"], g["modeled_s"], g["overrun_s"]) == (40, 1, 3.0, 2.0, 0.25)
    assert g["worst_ratio"] == 5.0 and g["violation_fraction"] == 1 / 40
    assert merged["kinds"]["nvme_write"]["violation_fraction"] == 0.5
    assert (merged["ops"], merged["violations"]) == (44, 3)
    assert merged["violation_fraction"] == 3 / 44
    assert (merged["profile"], merged["dilation"]) == ("polaris-a100", 40.0)
    assert dl.merge([])["ops"] == 0


def test_invalid_kinds():
    snap = {"kinds": {"gpu_step": {"violation_fraction": 0.02},
                      "nvme_write": {"violation_fraction": 0.0},
                      "nic_put": {"violation_fraction": 0.01}}}  # at the limit: still valid
    assert dl.invalid_kinds(snap) == ["gpu_step"]
    assert dl.invalid_kinds(snap, depends_on=["nvme_write", "nic_put"]) == []
    assert dl.invalid_kinds(snap, depends_on=["gpu_step", "not_run"]) == ["gpu_step"]
    assert dl.invalid_kinds(snap, limit=0.0) == ["gpu_step", "nic_put"]


# -- the dilation factor --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, "x", 2e6, 0.5, None, float("nan")])
def test_check_dilation_rejects(bad):
    with pytest.raises(dl.DilationError):
        dl.check_dilation(bad)
    with pytest.raises(dl.DilationError):
        dl.Pacer(bad)


@pytest.mark.parametrize("good, value", [(1, 1.0), ("40", 40.0), (1e6, 1e6), (2.5, 2.5)])
def test_check_dilation_accepts(good, value):
    assert dl.check_dilation(good) == value


def test_install_and_current():
    before = dl.current()
    try:
        p = dl.Pacer(4)
        dl.install(p)
        assert dl.current() is p
        dl.install(None)
        assert dl.current() is None
    finally:
        dl.install(before)


def test_a_kind_without_modeled_time_does_not_make_d_infinite():
    p = dl.Pacer(1, clock=lambda: 0.0, sleep=lambda s: None)
    p.record("delivery", 0.0, 0.001, violated=True)  # data arrived 1 ms after its modeled delivery
    p.record("nvme_write", 0.0625, 0.125)            # needs D >= 2
    d, _ = dl.dilation_needed(p.snapshot()["kinds"])
    assert d == 4.0                                  # 2 x the margin 2; no D can pace a zero budget


def test_since_takes_the_operations_before_a_snapshot_out():
    from scale.dilation import Pacer, since
    t = [0.0]
    p = Pacer(2.0, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    with p.op("gpu_step", 0.001):
        t[0] += 1.0  # a fresh node's first step: a violation
    before = p.snapshot()
    for _ in range(3):
        with p.op("gpu_step", 0.001):
            t[0] += 0.0005
    got = since(p.snapshot(), before)
    assert got["kinds"]["gpu_step"]["ops"] == 3 and got["kinds"]["gpu_step"]["violations"] == 0
    assert got["ops"] == 3 and got["violation_fraction"] == 0.0
    assert since(p.snapshot(), None)["ops"] == 4


def test_a_stall_on_another_paced_operation_moves_the_end_and_is_not_the_works_own():
    from scale.dilation import Pacer
    t = [0.0]
    p = Pacer(10.0, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    ticket = p.reserve("gpu_step", 0.01)  # 100 ms of budget
    t[0] += 0.5  # 0.45 s of it waiting for a restored layer, 0.05 s computing
    left = p.settle(ticket, stalled=0.45)
    assert left == pytest.approx(0.05)  # ends at 0.1 + 0.45
    k = p.snapshot()["kinds"]["gpu_step"]
    assert k["violations"] == 0 and k["real_s"] == pytest.approx(0.05)
