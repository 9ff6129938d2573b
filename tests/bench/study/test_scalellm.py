"""`kvtb study scalellm`: the per-level figures, ratios, claims and headline rows on hand-made numbers,
and a --smoke run's JSON contract (slow: real services, the tiny model)."""
from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest

from bench.study import scalellm
from bench.study.scalellm import RequestRecord, headline_rows, level_figures
from bench.study.claims import VERDICTS
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def ok(ttft: float, e2e: float, tokens: int, engine_ms: float | None = None,
       frontend_e2e_ms: float | None = None, client: int = 0) -> RequestRecord:
    gateway = None if engine_ms is None else frontend_e2e_ms - engine_ms
    return RequestRecord(client, "ok", e2e, ttft_s=ttft, tokens=tokens, prompt_tokens=40, user="u1",
                         session_id="c", engine_ms=engine_ms, frontend_e2e_ms=frontend_e2e_ms,
                         gateway_ms=gateway)


def test_tbt_is_the_average_wait_per_token_after_the_first():
    assert scalellm.tbt_s(ok(0.1, 1.1, 11)) == pytest.approx(0.1)
    assert scalellm.tbt_s(ok(0.1, 0.1, 1)) is None                  # one token: no gap
    assert scalellm.tbt_s(RequestRecord(0, "timeout", 60.0)) is None


def test_a_request_that_ended_after_the_timeout_is_a_timeout():
    assert scalellm.classify(ok(1.0, 61.0, 4), 60.0) == "timeout"
    assert scalellm.classify(ok(1.0, 59.0, 4), 60.0) == "ok"
    assert scalellm.classify(RequestRecord(0, "error", 0.1, error="HTTP 429"), 60.0) == "error"


def test_level_figures_count_timeouts_and_errors_beside_the_completed_requests():
    records = [ok(0.1, 1.1, 11, 900.0, 1000.0), ok(0.2, 2.2, 11, 1800.0, 2000.0),
               ok(0.3, 3.3, 11, 2700.0, 3000.0), ok(0.4, 4.4, 11),          # no summary found for this one
               RequestRecord(1, "timeout", 60.0), ok(1.0, 70.0, 11),       # ended past the timeout
               RequestRecord(1, "error", 0.05, error="ChatFailed: HTTP 429")]
    f = level_figures(records, wall_s=80.0, timeout_s=60.0)
    assert (f["requests"], f["completed"], f["timeouts"], f["errors"]) == (7, 4, 2, 1)
    assert f["timeout_share"] == pytest.approx(2 / 7)
    assert f["error_examples"] == ["ChatFailed: HTTP 429"]
    # TTFT over the completed: 100, 200, 300, 400 ms; type-7 percentiles
    assert f["ttft_ms"]["p50"] == pytest.approx(250.0)
    assert f["ttft_ms"]["p99"] == pytest.approx(397.0)                 # rank 2.97: 300 + 0.97 * 100
    # timed-out requests too: at their first text (1 s), or at the timeout when none came (60 s)
    assert f["ttft_ms_incl_timeouts"]["n"] == 6
    assert f["ttft_ms_incl_timeouts"]["max"] == pytest.approx(60000.0)
    assert f["timeouts_with_first_text"] == 1
    assert f["tbt_ms"]["p50"] == pytest.approx(250.0)    # (e2e - ttft) / 10: 100, 200, 300, 400 ms
    assert f["output_tokens"] == 44 and f["output_tokens_per_s"] == pytest.approx(44 / 80.0)
    # engine and gateway over the three with a summary: engine 1800, gateway 200, client e2e 2200
    assert f["summaries"] == 3
    assert f["engine_ms_mean"] == pytest.approx(1800.0) and f["gateway_ms_mean"] == pytest.approx(200.0)
    assert f["gateway_share"] == pytest.approx(0.1)
    assert f["client_gateway_ms_mean"] == pytest.approx(400.0)
    assert f["client_side_ms_mean"] == pytest.approx(200.0)


