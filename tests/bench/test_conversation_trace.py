"""bench.conversation_trace: the synthetic Mooncake-like conversation trace and reading Mooncake JSONL."""
import math
import random
import statistics

import pytest

from bench import conversation_trace as ct
from bench import mooncake
from bench.mooncake import TraceError, TraceRequest


def test_the_trace_is_deterministic_per_seed():
    a, b = ct.synthetic_conversations(300, seed=4), ct.synthetic_conversations(300, seed=4)
    assert a == b and len(a) == 300
    assert ct.synthetic_conversations(300, seed=5) != a


@pytest.fixture(scope="module")
def hour():
    """A whole hour in Mooncake's own units (512-token blocks): what the paper's Table 2 describes."""
    return ct.synthetic_conversations(12031, seed=2, block_tokens=512)


def test_lengths_and_reuse_match_the_published_figures(hour):
    s = ct.summary(hour, 512)
    assert s["requests"] == 12031
    assert s["mean_input_tokens"] == pytest.approx(12035, rel=0.15)    # Table 2
    assert s["mean_output_tokens"] == pytest.approx(343, rel=0.15)
    assert s["ideal_block_share"] == pytest.approx(0.37, abs=0.06)     # the released file's (paper: 40 %)
    assert s["span_s"] == pytest.approx(3600, rel=0.2)                 # an hour of arrivals
    assert s["max_input_tokens"] < ct.MOONCAKE_WINDOW


def test_the_distributions_follow_their_parameters(hour):
    p = ct.CONVERSATION
    outs = sorted(t.request.output_length for t in hour)
    assert statistics.median(outs) == pytest.approx(p.output_q[2], rel=0.1)
    assert max(outs) <= p.output_max
    turns = {}
    for t in hour:
        turns[t.session] = max(turns.get(t.session, 0), t.turn + 1)
    share_one = sum(1 for k in turns.values() if k == 1) / len(turns)
    assert share_one == pytest.approx(5114 / 7373, abs=0.08)  # sessions cut by the hour's end look shorter
    firsts = sorted(t.request.input_length for t in hour if t.turn == 0)
    assert statistics.median(firsts) == pytest.approx(math.exp(p.first_input_mu), rel=0.1)
    gaps = []
    by_session = {}
    for t in hour:
        by_session.setdefault(t.session, []).append(t.request.timestamp_ms)
    for times in by_session.values():
        gaps += [(b - a) / 1000 for a, b in zip(times, times[1:])]
    assert statistics.median(gaps) == pytest.approx(math.exp(p.think_mu), rel=0.15)


def test_follow_ups_repeat_their_previous_input_blocks(hour):
    last = {}
    for t in hour:
        r = t.request
        assert r.hash_ids[0] == 0  # the shared system prompt
        if t.session in last:
            prev = last[t.session]
            full = prev.input_length // 512
            assert r.hash_ids[:full] == prev.hash_ids[:full]
            assert r.input_length > prev.input_length + prev.output_length - 1
            assert not set(r.hash_ids[full:]) & set(prev.hash_ids)
        last[t.session] = r
    mooncake.check_blocks([t.request for t in hour], 512)


def test_scaled_to_the_testbed_blocks_and_window():
    turns = ct.synthetic_conversations(2000, seed=3, block_tokens=32)
    reqs = [t.request for t in turns]
    mooncake.check_blocks(reqs, 32)
    assert all(r.input_length + r.output_length <= ct.MODEL_WINDOW for r in reqs)
    s = ct.summary(turns, 32)
    assert s["mean_input_tokens"] == pytest.approx(12035 / 16, rel=0.3)  # a shorter run starts cold


def test_infer_sessions_links_follow_ups_by_shared_prefix():
    reqs = [TraceRequest(0, 1500, 10, (0, 1, 2)), TraceRequest(10, 1200, 10, (0, 5, 6)),
            TraceRequest(20, 2100, 10, (0, 1, 2, 3, 4)), TraceRequest(30, 900, 10, (0, 7))]
    turns = ct.infer_sessions(reqs)
    assert [(t.session, t.turn) for t in turns] == [(0, 0), (1, 0), (0, 1), (2, 0)]


def test_load_mooncake_jsonl(tmp_path):
    lines = ['{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [0, 1, 2]}',
             '',
             '{"timestamp": 3000, "input_length": 1700, "output_length": 9000, "hash_ids": [0, 1, 3, 4], '
             '"extra": "ignored"}',
             '{"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [0, 9]}']
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    turns = ct.load_mooncake(path, block_tokens=32)
    assert [t.request.timestamp_ms for t in turns] == [0, 1000, 3000]  # sorted by time
    a, b, c = (t.request for t in turns)
    assert a.hash_ids == (0, 1, 2) and a.output_length == 3
    assert a.input_length == 2 * 32 + round(76 * 32 / 512)
    assert c.output_length == round(9000 * 32 / 512)
    assert [t.session for t in turns] == [0, 1, 0] and turns[2].turn == 1
    assert ct.load_mooncake(path, block_tokens=32, limit=1)[0].request == a
    path.write_text('{"timestamp": 0, "input_length": 5000, "output_length": 5, "hash_ids": [0, 1]}\n')
    with pytest.raises(TraceError):  # 2 blocks of 512 cannot hold 5,000 tokens
        ct.load_mooncake(path)
    path.write_text('{"timestamp": 0, "input_length": 10}\n')
    with pytest.raises(TraceError):
        ct.load_mooncake(path)


def test_dump_is_mooncake_jsonl():
    turns = ct.synthetic_conversations(50, seed=1)
    parsed = mooncake.parse_trace(ct.dump(turns).splitlines())
    assert parsed == sorted((t.request for t in turns), key=lambda r: r.timestamp_ms)
    assert '"session": ' in ct.dump(turns[:1])


def test_fit_window_cuts_the_reply_then_the_input():
    r = TraceRequest(0, 8000, 500, tuple(range(250)))
    cut = ct.fit_window(r, 32, 8192)
    assert cut.input_length == 8000 and cut.output_length == 192
    cut = ct.fit_window(r, 32, 4096)
    assert cut.output_length == 1 and cut.input_length == 4095 and len(cut.hash_ids) == 128
    mooncake.check_blocks([cut], 32)
    assert ct.fit_window(TraceRequest(0, 10, 5, (1,)), 32) == TraceRequest(0, 10, 5, (1,))


def test_quantile_draw_interpolates():
    rng = random.Random(0)
    xs = sorted(ct.quantile_draw(rng, (10, 20, 30, 40, 50, 60), 0, 100) for _ in range(4000))
    assert xs[len(xs) // 2] == pytest.approx(30, abs=2)
    assert xs[int(0.1 * len(xs))] == pytest.approx(10, abs=2)
    assert 0 <= xs[0] and xs[-1] <= 100
