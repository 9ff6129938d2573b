"""`kvtb bench aiperf`'s pure parts: AIPerf's command line, its export read, the ratios and targets."""
from __future__ import annotations

import pytest

import json

from bench import aiperf

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

# the parts of an AIPerf 0.13 profile_export_aiperf.json the bench reads (values of a run of the old
# admission: 58 of 64 refused with 429)
EXPORT = {
    "request_count": {"unit": "requests", "avg": 6.0},
    "completed_request_count": {"unit": "requests", "avg": 64.0},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 4.74},
    "time_to_first_token": {"unit": "ms", "avg": 900.0, "p50": 640.0},
    "request_latency": {"unit": "ms", "avg": 9000.0, "p50": 8000.0},
    "error_summary": [{"error_details": {"code": 429, "type": "Too Many Requests", "message": "{...}"},
                       "count": 58}],
}


def test_a_level_reads_served_refused_and_throughput_from_the_export():
    f = aiperf.level_figures(EXPORT)
    assert (f["completed"], f["ended"], f["errors"], f["refused"]) == (6.0, 64.0, 58, 58)
    assert f["output_tokens_per_s"] == 4.74 and f["ttft_ms_p50"] == 640.0
    clean = aiperf.level_figures({**EXPORT, "request_count": {"avg": 64.0}, "error_summary": []})
    assert clean["refused"] == clean["errors"] == 0 and clean["completed"] == 64.0


def test_aiperf_runs_one_key_fixed_lengths_greedy_and_streamed(tmp_path):
    args = aiperf.parse_args(["--aiperf", "/opt/aiperf/bin/aiperf"])
    assert args.levels == [1, 32] and (args.requests, args.isl, args.osl) == (64, 128, 32)
    argv = aiperf.aiperf_argv(args, "http://127.0.0.1:8000", "tok", 32, tmp_path)
    flag = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert argv[:2] == ["/opt/aiperf/bin/aiperf", "profile"] and "--streaming" in argv
    assert (flag["--concurrency"], flag["--request-count"], flag["--api-key"]) == ("32", "64", "tok")
    assert json.loads(flag["--extra-inputs"]) == {"ignore_eos": True, "min_tokens": 32, "temperature": 0}
    assert aiperf.aiperf_argv(args, "u", "t", 1, tmp_path)[argv.index("--request-count") + 1] == "8"


def test_the_tokenizer_goes_into_the_hugging_face_cache_layout(tmp_path):
    source = tmp_path / "model"
    source.mkdir()
    (source / "tokenizer.json").write_text("{}")
    home = aiperf.hf_cache(tmp_path / "hf", str(source))
    repo = home / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    assert (repo / "refs" / "main").read_text() == "kvtestbed"
    assert (repo / "snapshots" / "kvtestbed" / "tokenizer.json").read_text() == "{}"


def test_the_ratio_against_the_concurrency_bench_and_the_targets_from_one_run():
    result = {"results": {"levels": {"1": {**aiperf.level_figures({**EXPORT, "request_count": {"avg": 8.0},
                                                                  "error_summary": [],
                                                                  "output_token_throughput": {"avg": 10.0}}),
                                           "requests": 8},
                                     "32": {**aiperf.level_figures({**EXPORT, "request_count": {"avg": 64.0},
                                                                   "error_summary": [],
                                                                   "output_token_throughput": {"avg": 60.0}}),
                                            "requests": 64}},
                          "concurrency_bench": {"ratios": {"tokens_per_s_32_vs_1": 8.0}}},
              "ratios": {}}
    aiperf.add_ratios(result, [1, 32])
    r = result["ratios"]
    assert r["aiperf_tokens_per_s_32_vs_1"] == 6.0 and r["aiperf_vs_concurrency_bench"] == 0.75
    assert r["refused_top"] == 0 and r["completed_share_top"] == 1.0
    assert result["floors"]["aiperf_vs_concurrency_bench"]["met"] is False  # 0.75 < 0.8: the target can fail
    assert result["floors"]["refused_top"]["met"] is True
    refused = {"results": {"levels": {"1": result["results"]["levels"]["1"],
                                      "32": {**aiperf.level_figures(EXPORT), "requests": 64}}}, "ratios": {}}
    aiperf.add_ratios(refused, [1, 32])
    assert refused["ratios"]["refused_top"] == 58 and refused["ratios"]["completed_share_top"] < 1


def test_the_command_is_wired_and_says_so_when_aiperf_is_missing(tmp_path):
    from kvtb.cli import COMMANDS
    assert COMMANDS[("bench", "aiperf")] == "bench.aiperf:main"
    args = aiperf.parse_args(["--aiperf", str(tmp_path / "no-aiperf"), "--out", str(tmp_path)])
    result = aiperf.run(args)
    assert result["failed"] and "no AIPerf command" in result["failed"][0]["error"]
    assert result["results"]["levels"] == {} and result["ratios"] == {}


def test_aiperfs_own_requests_are_replayed_fresh(tmp_path):
    body = {"messages": [{"role": "user", "content": "Thou shalt"}], "max_completion_tokens": 32,
            "ignore_eos": True, "stream": True}
    (tmp_path / "c32").mkdir()
    (tmp_path / "c32" / "inputs.json").write_text(json.dumps(
        {"data": [{"session_id": "s0", "payloads": [body]}, {"session_id": "s1", "payloads": [body, body]}]}))
    payloads = aiperf.payloads_of(tmp_path / "c32")
    assert payloads == [body] * 3
    again = aiperf.fresh(body)
    assert again["messages"][0]["content"] == "(again) Thou shalt" and body["messages"][0]["content"] == "Thou shalt"
    assert {k: v for k, v in again.items() if k != "messages"} == {k: v for k, v in body.items() if k != "messages"}
