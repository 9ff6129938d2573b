"""`kvtb bench replay`: the Mooncake trace format, its ideal hit rate, prompts whose equal ids are
equal text (checked with the real tokenizer), the stateless client against a scripted server, the
figures and ratios; one smoke run with the real services (slow)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bench import mooncake, multiround, replay, trace_replay
from bench.mooncake import TraceError, TraceRequest
from bench.openai_client import ChatFailed, Reply, chat, messages_of
from bench.trace_prompts import BlockText, check_prompt, pad_words, single_token_words, split_template
from compute_node.settings import ComputeSettings

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

TOKENIZER = Path(ComputeSettings().model_cache_dir) / "tokenizer.json"


def req(ids, length=None, ts=0.0, out=4, bt=4) -> TraceRequest:
    return TraceRequest(ts, length or len(ids) * bt, out, tuple(ids))


# -- the trace format

def test_parse_reads_mooncake_lines_sorted_by_time_and_skips_blank_lines():
    text = ('{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}\n\n'
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2], "extra": "ignored"}\n')
    a, b = mooncake.parse_trace(text.splitlines())
    assert (a.timestamp_ms, a.hash_ids, b.input_length, b.output_length) == (0.0, (1, 2), 6955, 52)
    assert mooncake.parse_trace(mooncake.dump_trace([a, b]).splitlines()) == [a, b]


@pytest.mark.parametrize("line, says", [
    ("not json", "line 1: not JSON"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}', "hash_ids"),
    ('{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": [1]}', "input_length"),
    ('{"timestamp": "0", "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}', "input_length >= 1"),
])
def test_parse_names_the_line_and_field_it_refuses(line, says):
    with pytest.raises(TraceError, match=says):
        mooncake.parse_trace([line])


def test_check_blocks_refuses_lengths_the_ids_cannot_hold():
    mooncake.check_blocks([req([1, 2], length=5)], 4)
    with pytest.raises(TraceError, match="source-block-tokens"):
        mooncake.check_blocks([req([1, 2], length=9)], 4)
    with pytest.raises(TraceError):
        mooncake.check_blocks([req([1, 2], length=4)], 4)  # the second id would cover nothing


def test_synthetic_groups_share_3_to_8_leading_blocks_with_prefix_ids():
    trace = mooncake.synthetic_trace(30, seed=1)
    mooncake.check_blocks(trace, mooncake.MOONCAKE_BLOCK_TOKENS)
    assert len(trace) == 30 and trace == mooncake.synthetic_trace(30, seed=1)
    assert [r.timestamp_ms for r in trace] == sorted(r.timestamp_ms for r in trace)
    firsts = {}
    for r in trace:
        firsts.setdefault(r.hash_ids[0], []).append(r)
    assert len(firsts) == 6
    for group in firsts.values():
        shared = min(sum(1 for a, b in zip(group[0].hash_ids, r.hash_ids) if a == b) for r in group[1:])
        assert 3 <= shared <= 8
    where = {}
    for r in trace:  # prefix ids: an id always has the same predecessors
        for i, h in enumerate(r.hash_ids):
            assert where.setdefault(h, r.hash_ids[:i]) == r.hash_ids[:i]


def test_scale_keeps_blocks_and_the_last_blocks_share():
    [r] = mooncake.scale([TraceRequest(5.0, 2 * 512 + 256, 160, (7, 8, 9))], 512, 32)
    assert (r.input_length, r.output_length, r.hash_ids, r.timestamp_ms) == (64 + 16, 10, (7, 8, 9), 5.0)
    [tiny] = mooncake.scale([TraceRequest(0, 512 + 3, 0, (1, 2))], 512, 32)
    assert tiny.input_length == 33 and tiny.output_length == 0  # at least one token of the last block


def test_ideal_counts_full_blocks_whose_whole_prefix_came_before():
    bt = 4
    trace = [req([1, 2, 3]), req([1, 2, 4]), req([9, 2, 3]), req([1, 2, 3]), req([1, 2, 4, 5], length=14)]
    assert mooncake.ideal_blocks(trace, bt) == [0, 2, 0, 2, 3]
    # [9, 2, 3]: ids 2 and 3 were seen, but not after 9; a repeat keeps one token to compute, so
    # [1, 2, 3] (12 tokens) reaches 2 blocks, while seen_id_share counts every id seen before
    assert mooncake.seen_id_share(trace) == pytest.approx((0 + 2 + 2 + 3 + 3) / 16)


# -- prompts: equal ids, equal text

WORDS = ["alpha", "beta", "gamma", "delta", "omega"]


def test_equal_ids_are_equal_text_and_a_partial_block_is_a_prefix_of_its_block():
    text = BlockText(WORDS, 6, seed=3)
    assert text.block(11) == BlockText(WORDS, 6, seed=3).block(11) and text.block(11) != text.block(12)
    assert text.block(11) != BlockText(WORDS, 6, seed=4).block(11)
    assert text.block(11).startswith(text.block(11, 2)) and len(text.block(11).split()) == 6
    a = text.prompt(req([1, 2, 3], length=14, bt=6))
    b = text.prompt(req([1, 2, 5], length=18, bt=6))
    assert a.startswith(text.block(1) + text.block(2)) and b.startswith(text.block(1) + text.block(2))
    assert a[len(text.block(1) + text.block(2)):] == text.block(3, 2)


def test_template_split_and_padding():
    assert split_template([5, 6, 1, 2, 3, 7], [1, 2, 3]) == ([5, 6], [7])
    with pytest.raises(ValueError):
        split_template([1, 2, 1, 2], [1, 2])
    assert [pad_words(n, 32) for n in (0, 1, 31, 32, 40)] == [0, 31, 1, 0, 24]
    assert check_prompt([1, 2, 3], [1], [2], [3]) == ""
    assert "first difference at 1" in check_prompt([1, 9, 3], [1], [2], [3])


@pytest.fixture(scope="module")
def tokenizer():
    if not TOKENIZER.exists():
        pytest.skip(f"no cached tokenizer at {TOKENIZER} (the compute node writes it at its first start)")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOKENIZER))
    return tok, (lambda s: tok.encode(s, add_special_tokens=False).ids)


def template(encode):
    """SmolLM2's chat template for a system and a user message, as text through the tokenizer."""
    return lambda system, user: encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}"
                                       "<|im_end|>\n<|im_start|>assistant\n")


