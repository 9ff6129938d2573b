"""The real model with real agent and storage processes: restores, policies, multiplexing."""
from __future__ import annotations

import concurrent.futures
import uuid

import pytest

from tests.compute_node.conftest import Chat
from tests.kvtb.metrics_scrape import scrape, value

pytestmark = [pytest.mark.service, pytest.mark.slow]

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


def compute_calls(agent) -> float:
    """Every call the compute node made to the agent so far, as the agent counts them (its /metrics)."""
    return sum(v for (name, labels), v in scrape(agent.addresses["metrics"]).items()
               if name == "kvtb:agent_rpc_calls_total" and dict(labels)["peer"] == "compute")


def test_the_compute_node_calls_the_agent_never_while_a_conversation_decodes(cluster):
    """Two turns under triggered: blocks leave by descriptor and counter store, the follow-up's KV comes
    back on the turn's own stream; the agent counts no call from the compute node in between."""
    from kvtb_proto import compute_pb2
    chat = Chat(cluster.agent_address)
    before = scrape(cluster.agent.addresses["metrics"])
    registered = value(before, "kvtb:agent_rpc_calls_total", method="/kvtb.smartnic.SmartNic/RegisterMemory",
                       peer="compute")
    assert registered >= 1  # the counter sees the compute node's calls
    context, ids, previous, seen, records = _ctx("quiet"), [], None, [], []
    for message in MESSAGES:
        ids = ids + (list(previous.output_token_ids) if previous else []) + chat.encode(message, previous)
        request = compute_pb2.TurnRequest(request_id=f"{context}-{len(ids)}", user_id=chat.user, context_id=context,
                                          token_ids=ids, max_new_tokens=64, policy="triggered", ignore_eos=True)
        tokens = 0
        for event in chat.stub.Generate(request, timeout=300):
            if event.HasField("token"):
                tokens += 1
                if tokens == 1:
                    seen.append(("first token", compute_calls(cluster.agent)))
            elif event.HasField("record"):
                previous = event.record
                records.append(previous)
                seen.append(("after the last token", compute_calls(cluster.agent)))
        assert tokens >= 32, tokens
    assert len(seen) == 4 and len({calls for _, calls in seen}) == 1, seen
    after = scrape(cluster.agent.addresses["metrics"])
    assert value(after, "kvtb:agent_rpc_calls_total", method="/kvtb.compute.ComputeNode/Generate",
                 peer="operator") >= value(before, "kvtb:agent_rpc_calls_total",
                                           method="/kvtb.compute.ComputeNode/Generate", peer="operator") + 2
    first, second = records
    assert first.chunks_offloaded > 0 and second.chunks_offloaded > 0, (first, second)  # during the decodes
    assert second.kv_source == "restored" and second.bytes_restored > 0, second.fallback_reason
    assert value(after, "kvtb:triggered_ops_fired_total") >= \
        value(before, "kvtb:triggered_ops_fired_total") + first.chunks_offloaded + second.chunks_offloaded
    chat.close()


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    """A cluster whose compute node's pool (24 blocks of 32 tokens) is smaller than 12 sessions need."""
    from tests.compute_node.conftest import start_cluster, stop_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("small"), "small", KVTB_COMPUTE_POOL_TOKENS="768")
    yield cluster
    stop_cluster(cluster)


def twelve_sessions(chat, policy: str):
    """12 two-turn conversations at once: [(turn 1, turn 2)] of (text, record)."""
    prompts = [f"Name one fact about the number {i}, in a full sentence." for i in range(12)]
    follow = "Say it again in fewer words."
    contexts = [_ctx(f"many-{policy}") for _ in prompts]
    firsts = [chat.encode(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        turn1 = list(pool.map(lambda i: chat.turn(firsts[i], contexts[i], policy, n=40), range(12)))
        seconds = [firsts[i] + list(turn1[i][1].output_token_ids) + chat.encode(follow, turn1[i][1])
                   for i in range(12)]
        turn2 = list(pool.map(lambda i: chat.turn(seconds[i], contexts[i], policy, n=40), range(12)))
    return list(zip(turn1, turn2))


@pytest.mark.parametrize("policy, kind", [("triggered", "swap"), ("recompute", "recompute")])
def test_twelve_sessions_on_a_small_pool_are_preempted_and_all_finish(small_pool, policy, kind):
    from kvtb_proto import compute_pb2, smartnic_pb2, smartnic_pb2_grpc
    chat = Chat(small_pool.agent_address)
    before = chat.stub.Stats(compute_pb2.ComputeStatsRequest())
    results = twelve_sessions(chat, policy)
    after = chat.stub.Stats(compute_pb2.ComputeStatsRequest())
    assert all(rec.tokens_out > 0 and rec.finish_reason in ("stop", "length") for pair in results for _, rec in pair)
    assert after.preemptions[kind] > before.preemptions[kind], after
    assert sum(rec.preemptions for pair in results for _, rec in pair) >= after.preemptions[kind] - before.preemptions[kind]
    assert max(rec.batch_size for pair in results for _, rec in pair) > 1
    if policy == "triggered":
        agent = smartnic_pb2_grpc.SmartNicStub(chat.channel).Stats(smartnic_pb2.StatsRequest())
        assert all(second.kv_source == "restored" for _, (_, second) in results), \
            ([(second.kv_source, second.fallback_reason) for _, (_, second) in results], agent.errors_by_kind)
        assert not {"mac_mismatch", "crc_mismatch", "bad_header"} & set(agent.errors_by_kind), agent.errors_by_kind
    chat.close()