def test_a_level_where_everything_timed_out_still_has_its_figures():
    f = level_figures([RequestRecord(k, "timeout", 60.0) for k in range(4)], wall_s=60.0, timeout_s=60.0)
    assert f["timeouts"] == 4 and f["completed"] == 0 and f["timeout_share"] == 1.0
    assert f["ttft_ms"] is None and f["tbt_ms"] is None and f["output_tokens_per_s"] == 0.0
    assert f["gateway_share"] is None
    with pytest.raises(ValueError):
        level_figures([], wall_s=0.0, timeout_s=60.0)


def test_the_clients_timeout_closes_a_slow_stream_and_keeps_what_came():
    from aiohttp import web

    from bench.openai_client import ChatTimedOut, chat

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Session-Id": "ctx-1"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (await request.json())["max_tokens"] > 1:
            await asyncio.sleep(1.5)  # the rest never comes in time
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def go():
        app = web.Application()
        app.add_routes([web.post("/v1/chat/completions", completions)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as session:
                quick = await chat(session, url, "t", "m", [{"role": "user", "content": "q"}], 1, timeout_s=5)
                with pytest.raises(ChatTimedOut) as slow:
                    await chat(session, url, "t", "m", [{"role": "user", "content": "q"}], 8, timeout_s=0.3)
                # without a timeout, as every other caller
                plain = await chat(session, url, "t", "m", [{"role": "user", "content": "q"}], 1)
        finally:
            await runner.cleanup()
        return quick, slow.value, plain

    quick, slow, plain = asyncio.run(go())
    assert (quick.text, quick.completion_tokens, quick.session_id) == ("Hi", 1, "ctx-1")
    assert plain.text == "Hi"
    assert slow.text == "Hi" and slow.session_id == "ctx-1" and 0 <= slow.ttft_s < 0.3


def test_prompts_are_deterministic_and_a_clients_requests_differ():
    assert scalellm.prompt_of(3) == scalellm.prompt_of(3)
    questions = [scalellm.prompt_of(i)[-1]["content"] for i in range(40)]
    assert len(set(questions)) == 40
    assert scalellm.prompt_of(0)[0] == {"role": "system", "content": scalellm.SYSTEM}


def test_modes_set_their_levels_requests_reply_lengths_and_repeats():
    full = scalellm.parse_args([])
    assert full.levels == [1, 2, 4, 8, 16, 32, 64, 128, 256]                  # ScaleLLM's 1 .. 256
    assert (full.max_tokens, full.timeout_s, full.repeats) == (512, 60.0, 3)   # the seed's replies and timeout
    assert full.requests_per_client == 3 and full.gateway_level == 16
    assert scalellm.settings_of(full)["gateway_max_tokens"] == 128          # its replies complete in time here
    quick = scalellm.parse_args(["--quick"])
    assert quick.levels == [1, 4, 16, 64] and quick.requests_per_client == 2 and quick.max_tokens == 32
    assert quick.repeats == 3 and quick.gateway_level == 16
    smoke = scalellm.parse_args(["--smoke", "--timeout-s", "5"])
    assert smoke.levels == [1, 2] and smoke.max_tokens == 4 and smoke.timeout_s == 5.0 and smoke.repeats == 1
    mine = scalellm.parse_args(["--levels", "8", "2", "--requests-per-client", "3", "--max-tokens", "7",
                                "--repeats", "4", "--gateway-level", "0"])
    assert (mine.levels, mine.requests_per_client, mine.max_tokens, mine.repeats, mine.gateway_level) == \
        ([2, 8], 3, 7, 4, 0)
    assert scalellm.users_needed(mine) == 1 + 10 * 4
    for bad in (["--levels", "0"], ["--repeats", "0"], ["--gateway-level", "-1"]):
        with pytest.raises(SystemExit):
            scalellm.parse_args(bad)


def test_the_stack_gives_grpc_turns_the_studys_system_prompt_and_every_level_a_place():
    config = scalellm.stack_config(scalellm.parse_args([]), 10)
    assert config["frontend"]["system_prompt"] == scalellm.SYSTEM
    assert config["frontend"]["max_concurrent_turns"] == 256
    assert config["frontend"]["max_new_tokens_cap"] >= 512 and len(config["frontend"]["users"]) == 10


# -- hand-made levels, each repeat its own figures -----------------------------------------------------

JITTER = (1.0, 1.01, 0.99)


def level(ttft_p50, tbt_p50, tps, engine, gateway, timeouts=0, requests=20, jitter=1.0):
    ttft, tbt = ttft_p50 * jitter, tbt_p50 * jitter
    return {"requests": requests, "completed": requests - timeouts, "timeouts": timeouts, "errors": 0,
            "timeout_share": timeouts / requests,
            "ttft_ms": {"n": 1, "mean": ttft, "p50": ttft, "p99": ttft * 2, "max": ttft * 3},
            "tbt_ms": {"n": 1, "mean": tbt, "p50": tbt, "p99": tbt * 2, "max": tbt * 3},
            "e2e_ms": {"n": 1, "mean": 5000.0, "p50": 5000.0, "p99": 9000.0, "max": 9500.0},
            "output_tokens_per_s": tps * jitter, "engine_ms_mean": engine, "gateway_ms_mean": gateway * jitter,
            "client_gateway_ms_mean": gateway * 1.5,
            "gateway_share": gateway * jitter / (gateway * jitter + engine),
            "client_gateway_share": gateway * 1.5 / (gateway * 1.5 + engine)}


def repeated(*args, repeats=3, **kwargs) -> dict:
    """A level's pooled figures (its first repeat's) with `repeats` slightly different repeats."""
    each = [level(*args, jitter=JITTER[r % 3], **kwargs) for r in range(repeats)]
    return {**each[0], "repeats": each}


def hand_made_study(levels: dict, failed: list | None = None, gateways: dict | None = None,
                    max_tokens: int = 512, profile: str = "") -> dict:
    settings = {"levels": sorted(int(c) for c in levels), "timeout_s": 60.0, "max_tokens": max_tokens,
                "model": "SmolLM2-135M", "replicas": [1]}
    if profile:
        settings["profile"] = profile
    results = {"levels": levels}
    if gateways:
        results["gateways"] = gateways
    return {"study": "scalellm", "machine": {"cores": 2}, "settings": settings, "results": results,
            "claims": [], "ratios": {}, "plots": [], "failed": failed or []}


def agreeing() -> dict:
    """Every claim's shape as the seed (or our reading of it) has it, under the H100 profile."""
    levels = {"1": repeated(100.0, 50.0, 10.0, 2000.0, 40.0), "4": repeated(150.0, 60.0, 35.0, 2000.0, 100.0),
              "16": repeated(300.0, 90.0, 100.0, 3000.0, 1000.0),
              "64": repeated(1000.0, 150.0, 200.0, 3000.0, 4500.0),
              "256": repeated(3000.0, 160.0, 250.0, 3000.0, 7000.0)}
    gateways = {"level": 16, "http": repeated(300.0, 90.0, 100.0, 3000.0, 1300.0),
                "grpc": repeated(280.0, 85.0, 120.0, 3000.0, 330.0)}
    return hand_made_study(levels, gateways=gateways, profile="h100-nvme")


def disagreeing() -> dict:
    levels = {"1": repeated(100.0, 50.0, 10.0, 2000.0, 4000.0), "4": repeated(102.0, 52.0, 8.0, 2000.0, 8000.0),
              "16": repeated(105.0, 55.0, 7.0, 3000.0, 600.0),
              "64": repeated(110.0, 60.0, 6.5, 3000.0, 300.0, timeouts=20),
              "256": repeated(120.0, 62.0, 6.4, 3000.0, 300.0, timeouts=20)}
    gateways = {"level": 16, "http": repeated(300.0, 90.0, 100.0, 3000.0, 330.0),
                "grpc": repeated(280.0, 85.0, 80.0, 3000.0, 1300.0)}
    return hand_made_study(levels, gateways=gateways, profile="h100-nvme")


def verdicts(study: dict) -> dict[str, str]:
    scalellm.judge(study)
    return {c["key"]: c["verdict"] for c in study["claims"]}


def test_every_claim_can_agree_on_hand_made_levels():
    v = verdicts(agreeing())
    assert set(v) == {c.key for c in scalellm.CLAIMS}
    assert v == {k: "agrees" for k in v}, v


def test_every_claim_can_disagree_on_hand_made_levels():
    v = verdicts(disagreeing())
    assert v == {k: "disagrees" for k in v}, v


def test_every_claim_records_its_measurement_values_and_band():
    study = agreeing()
    scalellm.judge(study)
    for c in study["claims"]:
        assert c["measured"] and c["why"] and c["claim"] and c["figure"]
        assert len(c["values"]) == 3 and c["band"]["n"] == 3
    by = {c["key"]: c for c in study["claims"]}
    assert by["table1-ttft-grows"]["values"][0] == pytest.approx(10.0)          # 1000 / 100 ms, repeat 1
    assert by["fig6-gateway-swap"]["values"][0] == pytest.approx(1300 / 4300 - 330 / 3330)
    assert by["fig6-gateway-new-bottleneck"]["values"][0] == pytest.approx(4500 / 7500)  # the least of 64, 256


def test_one_repeat_is_inconclusive():
    study = agreeing()
    for f in study["results"]["levels"].values():
        f["repeats"] = f["repeats"][:1]
    v = verdicts(study)
    assert v["table1-ttft-grows"] == "inconclusive" and v["fig7-throughput-grows"] == "inconclusive"


def test_the_timeouts_claim_is_out_of_scope_at_short_replies_and_shows_its_measurement():
    study = disagreeing()
    study["settings"]["max_tokens"] = 32
    scalellm.judge(study)
    timeouts = next(c for c in study["claims"] if c["key"] == "table1-timeouts")
    assert timeouts["verdict"] == "out of scope"
    assert "replies of 32 tokens" in timeouts["why"] and "would have been disagrees" in timeouts["why"]
    assert timeouts["values"] == [1.0, 1.0, 1.0] and "64: 20/20" in timeouts["measured"]


def test_the_fast_engine_claims_are_out_of_scope_without_the_h100_profile():
    study = agreeing()
    del study["settings"]["profile"]
    v = verdicts(study)
    assert v["fig2-gateway-bound-at-256"] == v["fig6-gateway-new-bottleneck"] == "out of scope"
    assert v["fig2-engine-bound-at-4"] == "agrees"
    why = next(c["why"] for c in study["claims"] if c["key"] == "fig6-gateway-new-bottleneck")
    assert "asynchronous" in why and "engine time" in why                        # the queue where it is


def test_levels_short_of_256_leave_its_claim_unmeasured_and_no_comparison_leaves_its_two():
    study = agreeing()
    del study["results"]["levels"]["256"], study["results"]["gateways"]
    study["settings"]["levels"] = [1, 4, 16, 64]
    v = verdicts(study)
    assert v["fig2-gateway-bound-at-256"] == "not measured"
    assert v["fig6-gateway-swap"] == v["fig7-gateway-throughput"] == "not measured"
    assert v["fig6-gateway-new-bottleneck"] == "agrees"                         # 64 alone


def test_every_seed_claim_quotes_the_paper_exactly():
    from bench.study.scalellm_replicas import REPLICA_CLAIMS
    text = " ".join((Path(__file__).resolve().parents[3].parent / "shared" / "papers" / scalellm.SEED)
                    .read_text().split()) if (Path(__file__).resolve().parents[3].parent / "shared" / "papers"
                                              / scalellm.SEED).exists() else None
    if text is None:
        pytest.skip("the seed's text is not beside the repository")
    for c in [*scalellm.CLAIMS, *REPLICA_CLAIMS]:
        if c.source == "seed":
            assert " ".join(c.words.split()) in text, c.key
    assert "far less" not in " ".join(c.words for c in scalellm.CLAIMS)
    assert not any("shrinking as the engine fills" in c.words for c in scalellm.CLAIMS)


def test_ratios_and_headline_on_hand_made_levels():
    from bench.study.scalellm_figures import measured_levels, ratios
    study = hand_made_study({"1": repeated(100.0, 50.0, 15.0, 2000.0, 50.0),
                             "4": repeated(150.0, 70.0, 40.0, 2500.0, 60.0),
                             "64": repeated(5000.0, 120.0, 90.0, 20000.0, 400.0, timeouts=3, requests=1280)})
    r = ratios(measured_levels(study["results"]["levels"]))
    assert r["tokens_per_s_64_vs_1"] == pytest.approx(6.0)
    assert r["ttft_p50_64_vs_1"] == pytest.approx(50.0) and r["tbt_p50_64_vs_1"] == pytest.approx(2.4)
    assert r["timeouts_64"] == 3 and r["timeouts_1"] == 0
    rows = headline_rows(study)
    assert len(rows) == 3 and all(set(row) == {"question", "measured", "target", "claim"} for row in rows)
    assert {row["claim"] for row in rows} <= {c.key for c in scalellm.CLAIMS}   # each names a claim of the table
    assert rows[0]["measured"].startswith("6.00x") and "64 concurrent" in rows[0]["question"]
    assert "3 of 1280 timed out" in rows[1]["measured"]


def test_repeats_pool_into_one_level_and_keep_each_repeats_figures():
    from bench.study.scalellm_figures import pool, with_counters
    one = [ok(0.1, 1.1, 11, 900.0, 1000.0)]
    two = [ok(0.3, 3.3, 11, 2700.0, 3000.0), RequestRecord(1, "timeout", 60.0)]
    repeats = [(with_counters(level_figures(rs, w, 60.0), g, {"swap": 1}, {"compute": c}), rs)
               for rs, w, g, c in ((one, 10.0, 12, 1.0), (two, 70.0, 30, 2.0))]
    f = pool(repeats, 60.0)
    assert (f["requests"], f["completed"], f["timeouts"]) == (3, 2, 1)
    assert f["wall_s"] == 80.0 and f["generated_tokens"] == 42 and f["generated_tokens_per_s"] == 42 / 80.0
    assert f["preemptions"] == {"swap": 2} and f["cpu_cores"] == {"compute": 1.5}
    assert [r["requests"] for r in f["repeats"]] == [1, 2]
    assert f["repeats"][1]["timeout_share"] == 0.5
    with pytest.raises(ValueError):
        pool(["RuntimeError: died"], 60.0)


def test_a_failed_repeat_keeps_its_place_so_repeats_pair_by_index():
    from bench.study.scalellm_figures import per_repeat, pool, repeats_of, with_counters
    runs = [(with_counters(level_figures([ok(0.1, 1.1, 11)], 10.0, 60.0), 1, {}, {}), [ok(0.1, 1.1, 11)]),
            "RuntimeError: died",
            (with_counters(level_figures([ok(0.3, 3.3, 11)], 10.0, 60.0), 1, {}, {}), [ok(0.3, 3.3, 11)])]
    low = pool(runs, 60.0)
    assert low["requests"] == 2 and low["repeats"][1] == {"failed": "RuntimeError: died"}
    high = {**low, "repeats": [{"x": 1.0}, {"x": 2.0}, {"x": 3.0}]}
    assert [sorted(one) for one in repeats_of({1: low, 64: high})] == [[1, 64], [64], [1, 64]]
    assert per_repeat({1: low, 64: high}, lambda one: one[64]["x"] / one[1]["requests"]) == [1.0, 3.0]


def test_a_failed_level_is_reported_in_claims_and_headline():
    error = "RuntimeError: the compute node died"
    study = hand_made_study({"1": repeated(100.0, 50.0, 15.0, 2000.0, 50.0), "64": {"failed": error}},
                            failed=[{"part": "level 64, repeat 1", "error": error, "traceback": ""}])
    scalellm.judge(study)
    assert all(c["measured"] and c["verdict"] for c in study["claims"])
    assert [row["measured"] for row in headline_rows(study)] == [f"failed: {error}"] * 3
    assert "failed: " + error.replace("|", "/") in scalellm.level_table(study)


def test_services_that_never_started_leave_every_claim_unmeasured():
    error = "RuntimeError: frontend did not start"
    study = hand_made_study({}, failed=[{"part": "services", "error": error, "traceback": ""}])
    study["settings"]["levels"] = [1, 64]
    scalellm.judge(study)
    assert study["claims"] and all(c["verdict"] == "not measured" for c in study["claims"])
    assert all(row["measured"] == f"failed: {error}" for row in headline_rows(study))


def test_the_gateway_comparison_table_and_order():
    from bench.study.scalellm_gateways import gateway_table, order
    assert order(0) == ("http", "grpc") and order(1) == ("grpc", "http")
    g = agreeing()["results"]["gateways"]
    table = gateway_table(g).splitlines()
    assert table[2].startswith("| HTTP (OpenAI API, SSE) |") and table[3].startswith("| gRPC (Chat) |")
    assert "30.2%, 30.4%, 30.0%" in table[2]
    assert "(virtual)" in gateway_table(g, virtual=True) and gateway_table(None) == ""


@pytest.mark.slow
def test_smoke_run_keeps_the_json_contract(tmp_path):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    out = tmp_path / "out"
    from kvtb.placement import current_cpus, formatted, plan
    placement = "nic" if len(current_cpus()) >= 2 else "shared"  # the study's stack started in it
    done = subprocess.run(kvtb_argv("study", "scalellm", "--smoke", "--json", "--out", str(out),
                                    "--placement", placement),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmpdir)})
    assert done.returncode == 0, done.stderr[-3000:]
    study = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("study", "machine", "settings", "results", "claims", "ratios", "plots"):
        assert key in study, key
    assert study["study"] == "scalellm" and study["mode"] == "smoke" and study["failed"] == []
    assert study == json.loads((out / "results.json").read_text())
    assert (out / "README.md").read_text().startswith("# ScaleLLM")
    assert study["settings"]["placement"] == placement == study["machine"]["placement"]["name"]
    assert study["machine"]["placement"]["cpus"] == formatted(plan(placement))
    page = (out / "README.md").read_text()
    assert f"placement {placement} (compute {formatted(plan(placement))['compute']}" in page
    s = study["settings"]
    assert s["levels"] == [1, 2] and s["max_tokens"] == 4 and s["timeout_s"] == 60.0 and s["repeats"] == 1
    levels = study["results"]["levels"]
    assert set(levels) == {"1", "2"}
    for c, f in levels.items():
        assert f["requests"] == int(c) * s["requests_per_client"] and len(f["repeats"]) == 1
        assert f["completed"] + f["timeouts"] + f["errors"] == f["requests"]
        assert f["completed"] == f["requests"] and f["summaries"] == f["completed"]
        assert f["engine_ms_mean"] > 0 and f["output_tokens_per_s"] > 0
    g = study["results"]["gateways"]                      # the same load through both protocols
    assert g["level"] == 2
    for p in ("http", "grpc"):
        assert g[p]["completed"] == g[p]["requests"] == 2 and g[p]["summaries"] == 2
        assert g[p]["engine_ms_mean"] > 0 and g[p]["gateway_share"] is not None
    assert "## The gateway comparison" in page and "| gRPC (Chat) |" in page
    keys = {c.key for c in scalellm.CLAIMS}
    assert {c["key"] for c in study["claims"]} == keys
    for c in study["claims"]:
        assert c["measured"] and c["verdict"] in VERDICTS
        assert c["verdict"] in ("inconclusive", "not measured", "out of scope"), c   # one repeat judges nothing
    by = {c["key"]: c for c in study["claims"]}
    assert by["table1-timeouts"]["verdict"] == "out of scope"                      # 4-token replies
    assert by["table1-ttft-grows"]["values"] and by["fig6-gateway-swap"]["values"]
    assert "tokens_per_s_2_vs_1" in study["ratios"]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in study["ratios"].values())
    assert len(study["plots"]) == 5 and all(Path(p).exists() for p in study["plots"])
    assert [p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert len(headline_rows(study)) == 3


@pytest.mark.slow
def test_smoke_run_under_a_profile_is_in_virtual_time_with_the_gateway_stretched(tmp_path):
    """Under polaris-a100 at D = 3: the record's D and violations, the engine's steps paced, and the
    frontend's and the agent's CPU time stretched (software on both worlds); times virtual."""
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "scalellm", "--smoke", "--json", "--out", str(out),
                                    "--profile", "polaris-a100", "--dilation", "3"),
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    study = json.loads(done.stdout.strip().splitlines()[-1])
    scale = study["scale"]
    assert scale["profile"] == "polaris-a100" and scale["dilation"] == 3.0 and scale["dilation_chosen"] == "given"
    kinds = scale["pacing"]["kinds"]
    assert kinds["gpu_step"]["ops"] > 0 and "violations" in kinds["gpu_step"]
    assert kinds["frontend_software"]["real_s"] > 0 and kinds["frontend_software"]["violations"] == 0
    assert kinds["agent_software"]["ops"] > 0
    assert study["settings"]["profile"] == "polaris-a100" and study["failed"] == []
    levels = study["results"]["levels"]
    assert all(f["completed"] == f["requests"] for f in levels.values())
    assert all(c["verdict"] in VERDICTS for c in study["claims"])
    page = (out / "README.md").read_text()
    assert "times are virtual (wall / D), D = 3" in page and "Under the hardware profile `polaris-a100`" in page