def test_with_the_real_tokenizer_blocks_are_exactly_block_sized_and_concatenate(tokenizer):
    tok, encode = tokenizer
    words = single_token_words(tok.get_vocab(), encode)
    assert len(words) > 1000 and all(len(encode(" " + w)) == 1 for w in words[:200])
    text = BlockText(words, 32, seed=0)
    trace = mooncake.scale(mooncake.synthetic_trace(30, seed=0), 512, 32)
    for r in trace:
        assert len(text.expected_ids(r, encode)) == r.input_length
        assert encode(text.prompt(r)) == text.expected_ids(r, encode)  # no merge across a block boundary


def test_prepare_pads_the_head_to_whole_blocks_and_checks_every_prompt(tokenizer):
    tok, encode = tokenizer
    text = BlockText(single_token_words(tok.get_vocab(), encode), 32)
    trace = mooncake.scale(mooncake.synthetic_trace(10, seed=2), 512, 32)
    plan = trace_replay.prepare(trace, text, encode, template(encode))
    assert plan.mismatches == [] and plan.head_tokens % 32 == 0 and plan.head_tokens > 0
    ids = template(encode)(plan.system, plan.prompts[3])
    assert ids[plan.head_tokens:plan.head_tokens + 32] == encode(text.block(trace[3].hash_ids[0]))
    def broken_template(system, user):  # the marker block (32 words) as it is, every prompt altered
        return template(encode)(system, user if len(user.split()) == 32 else user.replace(" ", "  ", 1))
    broken = trace_replay.prepare(trace, text, encode, broken_template)
    assert len(broken.mismatches) == len(trace)


# -- the figures

def reply(cached, prompt=100, ttft=0.1, text="x"):
    return Reply(text, ttft, ttft * 2, prompt, cached, 4, "stop")


def test_users_are_the_groups_dealt_round_robin_and_share_no_prefix():
    trace = mooncake.synthetic_trace(40, seed=3, groups=8)
    users = mooncake.users_of(trace, 4)
    assert set(users) == {0, 1, 2, 3} and mooncake.users_of(trace) == mooncake.users_of(trace, 8)
    by_first = {}
    for r, u in zip(trace, users):  # a group (its first block) is one user's
        assert by_first.setdefault(r.hash_ids[0], u) == u
    blocks = {}
    for r, u in zip(trace, users):  # no prefix is sent by two users
        for k in range(len(r.hash_ids)):
            assert blocks.setdefault(r.hash_ids[:k + 1], u) == u


