"""The concurrency benchmark's check that replies under load equal the replies alone (pure)."""
from __future__ import annotations

import pytest

from bench.concurrency import first_difference
from bench.sessions import TOPICS, script

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


@pytest.fixture(autouse=True)
def services_in_tmp(monkeypatch, tmp_path):
    """The stacks these tests fake leave no directory behind in the system's temp dir."""
    from bench import concurrency
    monkeypatch.setattr(concurrency, "services_dir", lambda args, label: tmp_path / label)


def test_first_difference_names_the_conversation_and_turn():
    want = {"a": ["x", "y"], "b": ["z"]}
    assert first_difference(want, {"a": ["x", "y"], "b": ["z"]}) == []
    diff = first_difference(want, {"a": ["x", "Y"], "b": []})
    assert diff == ["a turn 2: expected 'y', got 'Y'", "b turn 1: expected 'z', got '(no reply)'"]


def test_session_scripts_repeat_every_len_topics():
    assert script(0, 3) == script(len(TOPICS), 3)
    assert script(0, 3) != script(1, 3)
    assert len(script(2, 1)) == 1


def test_every_level_works_through_the_same_mix_of_conversations():
    from bench.concurrency import workload
    assert workload(1, 8, 3) == list(range(8))        # one session runs each once, one after the other
    assert workload(8, 8, 3) == list(range(8)) * 3
    assert workload(32, 8, 3) == list(range(8)) * 12  # at least three per session
    assert workload(3, 8, 1) == list(range(8))
    assert workload(2, 2, 1) == [0, 1]


def _figures(tokens_per_s: float) -> dict:
    return {"ttft_ms": {"mean": 100.0, "p50": 90.0, "p99": 200.0},
            "tbt_ms": {"mean": 50.0, "p50": 50.0, "p99": 60.0},
            "output_tokens_per_s": tokens_per_s, "gateway_ms_mean": 5.0, "engine_ms_mean": 100.0,
            "restore_hit_rate": 1.0, "preemptions": {}, "replies_identical_to_alone": 1.0,
            "cpu_cores": {"compute": 1.0}}


def test_a_failed_level_is_reported_with_its_error_not_dropped(monkeypatch, tmp_path):
    import contextlib
    import types

    from bench import concurrency, sessions

    @contextlib.contextmanager
    def fake_stack(*args, **kwargs):
        yield types.SimpleNamespace(frontend="x", token=lambda user: user,
                                    agent_stats=lambda: types.SimpleNamespace(hits=0, misses=0))

    def fake_level(stack, n, args, reference, users):
        if n == 4:
            raise TimeoutError("the frontend did not answer")
        if n == 8:
            errors = ["conversation 3 (u9): ChatFailed: 503"]
            return {"errors": errors}, errors
        return _figures(10.0 * n), []

    monkeypatch.setattr(concurrency, "Stack", fake_stack)
    monkeypatch.setattr(concurrency, "run_level", fake_level)
    monkeypatch.setattr(concurrency, "plot", lambda result, out: None)
    monkeypatch.setattr(sessions, "run_session", lambda *a, **k: [types.SimpleNamespace(reply="hi")])
    args = concurrency.parse_args(["--levels", "1", "2", "4", "8", "--out", str(tmp_path),
                                   "--placements", "shared"])
    result, _ = concurrency.run(args)
    assert [f["part"] for f in result["failed"]] == ["shared: 4 sessions", "shared: 8 sessions"]
    assert result["failed"][0]["error"] == "TimeoutError: the frontend did not answer"
    assert result["results"]["levels"]["4"] == {"failed": "TimeoutError: the frontend did not answer"}
    assert set(result["ratios"]) >= {"tokens_per_s_2_vs_1"} and "tokens_per_s_4_vs_1" not in result["ratios"]
    rows = {line.split()[0]: line for line in concurrency.report(result).splitlines()[4:8]}
    assert "failed: TimeoutError: the frontend did not answer" in rows["4"]
    assert "failed: RuntimeError: 1 conversations failed" in rows["8"]