def test_under_a_profile_every_time_is_divided_by_d():
    records = [RequestRecord(0, "ok", 8.0, ttft_s=2.0, tokens=5, engine_ms=4000.0, frontend_e2e_ms=6000.0,
                             gateway_ms=2000.0),
               RequestRecord(1, "timeout", 240.0)]
    virtual, wall = scalellm.in_virtual_time(records, 16.0, 4.0)
    assert wall == 4.0
    assert (virtual[0].e2e_s, virtual[0].ttft_s, virtual[0].engine_ms, virtual[0].gateway_ms) == (2.0, 0.5, 1000.0, 500.0)
    assert virtual[1].e2e_s == 60.0 and virtual[1].ttft_s is None and virtual[1].engine_ms is None
    assert records[0].e2e_s == 8.0   # the wall records are left as they were
    assert scalellm.in_virtual_time(records, 16.0, 1.0) == (records, 16.0)


class _FakeStack:
    """compute_stats answers from a script of (running, waiting) per call."""
    replicas = 1

    def __init__(self, script):
        self.script = list(script)

    def compute_stats(self, replica, timeout_s):
        import types
        running, waiting = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return types.SimpleNamespace(num_requests_running=running, num_requests_waiting=waiting)


def test_the_next_level_waits_until_the_abandoned_turns_leave_the_engine():
    from bench.study.scalellm_clients import wait_idle
    stack = _FakeStack([(3, 2), (1, 0), (0, 0)])
    assert wait_idle(stack, timeout_s=5.0, poll_s=0.0) >= 0.0 and stack.script == [(0, 0)]
    with pytest.raises(RuntimeError, match="2 running, 1 waiting"):
        wait_idle(_FakeStack([(2, 1)]), timeout_s=0.05, poll_s=0.01)