def test_the_ideal_is_per_user_a_prefix_of_another_user_is_no_hit():
    trace = [req([1, 2, 3]), req([1, 2, 4]), req([1, 2, 5])]
    assert mooncake.ideal_blocks(trace, 4) == [0, 2, 2]
    assert mooncake.ideal_blocks(trace, 4, [0, 1, 0]) == [0, 0, 2]  # request 1's user never sent [1, 2]


def test_a_multi_user_trace_leaves_room_below_the_ideal():
    """Several users whose groups recur: a cache must keep many users' prefixes to reach the ideal."""
    trace = mooncake.scale(mooncake.synthetic_trace(160, seed=0, groups=16), 512, 32)
    users = mooncake.users_of(trace, 16)
    ideal = mooncake.ideal_blocks(trace, 32, users)
    assert len(set(users)) == 16 and sum(ideal) > 0 and ideal.count(0) >= 16  # each user's first request
    distinct = {(u, r.hash_ids[:k + 1]) for r, u in zip(trace, users) for k in range(len(r.hash_ids))}
    assert len(distinct) * 32 > 3 * replay.parse_args([]).trace_pool_tokens  # the pool holds a third at most


def test_trace_figures_cap_each_requests_hit_at_its_own_ideal():
    plan = trace_replay.TracePlan([req([1, 2, 3]), req([1, 2, 4]), req([1, 2, 5])], 4, "sys", 8,
                                  ["", "", ""], [0, 1, 2], [], [0, 0, 0])
    sent = [trace_replay.Sent(0, 0.0, 0.01, reply(8 + 4)), trace_replay.Sent(1, 1.0, 1.0, reply(8 + 8)),
            trace_replay.Sent(2, 2.0, 2.0, reply(8 + 4))]
    f = trace_replay.figures(plan, sent)
    # request 0 could reuse nothing and request 1 one block: their extra hits must not make up for
    # request 2's missed block
    assert (f["ideal_tokens"], f["hit_tokens"], f["hit_over_ideal_tokens"]) == (12, 16, 8)
    assert f["prefix_hit_vs_ideal"] == 8 / 12 and f["hit_beyond_ideal_tokens"] == 8
    assert f["requests_below_ideal"] == 1 and "same user" in f["ideal"] and f["users"] == 1


def test_trace_figures_count_hits_past_the_head_against_the_ideal():
    plan = trace_replay.TracePlan([req([1, 2, 3]), req([1, 2, 4]), req([1, 2, 5])], 4, "sys", 8,
                                  ["", "", ""], [0, 2, 2], [])
    sent = [trace_replay.Sent(0, 0.0, 0.01, reply(0)), trace_replay.Sent(1, 1.0, 1.0, reply(8 + 4)),
            trace_replay.Sent(2, 2.0, 2.5, None, "ChatFailed: boom")]
    f = trace_replay.figures(plan, sent)
    assert (f["ideal_tokens"], f["hit_tokens"], f["failed"]) == (8, 4, 1)  # a failed request counts for neither
    assert f["prefix_hit_vs_ideal"] == 0.5 and f["late_s"]["max"] == 0.5
    assert [r["hit_tokens"] for r in f["per_request"]] == [0, 4, 0]


def test_qa_ratios_put_recompute_over_restore_and_compare_replies():
    def rounds(ttfts, cached, texts):
        return [(0, multiround.Round(u, r, reply(c, 200, t, x)))
                for u, (tt, cc, xx) in enumerate(zip(ttfts, cached, texts)) for r, (t, c, x) in enumerate(zip(tt, cc, xx))]
    storage = {"bytes_put": 0, "evicted": 0, "kv_source": {}}
    fast = replay.qa_figures(rounds([[1.0, 0.2], [1.0, 0.4]], [[0, 150], [0, 150]], [["a", "b"], ["c", "d"]]),
                             5.0, storage)
    slow = replay.qa_figures(rounds([[1.0, 0.8], [1.0, 1.2]], [[0, 0], [0, 0]], [["a", "b"], ["c", "D"]]),
                             6.0, storage)
    assert fast["followup_cached_share"] == 0.75 and fast["cached_share"] == 0.375
    result = {"results": {"qa": {"triggered": fast, "recompute": slow}}, "ratios": {}}
    replay.add_ratios(result)
    assert result["ratios"]["followup_ttft_recompute_vs_restore"] == pytest.approx(1.0 / 0.3)
    assert result["results"]["qa"]["replies_identical_across_policies"] == 0.75
    assert "prefix_hit_vs_ideal" not in result["floors"]


