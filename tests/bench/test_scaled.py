"""`--profile` for the benchmarks and studies: the environment a run's services inherit, the deadlines it
stretches, its record; and nothing at all without it."""
from __future__ import annotations

import argparse
import time

import pytest

from bench import scaled
from scale import dilation as dl
from scale import paced
from scale import settings as scale_settings


def parser():
    return scaled.add_profile_args(argparse.ArgumentParser())


def test_without_a_profile_nothing_is_set_and_nothing_is_paced():
    p = parser()
    args = p.parse_args([])
    assert scaled.check(p, args) is None and args.dilation_value is None
    assert dl.current() is None and not paced.active()
    assert paced.ticket("nvme_write", 1 << 20) is None and paced.step_ticket([(0, 512)]) is None
    start = time.perf_counter()
    paced.wait(None)
    paced.finish(None, lambda: None)
    assert time.perf_counter() - start < 0.01
    assert dl.pacing_json() == ""  # what every service's Stats reports in real time


def test_a_bad_profile_or_dilation_is_a_parser_error_naming_it(capsys):
    p = parser()
    with pytest.raises(SystemExit):
        scaled.check(p, p.parse_args(["--profile", "nope"]))
    assert "no hardware profile 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scaled.check(p, p.parse_args(["--profile", "paper", "--dilation", "0.5"]))
    assert "dilation must be between 1" in capsys.readouterr().err
    args = p.parse_args(["--profile", "paper", "--dilation", "40"])
    assert scaled.check(p, args).name == "paper" and args.dilation_value == 40.0


def test_apply_sets_what_the_services_inherit_and_clear_takes_it_back():
    env: dict[str, str] = {}
    try:
        pacer = scaled.apply("polaris-a100", 25.0, environ=env)
        assert env["KVTB_SCALE_PROFILE"] == "polaris-a100" and float(env["KVTB_SCALE_DILATION"]) == 25.0
        assert env["KVTB_SCALE_REAL_KV_BYTES_PER_TOKEN"] == str(scaled.SMOLLM2_KV_BYTES_PER_TOKEN)
        assert float(env["KVTB_SMARTNIC_GET_TIMEOUT_S"]) == 3.0 * 25  # deadlines stretched by D
        assert float(env["KVTB_SMARTNIC_DISCOVERY_TIMEOUT_S"]) == 25.0  # ... within their caps
        assert dl.current() is pacer and pacer.dilation == 25.0 and paced.active()
        assert scale_settings.current_profile().name == "polaris-a100"
    finally:
        scaled.clear(env)
    assert env == {} and dl.current() is None and not paced.active()


def test_the_record_says_profile_d_and_the_kinds_over_one_percent():
    from scale import profile as pf
    snaps = [{"kinds": {"gpu_step": {"ops": 100, "violations": 2, "real_s": 1, "modeled_s": 1, "overrun_s": 0.1,
                                     "worst_ratio": 3}}},
             {"kinds": {"nvme_write": {"ops": 10, "violations": 0, "real_s": 1, "modeled_s": 2, "overrun_s": 0,
                                       "worst_ratio": 0.5}}}]
    rec = scaled.record(pf.load("polaris-a100"), 40.0, snaps, "given")
    assert rec["dilation"] == 40.0 and rec["times"] == "virtual (wall / D)"
    assert rec["pacing"]["ops"] == 110 and rec["pacing"]["violations"] == 2
    assert rec["invalid_kinds"] == ["gpu_step"]  # 2% of its operations


def test_a_study_refuses_a_profile_it_cannot_run_under(capsys):
    """A study whose parser kept no profile object (it does not take one) exits 2 before running."""
    from bench.study.report import main_of

    def parse(argv):
        return argparse.Namespace(profile="paper", profile_obj=None)

    def never(args):
        raise AssertionError("a study refused must not run")
    assert main_of(parse, never)([]) == 2
    assert "does not take --profile" in capsys.readouterr().err


@pytest.mark.parametrize("study", ["paper", "poster", "scalellm", "eviction"])
def test_every_study_takes_a_profile(study):
    import importlib
    module = importlib.import_module(f"bench.study.{study}")
    args = module.parse_args(["--smoke", "--profile", "polaris-a100", "--dilation", "3", "--out", "/tmp/kvtb-never"])
    assert args.profile_obj.name == "polaris-a100" and args.dilation_value == 3.0


def test_the_virtual_clock_runs_at_one_over_d_and_is_put_back():
    real = time.perf_counter
    with scaled.virtual_clock(4.0):
        a, m = time.perf_counter(), time.monotonic()
        time.sleep(0.2)
        elapsed, elapsed_mono = time.perf_counter() - a, time.monotonic() - m
        pacer = dl.Pacer(4.0)
        assert pacer.clock is real   # a pacer keeps the wall clock
    assert 0.045 <= elapsed <= 0.1 and 0.045 <= elapsed_mono <= 0.1   # 0.2 s of wall time / 4
    assert time.perf_counter is real
    with scaled.virtual_clock(1.0):
        assert time.perf_counter is real


def test_a_benchmark_says_its_scale_model_first():
    assert scaled.scale_line(None) == ""
    line = scaled.scale_line({"profile": "polaris-a100", "dilation": 40.0, "dilation_chosen": "given",
                              "pacing": {"ops": 10, "violations": 1}, "invalid_kinds": ["gpu_step"]})
    assert line.startswith("under hardware profile `polaris-a100`: times are virtual (wall / D), D = 40")
    assert "1 of 10 paced operations" in line and "kinds over 1%: gpu_step" in line
