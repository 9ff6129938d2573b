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