def test_trigger_line_reports_the_agents_percentiles():
    line = replay.trigger_line({"trigger_to_fire_us": {"p50": 120.4, "p99": 900.0, "fired": 7}})
    assert "7 fired" in line and "p50 120 µs" in line and "p99 900 µs" in line
    assert replay.trigger_line({}) == "trigger-to-fire: not reported"


def test_multiround_texts_are_seeded_and_messages_resend_the_history():
    w = multiround.QaWorkload(users=2, rounds=3, context_words=40, system_words=8)
    assert multiround.first_message(w, 0) == multiround.first_message(w, 0) != multiround.first_message(w, 1)
    assert multiround.system_prompt(w) == multiround.system_prompt(multiround.QaWorkload(seed=5, system_words=8))
    assert multiround.system_prompt(multiround.QaWorkload(system_words=0)) is None
    msgs = messages_of("S", [("q1", "a1")], "q2")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"] and msgs[2]["content"] == "a1"
    with pytest.raises(ValueError, match="two rounds"):
        multiround.QaWorkload(rounds=1)


# -- the stateless client against a scripted server

def test_chat_streams_times_the_first_token_and_reads_cached_tokens():
    seen = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((dict(request.headers), body))
        if body["messages"][-1]["content"] == "fail":
            return web.json_response({"error": {"message": "no"}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"delta": {"content": "Hel"}}]}, {"choices": [{"delta": {"content": "lo"}}]},
                  {"choices": [{"delta": {}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
                                            "prompt_tokens_details": {"cached_tokens": 32}}}]
        for c in chunks:
            await resp.write(f"data: {json.dumps(c)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go():
        app = web.Application()
        app.add_routes([web.post("/v1/chat/completions", completions)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with aiohttp.ClientSession() as session:
                got = await chat(session, url, "tok", "m", messages_of(None, [("q", "a")], "hi"), 2)
                with pytest.raises(ChatFailed, match="HTTP 400"):
                    await chat(session, url, "tok", "m", messages_of(None, [], "fail"), 2)
        finally:
            await runner.cleanup()
        return got

    got = asyncio.run(go())
    assert (got.text, got.cached_tokens, got.prompt_tokens, got.finish_reason) == ("Hello", 32, 40, "length")
    assert 0 < got.ttft_s <= got.e2e_s
    headers, body = seen[0]
    assert headers["Authorization"] == "Bearer tok" and not any(h.lower() == "x-session-id" for h in headers)
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and len(body["messages"]) == 3


# -- the real services

@pytest.mark.slow
def test_replay_smoke(tmp_path):
    from tests.bench.test_smoke import bench
    result = bench(tmp_path, "replay", timeout=900)
    qa, trace = result["results"]["qa"], result["results"]["trace"]
    assert not qa["triggered"]["failed"] and not qa["recompute"]["failed"] and trace["failed"] == 0
    assert qa["triggered"]["followup_cached_share"] > 0.5 and qa["recompute"]["cached_share"] == 0
    assert qa["triggered"]["storage"]["bytes_put"] > 0 and qa["recompute"]["storage"]["bytes_put"] == 0
    assert trace["prompt_mismatches"] == [] and trace["ideal_tokens"] > 0
    fire = trace["storage"]["trigger_to_fire_us"]  # the agent's latency under the replay's load
    assert fire["fired"] > 0 and 0 < fire["p50"] <= fire["p99"]
    assert 0 < trace["hit_over_ideal_tokens"] <= trace["hit_tokens"]  # capped per request at its ideal
    assert trace["users"] > 1 and "ideal" in trace and result["failed"] == []
    assert {"followup_ttft_recompute_vs_restore", "prefix_hit_vs_ideal"} <= set(result["ratios"])
