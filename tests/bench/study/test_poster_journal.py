"""The poster study in sittings (bench.study.poster_journal): every finished point kept in a journal, a
resumed run runs only the rest and reports the same points, other settings or another D are refused, and
every sitting's pacing counts (pure: a runner that makes batches up; the file in tmp_path)."""
from __future__ import annotations

import json
import stat

import pytest

from bench.study import overhead as ov, poster, poster_journal as journals
from bench.study.poster_points import Points
from bench.study.poster_runner import Workload


class Progress:
    def update(self, *a, **k):
        pass


class FakeRunner:
    """Batches made up from their arguments (the same batch every time it is asked for); counts them."""

    def __init__(self, fail_strategy_pool: int | None = None):
        self.batches, self.configs, self.fail_pool = 0, [], fail_strategy_pool
        self.pool = None

    def configure(self, pool, bt, preemption, seqs, context):
        self.configs.append((pool, bt, preemption))
        self.pool = pool

    def batch(self, w, policy, tag, repeat=0):
        if self.pool == self.fail_pool:
            raise RuntimeError("the compute node went away")
        self.batches += 1
        span = w.requests * (w.input_tokens + w.output_tokens) / (self.pool or 1) + repeat * 0.01
        return {"makespan_s": span, "cpu_s": span * 1.5, "e2e_s": [span], "mean_e2e_s": span, "tokens": 4,
                "tokens_per_s": 4 / span, "preemptions": {"recompute": 1}, "preempted_tokens": {"recompute": 8},
                "counters": {"preempt_recompute_tokens": 8}, "engine_total_s": 0.1, "engine_recompute_s": 0.1,
                "engine_swap_s": 0.0, "engine_blocking_s": 0.1, "throughput": [[0.0, 1.0]],
                "samples": [[0.0, 0.5, 1, 0, 0]]}


M = poster.MODES["quick"]


def study() -> dict:
    return {"study": "poster", "failed": []}


def sweep(runner, kept=None, on_done=None, st=None):
    points = Points(st or study(), runner, Progress(), M.repeats, poster.planned(M), kept, on_done)
    return poster.sweep(points, M)


def fp(**over):
    base = dict(mode="quick", mode_sizes={"a": [1, 2]}, profile="polaris-a100", repeats=3, placement="shared",
                torch_threads=0, prefix_cache=False)
    return journals.fingerprint(**{**base, **over})


def test_keys_go_to_json_and_back():
    w = Workload(16, 48, 24)
    for key in (("ample", w, 16), (w, 64, 0.3, "swap-host")):
        assert journals.decode_key(json.loads(json.dumps(journals.encode_key(key)))) == key
    for bad in (["ample", [1, 2], 16], ["point", [1, 2, 3], 16], ["other", [1, 2, 3], 1], None, "x"):
        with pytest.raises(journals.JournalError):
            journals.decode_key(bad)


def test_a_resumed_sweep_runs_only_what_the_first_did_not_finish_and_reports_the_same_points(tmp_path):
    journal = journals.new(fp(), 77.0, "auto: gpu_step", None)
    s1 = journals.start_sitting(journal, "abc", "t1", "kvtb study poster --quick")
    stop_after = 5  # the first sitting is stopped once it kept 5 points and baselines

    class Stopped(BaseException):
        pass

    def on_done(key, value):
        journals.keep(journal, key, value, s1)
        journals.save(tmp_path, journal)
        if len(journal["points"]) == stop_after:
            raise Stopped

    first = FakeRunner()
    with pytest.raises(Stopped):
        sweep(first, on_done=on_done)
    whole = FakeRunner()
    expected = sweep(whole)
    assert 0 < first.batches < whole.batches

    again = journals.load(tmp_path)
    journals.check(again, fp(), None)
    assert len(journals.done(again)) == stop_after and journals.batches(again) == first.batches
    s2 = journals.start_sitting(again, "def", "t2", "kvtb study poster --quick --resume")
    second = FakeRunner()
    got = sweep(second, journals.done(again), lambda k, v: journals.keep(again, k, v, s2))
    # none run twice, none left out: the two sittings' batches are the whole run's, and the points the same
    assert first.batches + second.batches == whole.batches == poster.count_runs(M)
    assert json.loads(json.dumps(got)) == json.loads(json.dumps(expected))
    assert [s["points"] for s in journals.summary(again)] == [stop_after, len(journals.done(again)) - stop_after]


