"""The pure parts of `bench.trigger` (its run is `kvtb bench smartnic`'s, in test_smoke.py): figures, text."""
from bench import trigger
from bench.results import floors


def scene(p50: float, p99: float) -> dict:
    return {"stores": 100, "p50_us": p50, "p99_us": p99, "max_us": p99 * 2, "mean_us": p50, "refused": 0}


RESULT = {"idle": scene(12.0, 80.0), "load": scene(30.0, 900.0),
          "watcher_cpu": {"warm_core_share": 0.25, "idle_core_share": 0.004}}


def test_figures_name_each_scene_and_percentile_and_the_ceilings_judge_them():
    figures = trigger.figures(RESULT)
    assert figures == {"trigger_to_fire_idle_p50_us": 12.0, "trigger_to_fire_idle_p99_us": 80.0,
                       "trigger_to_fire_load_p50_us": 30.0, "trigger_to_fire_load_p99_us": 900.0}
    judged = floors(figures, {}, at_most=trigger.TRIGGER_CEILINGS)
    assert {k for k, f in judged.items() if not f["met"]} == {"trigger_to_fire_load_p99_us"}
    assert set(judged) == set(trigger.TRIGGER_CEILINGS)


def test_text_gives_both_scenes_and_the_watchers_cpu():
    first, second = trigger.text(RESULT).splitlines()
    assert "idle p50 12 µs, p99 80 µs, max 160 µs (100 stores)" in first
    assert "load p50 30 µs, p99 900 µs" in first
    assert second == "watcher CPU (Python poll), share of a core: warm 25.0%, idle 0.4%"
    compiled = {**RESULT, "watcher_cpu": {**RESULT["watcher_cpu"], "compiled": True}}
    assert trigger.text(compiled).splitlines()[1].startswith("watcher CPU (compiled poller, doorbell)")
    assert trigger.text({**RESULT, "watcher_cpu": {}}).splitlines()[1].endswith("warm -, idle -")


def test_the_suite_headline_gives_both_scenes():
    from bench.suite import _trigger_to_fire
    assert _trigger_to_fire({"results": {"trigger_to_fire": RESULT}}) == "idle p50 12 µs, p99 80 µs; load p50 30 µs, p99 900 µs"
    assert _trigger_to_fire({"results": {}}) is None


def test_the_python_poll_beside_the_compiled_poller_gives_a_third_line_and_the_cpu_ratio():
    compiled = {**RESULT, "watcher_cpu": {"warm_core_share": 0.005, "idle_core_share": 0.007, "compiled": True}}
    both = {**compiled, "python_poll": {**RESULT, "idle": scene(110.0, 900.0)}}
    lines = trigger.text(both).splitlines()
    assert len(lines) == 3 and lines[1].startswith("watcher CPU (compiled poller, doorbell)")
    assert lines[2] == ("the same with the Python poll: idle p50 110 µs, p99 900 µs; load p50 30 µs, p99 900 µs; "
                        "CPU warm 25.0%, idle 0.4%")
    assert trigger.cpu_ratio(both) == 0.25 / 0.005
    assert trigger.cpu_ratio(compiled) is None and trigger.cpu_ratio(RESULT) is None
    assert len(trigger.text(compiled).splitlines()) == 2


def test_text_splits_the_fire_where_it_was_measured():
    scene = {**RESULT["idle"], "mean_seen_us": 91.4, "mean_issue_us": 30.2}
    first = trigger.text({**RESULT, "idle": scene}).splitlines()[0]
    assert "(100 stores; mean 91 µs to be seen, 30 µs to issue)" in first
