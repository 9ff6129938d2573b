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
from bench.study.scalellm import RequestRecord, add_claims, add_ratios, headline_rows, level_figures
from kvtb.launch import kvtb_argv


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


def test_modes_set_their_levels_requests_and_reply_lengths():
    full = scalellm.parse_args([])
    assert full.levels == [1, 2, 4, 8, 16, 32, 64] and full.requests_per_client == 20
    assert full.timeout_s == 60.0
    quick = scalellm.parse_args(["--quick"])
    assert quick.levels == [1, 4, 16, 64] and quick.requests_per_client == 2 and quick.max_tokens == 32
    smoke = scalellm.parse_args(["--smoke", "--timeout-s", "5"])
    assert smoke.levels == [1, 2] and smoke.max_tokens == 4 and smoke.timeout_s == 5.0
    mine = scalellm.parse_args(["--levels", "8", "2", "--requests-per-client", "3", "--max-tokens", "7"])
    assert (mine.levels, mine.requests_per_client, mine.max_tokens) == ([2, 8], 3, 7)
    with pytest.raises(SystemExit):
        scalellm.parse_args(["--levels", "0"])


def level(ttft_p50, tbt_p50, tps, engine, gateway, timeouts=0, requests=20):
    return {"requests": requests, "completed": requests - timeouts, "timeouts": timeouts, "errors": 0,
            "ttft_ms": {"n": 1, "mean": ttft_p50, "p50": ttft_p50, "p99": ttft_p50 * 2, "max": ttft_p50 * 3},
            "tbt_ms": {"n": 1, "mean": tbt_p50, "p50": tbt_p50, "p99": tbt_p50 * 2, "max": tbt_p50 * 3},
            "e2e_ms": {"n": 1, "mean": 5000.0, "p50": 5000.0, "p99": 9000.0, "max": 9500.0},
            "output_tokens_per_s": tps, "engine_ms_mean": engine, "gateway_ms_mean": gateway,
            "client_gateway_ms_mean": gateway * 1.5, "gateway_share": gateway / (gateway + engine),
            "client_gateway_share": gateway * 1.5 / (gateway * 1.5 + engine)}


def hand_made_study(levels: dict, failed: list | None = None) -> dict:
    return {"study": "scalellm", "machine": {"cores": 2},
            "settings": {"levels": sorted(int(c) for c in levels), "timeout_s": 60.0, "max_tokens": 32,
                         "model": "SmolLM2-135M"},
            "results": {"levels": levels}, "claims": [], "ratios": {}, "plots": [], "failed": failed or []}


def test_ratios_claims_and_headline_on_hand_made_levels():
    study = hand_made_study({"1": level(100.0, 50.0, 15.0, 2000.0, 50.0),
                             "4": level(150.0, 70.0, 40.0, 2500.0, 60.0),
                             "16": level(250.0, 110.0, 80.0, 4000.0, 90.0),
                             "64": level(5000.0, 120.0, 90.0, 20000.0, 400.0, timeouts=3, requests=1280)})
    add_ratios(study)
    r = study["ratios"]
    assert r["tokens_per_s_64_vs_1"] == pytest.approx(6.0)
    assert r["ttft_p50_64_vs_1"] == pytest.approx(50.0) and r["tbt_p50_64_vs_1"] == pytest.approx(2.4)
    assert r["timeouts_64"] == 3 and r["timeouts_1"] == 0
    assert r["gateway_share_64"] == pytest.approx(400 / 20400)
    add_claims(study)
    claims = study["claims"]
    assert [c["figure"] for c in claims] == ["Table 1"] * 3 + ["Fig. 2, Fig. 6", "Fig. 6", "Fig. 7"]
    assert all(c["measured"] and c["why"] and c["claim"] for c in claims)
    agrees = [c["agrees"] for c in claims]
    # TTFT grows, sharpest into 64; TBT grows less than TTFT; timeouts at 64 (no); engine dominates at 1;
    # the gateway does not become the bottleneck (no); throughput grows and flattens
    assert agrees == [True, True, False, True, False, True]
    assert "first at 64" in claims[2]["measured"]
    rows = headline_rows(study)
    assert 1 <= len(rows) <= 3 and all(set(row) == {"question", "measured", "target"} for row in rows)
    assert rows[0]["measured"].startswith("6.00x") and "64 concurrent" in rows[0]["question"]
    assert "3 of 1280 timed out" in rows[1]["measured"]


