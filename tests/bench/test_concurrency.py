"""The concurrency benchmark's check that replies under load equal the replies alone (pure)."""
from __future__ import annotations

from bench.concurrency import first_difference
from bench.sessions import TOPICS, script


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