def test_both_placements_run_in_one_run_each_in_its_stack_and_are_compared(monkeypatch, tmp_path):
    import contextlib
    import types

    from bench import concurrency, placements, results, sessions

    started = []

    @contextlib.contextmanager
    def fake_stack(*args, placement, **kwargs):
        if placement == "nic" and len(started) > 1:
            raise RuntimeError("the agent did not start")
        started.append(placement)
        cpus = {"shared": {"compute": "0-1", "smartnic": "0-1"}, "nic": {"compute": "0", "smartnic": "1"}}
        results.record_placement(placement, cpus[placement], 1)
        yield types.SimpleNamespace(frontend="x", token=lambda user: user,
                                    agent_stats=lambda: types.SimpleNamespace(hits=0, misses=0))

    speed = {"shared": 10.0, "nic": 15.0}
    monkeypatch.setattr(concurrency, "Stack", fake_stack)
    monkeypatch.setattr(concurrency, "run_level",
                        lambda stack, n, *a: (_figures(speed[started[-1]] * n), []))
    monkeypatch.setattr(concurrency, "plot", lambda result, out: None)
    monkeypatch.setattr(sessions, "run_session", lambda *a, **k: [types.SimpleNamespace(reply="hi")])
    assert placements.default_placements([0, 1]) == ["shared", "nic"]
    assert placements.default_placements([0]) == ["shared"]
    args = concurrency.parse_args(["--levels", "1", "2", "--out", str(tmp_path),
                                   "--placements", "shared", "nic"])
    result, _ = concurrency.run(args)
    assert started == ["shared", "nic"] and result["failed"] == []
    by = result["results"]["by_placement"]
    assert list(by) == ["shared", "nic"]
    assert by["nic"]["placement"]["cpus"] == {"compute": "0", "smartnic": "1"}
    assert [p["name"] for p in result["machine"]["placement"]] == ["shared", "nic"]
    assert result["results"]["levels"] == by["shared"]["results"]["levels"]  # the first placement's keys
    assert result["ratios"]["tokens_per_s_2_vs_1"] == result["ratios"]["tokens_per_s_2_vs_1@nic"] == 2.0
    assert result["ratios"]["tokens_per_s_2@nic_vs_shared"] == 1.5
    text = concurrency.report(result)
    assert "== placement nic: compute 0, smartnic 1; torch threads 1" in text
    assert text.splitlines()[-1].split() == ["tokens_per_s_2_vs_1", "2", "2", "1"]
    # a placement that does not start is reported failed, with its plan's CPUs, and the other still runs
    started.clear()
    started.append("x")  # the next nic start raises
    result, _ = concurrency.run(args)
    assert [f["part"] for f in result["failed"]] == ["nic"]
    nic = result["machine"]["placement"][1]
    assert nic | {"cpus": None} == {"name": "nic", "cpus": None, "torch_threads": None, "started": False}
    assert "FAILED nic: RuntimeError: the agent did not start" in concurrency.report(result)


def test_each_kv_dtype_runs_in_stacks_of_its_own_and_is_compared_with_the_first(monkeypatch, tmp_path):
    import contextlib
    import types

    from bench import concurrency, results, sessions

    started = []

    @contextlib.contextmanager
    def fake_stack(directory, config, *args, placement, **kwargs):
        started.append((placement, config["compute"]["kv_dtype"]))
        results.record_placement(placement, {"compute": "0-1", "smartnic": "0-1"}, 1)
        yield types.SimpleNamespace(frontend="x", token=lambda user: user,
                                    agent_stats=lambda: types.SimpleNamespace(hits=0, misses=0))

    speed = {"float32": 10.0, "bfloat16": 12.0}
    monkeypatch.setattr(concurrency, "Stack", fake_stack)
    monkeypatch.setattr(concurrency, "run_level", lambda stack, n, *a: (_figures(speed[started[-1][1]] * n), []))
    monkeypatch.setattr(concurrency, "plot", lambda result, out: None)
    monkeypatch.setattr(sessions, "run_session", lambda *a, **k: [types.SimpleNamespace(reply="hi")])
    args = concurrency.parse_args(["--levels", "1", "2", "--out", str(tmp_path), "--placements", "shared",
                                   "--kv-dtypes", "float32", "bfloat16"])
    result, _ = concurrency.run(args)
    assert started == [("shared", "float32"), ("shared", "bfloat16")] and result["failed"] == []
    assert list(result["results"]["by_kv_dtype"]) == ["float32", "bfloat16"]
    assert result["results"]["levels"]["2"]["output_tokens_per_s"] == 20.0  # the first dtype's, as before
    assert result["ratios"]["tokens_per_s_2@shared@bfloat16_vs_float32"] == pytest.approx(1.2)
    assert result["ratios"]["tokens_per_s_2_vs_1@bfloat16"] == 2.0
    text = concurrency.report(result)
    assert "KV pool dtype bfloat16" in text and "tokens_per_s_2@shared@bfloat16_vs_float32" in text
    from bench.results import dumps
    assert "by_kv_dtype" in dumps(result)  # it is written as JSON: no cycle
    with pytest.raises(SystemExit):
        concurrency.parse_args(["--kv-dtypes", "float16"])