def test_a_failed_level_is_reported_in_claims_and_headline():
    error = "RuntimeError: the compute node died"
    study = hand_made_study({"1": level(100.0, 50.0, 15.0, 2000.0, 50.0), "64": {"failed": error}},
                            failed=[{"part": "level 64", "error": error, "traceback": ""}])
    add_ratios(study)
    add_claims(study)
    assert "tokens_per_s_64_vs_1" not in study["ratios"]
    assert all(c["measured"] for c in study["claims"])
    assert [row["measured"] for row in headline_rows(study)] == [f"failed: {error}"] * 3
    assert "failed: " + error.replace("|", "/") in scalellm.level_table(study)


def test_services_that_never_started_leave_every_claim_unmeasured():
    error = "RuntimeError: frontend did not start"
    study = hand_made_study({}, failed=[{"part": "services", "error": error, "traceback": ""}])
    study["settings"]["levels"] = [1, 64]
    add_ratios(study)
    add_claims(study)
    assert study["claims"] and all(c["agrees"] is None and c["measured"].startswith("not measured")
                                   for c in study["claims"])
    assert all(row["measured"] == f"failed: {error}" for row in headline_rows(study))


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
    assert s["levels"] == [1, 2] and s["max_tokens"] == 4 and s["timeout_s"] == 60.0
    levels = study["results"]["levels"]
    assert set(levels) == {"1", "2"}
    for c, f in levels.items():
        assert f["requests"] == int(c) * s["requests_per_client"]
        assert f["completed"] + f["timeouts"] + f["errors"] == f["requests"]
        assert f["completed"] == f["requests"] and f["summaries"] == f["completed"]
        assert f["engine_ms_mean"] > 0 and f["output_tokens_per_s"] > 0
    assert study["claims"]
    for c in study["claims"]:
        assert set(c) == {"figure", "claim", "measured", "agrees", "why"} and c["measured"]
        assert c["agrees"] in (True, False)
    assert "tokens_per_s_2_vs_1" in study["ratios"]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in study["ratios"].values())
    assert len(study["plots"]) == 3 and all(Path(p).exists() for p in study["plots"])
    assert [p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert len(headline_rows(study)) == 3


def test_timeouts_inside_the_batch_and_fig7_on_the_tokens_the_engine_generated():
    everything_timed_out = level(9000.0, 0.0, 0.0, 1.0, 1.0, timeouts=8, requests=8)
    everything_timed_out.update(tbt_ms=None, engine_ms_mean=None, gateway_ms_mean=None, gateway_share=None,
                                generated_tokens_per_s=4.0)
    study = hand_made_study({"1": {**level(500.0, 300.0, 2.0, 19000.0, 10.0), "generated_tokens_per_s": 2.0},
                             "4": everything_timed_out})
    study["machine"]["load_average_1m"] = 7.5
    add_ratios(study)
    add_claims(study)
    assert study["ratios"]["tokens_per_s_4_vs_1"] == pytest.approx(2.0)          # generated tokens
    assert study["ratios"]["completed_tokens_per_s_4_vs_1"] == pytest.approx(0.0)
    by = {(c["figure"], c["claim"][:4]): c for c in study["claims"]}
    assert by[("Table 1", "TTFT")]["agrees"] is not None                        # timed-out requests count
    assert by[("Table 1", "TBT ")]["agrees"] is None
    assert "no request completed at 4" in by[("Table 1", "TBT ")]["measured"]
    timeouts = by[("Table 1", "With")]
    assert timeouts["agrees"] is False and "all 4 requests are in the batch" in timeouts["why"]
    assert "load average 7.5" in timeouts["why"]
    assert "tokens the compute node generated" in by[("Fig. 7", "Outp")]["measured"]
    assert headline_rows(study)[0]["measured"].startswith("2.00x")


def test_the_gateway_why_names_the_frontends_places_when_its_share_grows_past_them():
    from bench.study import scalellm
    high = scalellm.FRONTEND_PLACES * 2
    grown = scalellm.gateway_why({1: 0.003, high: 0.435}, high, agrees=False)
    assert f"at most {scalellm.FRONTEND_PLACES} turns at once" in grown and f"43.5% at {high}" in grown
    within = scalellm.gateway_why({1: 0.003, 64: 0.435}, 64, agrees=False)  # 64 turns all forwarded
    assert "max_concurrent_turns" not in within
    flat = scalellm.gateway_why({1: 0.003, 64: 0.01}, 64, agrees=False)
    assert "keeps up" in flat


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
    assert all(c["agrees"] in (True, False, None, "invalid") for c in study["claims"])
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