def test_a_failed_point_is_not_kept_and_runs_again_on_resume():
    journal = journals.new(fp(), 1.0, "", None)
    s1 = journals.start_sitting(journal, "abc", "t1", "cmd")
    st = study()
    tight = min(ov.pool_for_share(share, w.requests, w.input_tokens, w.output_tokens, bt)
                for w, bt, share in poster.plan(M))  # the tightest pool's point fails
    res = sweep(FakeRunner(fail_strategy_pool=tight), on_done=lambda k, v: journals.keep(journal, k, v, s1), st=st)
    assert st["failed"]  # recorded on the page, and not in the journal
    assert None not in journals.done(journal).values()
    s2 = journals.start_sitting(journal, "abc", "t2", "cmd --resume")
    retry = FakeRunner()
    again = sweep(retry, journals.done(journal), lambda k, v: journals.keep(journal, k, v, s2))
    assert retry.batches == M.repeats * len(st["failed"])
    assert all(r for fig in ("fig5", "fig2", "fig4") for by in again[fig].values() for r in by.values())
    assert any(r is None for fig in ("fig5", "fig2", "fig4") for by in res[fig].values() for r in by.values())


def test_a_journal_made_in_other_settings_or_at_another_d_is_refused():
    journal = journals.new(fp(), 77.0, "auto", None)
    journals.check(journal, fp(), None)
    journals.check(journal, fp(), 77)
    for over in ({"mode": "full"}, {"repeats": 1}, {"profile": None}, {"placement": "nic"}, {"torch_threads": 1},
                 {"mode_sizes": {"a": [1, 3]}}, {"prefix_cache": True}):
        with pytest.raises(journals.JournalError, match="other settings"):
            journals.check(journal, fp(**over), None)
    with pytest.raises(journals.JournalError, match="D = 77"):
        journals.check(journal, fp(), 50.0)
    with pytest.raises(journals.JournalError, match="version"):
        journals.check({**journal, "version": 99}, fp(), None)


def test_every_sittings_pacing_counts_and_the_journal_is_private(tmp_path):
    journal = journals.new(fp(), 3.0, "given", None)
    for n in (2, 5):
        i = journals.start_sitting(journal, "c", "t", "cmd")
        journal["sittings"][i]["pacing"] = [{"kinds": {"gpu_step": {"ops": n, "violations": 1}}}, {}]
        journal["sittings"][i]["restarts_s"] = [1.0] * n
    assert [p["kinds"]["gpu_step"]["ops"] for p in journals.pacing(journal)] == [2, 5]
    assert journals.restarts_s(journal) == [1.0] * 7
    out = tmp_path / "poster"
    path = journals.save(out, journal)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(out.stat().st_mode) == 0o700
    assert journals.load(out) == json.loads(json.dumps(journal))
    assert not (out / (journals.NAME + ".tmp")).exists()
    assert journals.load(tmp_path / "none") is None
    path.write_text("{not json")
    with pytest.raises(journals.JournalError, match="not JSON"):
        journals.load(out)


def test_resume_is_a_flag_of_the_poster_and_of_study_all_s_poster_step(tmp_path):
    args = poster.parse_args(["--quick", "--resume", "--out", str(tmp_path)])
    assert args.resume and args.journal is None  # nothing there yet: a first sitting
    journals.save(tmp_path, journals.new(args.fingerprint, 1.0, "", None))
    assert poster.parse_args(["--quick", "--resume", "--out", str(tmp_path)]).journal is not None
    with pytest.raises(SystemExit):  # made in quick mode, resumed in full
        poster.parse_args(["--resume", "--out", str(tmp_path)])
    from bench.study import all as study_all
    assert [s.name for s in study_all.STEPS if s.resumable] == ["poster"]
