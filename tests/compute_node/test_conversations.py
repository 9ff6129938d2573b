"""The real model with real agent and storage processes: restores, policies, multiplexing."""
from __future__ import annotations

import concurrent.futures
import uuid

import pytest

from tests.compute_node.conftest import Chat

pytestmark = pytest.mark.slow

MESSAGES = ["Give me a short cheesecake recipe.", "Only give temperatures in °C from now on."]


def _ctx(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_a_follow_up_under_triggered_restores_and_every_policy_gives_the_same_reply(cluster):
    chat = Chat(cluster.agent_address)
    results = {policy: chat.conversation(MESSAGES, _ctx(policy), policy)
               for policy in ("triggered", "resident", "cpu", "recompute")}
    (_, first), (_, second) = results["triggered"]
    assert first.kv_source == "none" and first.chunks_offloaded > 0 and first.bytes_offloaded > 0
    assert second.kv_source == "restored" and second.fallback_reason == ""
    assert second.bytes_restored > 0
    # the whole KV the first turn left in its slot came back; only the rest was prefilled
    assert second.tokens_reused == first.tokens_prefilled + first.tokens_out - 1
    new_tokens = len(chat.encode(MESSAGES[1], first)) + 1  # the new message and the last reply token
    assert second.tokens_prefilled == new_tokens
    assert {s.step for s in second.steps} >= {5, 6, 7, 8, 4}
    replies = {policy: [text for text, _ in turns] for policy, turns in results.items()}
    assert replies["resident"] == replies["triggered"] == replies["cpu"] == replies["recompute"]
    assert results["resident"][1][1].kv_source == "resident"
    assert results["cpu"][1][1].kv_source == "restored" and results["cpu"][1][1].bytes_restored > 0
    assert results["recompute"][1][1].kv_source == "recomputed"
    assert results["recompute"][1][1].tokens_reused == 0
    chat.close()


def test_twelve_sessions_on_four_slots_get_the_replies_they_get_alone(cluster):
    chat = Chat(cluster.agent_address)
    prompts = [f"Name one fact about the number {i}." for i in range(12)]
    follow = "Say it again in fewer words."
    alone = [[t for t, _ in chat.conversation([p, follow], _ctx("alone"), n=6)] for p in prompts]

    contexts = [_ctx("many") for _ in prompts]
    firsts = [chat.encode(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        turn1 = list(pool.map(lambda i: chat.turn(firsts[i], contexts[i], n=6), range(12)))
        seconds = [firsts[i] + list(turn1[i][1].output_token_ids) + chat.encode(follow, turn1[i][1])
                   for i in range(12)]
        turn2 = list(pool.map(lambda i: chat.turn(seconds[i], contexts[i], n=6), range(12)))
    together = [[turn1[i][0], turn2[i][0]] for i in range(12)]
    assert together == alone
    assert {rec.slot for _, rec in turn1 + turn2} <= {0, 1, 2, 3}
    assert all(rec.kv_source == "restored" for _, rec in turn2), [r.fallback_reason for _, r in turn2]
    chat.close()
