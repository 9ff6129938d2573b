"""The agent's ComputeNode proxy with a real agent process: step 5's lookup by content, the restore
asked for on the stream and served, steps 5 and 6 added to the record, the match-action table."""
from __future__ import annotations

import concurrent.futures
import threading

import grpc
import numpy as np
import pytest

from kvtb.rpc import add_port
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from tests.conftest import as_identity, secure_channel
from tests.smartnic.helpers import Pool, agent_env
from tests.smartnic.test_agent_service import CTX, IDS, USER


def turn(channel, user: str, context: str, token_ids) -> list[compute_pb2.TurnEvent]:
    stub = compute_pb2_grpc.ComputeNodeStub(channel)
    return list(stub.Generate(compute_pb2.TurnRequest(request_id="r1", user_id=user, context_id=context,
                                                      token_ids=token_ids, max_new_tokens=4), timeout=30))


def test_a_follow_up_finds_its_prefix_and_the_restore_lands(compute):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    events = turn(channel, USER, CTX, IDS + [11, 12, 13])
    record = events[-1].record
    assert events[0].token.text == "hi" and record.kv_source == "restored" and record.tokens_reused == len(IDS)
    assert not any(e.HasField("restore") for e in events)  # the agent took it: the frontend never sees one
    steps = {s.step: s for s in record.steps}
    assert sorted(steps) == [5, 6, 8] and steps[6].bytes > 0 and steps[5].service == "smartnic"
    assert steps[5].start_unix_ns <= steps[5].end_unix_ns and steps[6].start_unix_ns <= steps[6].end_unix_ns
    assert np.array_equal(pool.kv(4), pool.kv(0))
    events = turn(channel, USER, "ctx-new", [1, 2, 3])  # nothing stored: forwarded as is
    assert fake.requests[-1].stored_tokens == 0 and [s.step for s in events[-1].record.steps] == [5, 8]
    assert compute_pb2_grpc.ComputeNodeStub(channel).Info(compute_pb2.InfoRequest()).model == "fake"
    stats = smartnic_pb2_grpc.SmartNicStub(channel).Stats(smartnic_pb2.StatsRequest())
    assert (stats.hits, stats.misses, stats.prefetches) == (1, 1, 1)


def test_table_entries_decide_what_happens_to_a_turn(compute):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    turn(channel, "mallory", CTX, IDS)  # the same context id as alice's: mallory's own (empty) context
    assert fake.requests[-1].stored_tokens == 0
    table = smartnic_pb2_grpc.MatchActionStub(channel)
    exact = smartnic_pb2.FieldMatch.Exact
    deny, limit = table.Write(
        smartnic_pb2.WriteRequest(
            updates=[
                smartnic_pb2.Update(
                    type=smartnic_pb2.Update.INSERT,
                    entry=smartnic_pb2.TableEntry(
                        match=[smartnic_pb2.FieldMatch(field="user_id", exact=exact(value="eve"))],
                        priority=10,
                        action=smartnic_pb2.Action(type=smartnic_pb2.Action.DENY),
                    ),
                ),
                smartnic_pb2.Update(
                    type=smartnic_pb2.Update.INSERT,
                    entry=smartnic_pb2.TableEntry(
                        match=[
                            smartnic_pb2.FieldMatch(field="user_id", exact=exact(value="bob")),
                            smartnic_pb2.FieldMatch(
                                field="src_addr",
                                lpm=smartnic_pb2.FieldMatch.Lpm(prefix="127.0.0.0", prefix_len=8),
                            ),
                        ],
                        priority=5,
                        action=smartnic_pb2.Action(
                            type=smartnic_pb2.Action.RATE_LIMIT, rate_per_s=0.01, burst=1
                        ),
                    ),
                ),
            ]
        )
    ).entry_ids
    with pytest.raises(grpc.RpcError) as err:
        turn(channel, "eve", "c-eve", [1, 2])
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    turn(channel, "bob", "c-bob", [1, 2])
    with pytest.raises(grpc.RpcError) as err:
        turn(channel, "bob", "c-bob", [1, 2])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    read = table.Read(smartnic_pb2.ReadRequest(table="ingress"))
    hits = {e.entry_id: e.hit_count for e in read.entries}
    assert hits == {deny: 1, limit: 2} and read.default_hit_count == 1  # mallory matched the default
    assert read.default_action.type == smartnic_pb2.Action.PREFETCH_KV
    table.Write(
        smartnic_pb2.WriteRequest(
            updates=[
                smartnic_pb2.Update(
                    type=smartnic_pb2.Update.DELETE, entry=smartnic_pb2.TableEntry(entry_id=deny)
                )
            ]
        )
    )
    turn(channel, "eve", "c-eve", [1, 2])
    with pytest.raises(grpc.RpcError) as err:
        table.Write(
            smartnic_pb2.WriteRequest(
                updates=[
                    smartnic_pb2.Update(
                        type=smartnic_pb2.Update.MODIFY, entry=smartnic_pb2.TableEntry(entry_id=999)
                    )
                ]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    table.SetDefaultAction(
        smartnic_pb2.SetDefaultActionRequest(action=smartnic_pb2.Action(type=smartnic_pb2.Action.FORWARD))
    )
    turn(channel, USER, CTX, IDS + [7])
    assert fake.requests[-1].stored_tokens == 0  # FORWARD: no lookup, no restore
    assert smartnic_pb2_grpc.SmartNicStub(channel).Stats(smartnic_pb2.StatsRequest()).denied == 1


class HeldCompute(compute_pb2_grpc.ComputeNodeServicer):
    """A compute node whose turns all wait until `expected` of them have arrived at once, then answer."""

    def __init__(self, expected: int):
        self.arrived = threading.Semaphore(0)
        self.release = threading.Event()
        self.expected = expected

    def Generate(self, request, context):
        self.arrived.release()
        self.release.wait(timeout=60)
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=7, text="hi"))
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(request_id=request.request_id))


def test_turns_past_the_agents_worker_threads_all_reach_the_compute_node_at_once(start_service, storage):
    """The relay holds no thread per turn: 64 turns in flight through an agent with 4 worker threads."""
    turns, workers = 64, 4
    proc = start_service("agent", "serve", "smartnic", env=agent_env(storage, grpc_workers=workers))
    held = HeldCompute(turns)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(turns + 8))
    port = add_port(server, "127.0.0.1:0", as_identity("compute"))
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(held, server)
    server.start()
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    pool = Pool(smartnic_pb2_grpc.SmartNicStub(channel), compute_address=f"127.0.0.1:{port}")
    try:
        with concurrent.futures.ThreadPoolExecutor(turns) as clients:
            futures = [clients.submit(turn, channel, f"u{i}", f"c{i}", [1, 2, 3]) for i in range(turns)]
            for _ in range(turns):  # every turn reached the compute node before any was answered
                assert held.arrived.acquire(timeout=30), "a turn waited in the agent for a thread"
            stats = smartnic_pb2_grpc.SmartNicStub(channel).Stats(smartnic_pb2.StatsRequest(), timeout=10)
            assert stats.misses == turns  # the agent's other methods answer meanwhile
            held.release.set()
            replies = [f.result(timeout=60) for f in futures]
        assert all(r[0].token.text == "hi" and r[-1].record.replica == "replica-0" for r in replies)
    finally:
        held.release.set()
        pool.close()
        channel.close()
        server.stop(0)
