"""The fairness benchmark's figures and ratios (pure), and its command."""
from __future__ import annotations

import pytest

import math

from bench.fairness import Turn, add_ratios, parse_args, phase_figures, table
from bench.results import new_result
from chat_frontend.settings import FrontendSettings
from kvtb.cli import COMMANDS

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def turns(*ttfts: float, refused: int = 0) -> list[Turn]:
    return [Turn("ok", t, t / 2, t * 3) for t in ttfts] + [Turn("RESOURCE_EXHAUSTED")] * refused


def test_phase_figures_count_served_and_summarize_served_turns_only():
    f = phase_figures(turns(100.0, 300.0, 200.0, refused=2))
    assert (f["attempted"], f["served"]) == (5, 3)
    assert f["statuses"] == {"RESOURCE_EXHAUSTED": 2, "ok": 3}
    assert f["client_ttft_ms"]["p50"] == 200.0 and f["ttft_ms"]["p50"] == 100.0
    assert "client_ttft_ms" not in phase_figures(turns(refused=3))


def result_of(alone: list[Turn], loaded: list[Turn]) -> dict:
    args = parse_args(["--smoke"])
    result = new_result("fairness", {"greedy_streams": args.greedy_streams, "frontend": {
        "max_concurrent_turns": 64, "max_waiting_turns": 32, "user_max_concurrent_turns": 8,
        "user_max_waiting_turns": 8, "user_max_queued_prompt_tokens": 16384}})
    result["results"] = {"alone": phase_figures(alone), "loaded": phase_figures(loaded),
                         "greedy": {"streams": 16, "served": 40, "refused": {"RESOURCE_EXHAUSTED": 9}}}
    add_ratios(result)
    return result


def test_ratios_and_the_target_from_one_run():
    met = result_of(turns(300.0, 310.0, 320.0), turns(400.0, 500.0, 600.0))
    assert met["ratios"]["modest_served_loaded"] == 1.0
    assert math.isclose(met["ratios"]["modest_ttft_p50_loaded_vs_alone"], 500 / 310)
    assert met["floors"]["modest_ttft_p50_loaded_vs_alone"] == {"ceiling": 2.0, "value": 500 / 310, "met": True}
    assert met["floors"]["modest_served_loaded"]["met"]
    starved = result_of(turns(300.0, 300.0), turns(4200.0, refused=4))
    assert math.isclose(starved["ratios"]["modest_served_loaded"], 0.2)
    assert not starved["floors"]["modest_served_loaded"]["met"]
    assert not starved["floors"]["modest_ttft_p50_loaded_vs_alone"]["met"]
    text = table(starved)
    assert "1/5" in text and "4200" in text and "40 turns served" in text


def test_a_run_without_both_phases_has_no_ratio():
    result = new_result("fairness", {})
    result["results"] = {"alone": phase_figures(turns(1.0))}
    add_ratios(result)
    assert result["ratios"] == {}


def test_defaults_are_the_frontends_settings_and_the_command_is_wired():
    args = parse_args([])
    defaults = FrontendSettings()
    assert args.greedy_streams == 130 and args.user_max_concurrent_turns == defaults.user_max_concurrent_turns
    assert args.max_waiting_turns == defaults.max_waiting_turns
    assert parse_args(["--smoke"]).greedy_streams == 16
    assert COMMANDS[("bench", "fairness")] == "bench.fairness:main"


def test_long_prompt_mode_reports_the_prefill_rate_alone_and_beside_and_the_3x_target():
    from bench.fairness import prefill_rate
    done = [Turn("ok", 1.0, 1.0, 1.0, 7000, 110.0), Turn("ok", 1.0, 1.0, 1.0, 7000, 114.0), Turn("CANCELLED")]
    assert prefill_rate(done, 100.0) == 14000 / 14.0 and prefill_rate([Turn("CANCELLED")], 0.0) is None
    args = parse_args(["--long-prompt-tokens", "7000", "--greedy-streams", "12"])
    assert args.long_prompt_tokens == 7000 and args.long_alone_prompts == 2 and args.step_target_s == 0.25
    result = new_result("fairness", {"greedy_streams": 12, "long_prompt_tokens": 7000, "step_target_s": 0.25,
                                     "frontend": {"max_concurrent_turns": 256, "max_waiting_turns": 256,
                                                  "user_max_concurrent_turns": 2, "user_max_waiting_turns": 0,
                                                  "user_max_queued_prompt_tokens": 0}})
    result["results"] = {"alone": phase_figures(turns(280.0, 300.0)), "loaded": phase_figures(turns(700.0, 800.0)),
                         "greedy": {"streams": 12, "served": 2, "refused": {}},
                         "long": {"prompts": 2, "prompt_tokens": [7030] * 4, "alone_tokens_per_s": 200.0,
                                  "beside_tokens_per_s": 80.0}}
    add_ratios(result)
    assert result["ratios"]["long_prefill_tokens_per_s_beside_vs_alone"] == 0.4
    assert result["floors"]["modest_ttft_p50_loaded_vs_alone"] == {"ceiling": 3.0, "value": 750 / 290, "met": True}
    text = table(result)
    assert "prompts of ~7000 tokens" in text and "alone 200, beside the modest user 80" in text
