"""The agent's ComputeNode proxy: match-action, owner check, prefetch into a reserved slot, steps 5 and 6.

The test process plays the compute node: it owns the region and serves a fake ComputeNode.
"""
from __future__ import annotations

import concurrent.futures
import time

import grpc
import numpy as np
import pytest

from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
from tests.smartnic.helpers import LAYOUT, Pool, agent_env, storage_env
from tests.smartnic.test_agent_service import CTX, IDS, USER, offload
from kvtb.rpc import add_port
from tests.conftest import as_identity, secure_channel

SLOT = 1


class FakeComputeNode(compute_pb2_grpc.ComputeNodeServicer):
    """Reserves slot 1, waits for a restore like the real node, answers one token and a record."""

    def __init__(self):
        self.pool: Pool | None = None
        self.seen: list[compute_pb2.TurnRequest] = []
        self.restored_ids: list[int] = []

    def ReserveSlot(self, request, context):
        return compute_pb2.ReserveSlotResponse(reserved=True, slot=SLOT, region_id=self.pool.region_id,
                                               restore_counter=LAYOUT.restore_counter(SLOT))

    def Generate(self, request, context):
        self.seen.append(request)
        source = "none"
        if request.has_restore:
            r = request.restore
            _, error = self.pool.wait_counter(r.completion_counter, r.threshold, timeout_s=5)
            assert error == r.error_base
            self.restored_ids = list(self.pool.token_ids(r.slot)[:r.tokens_announced])
            source = "restored"
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=7, text="hi"))
        now = time.time_ns()
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, kv_source=source, tokens_reused=request.restore.tokens_announced,
            steps=[compute_pb2.Step(step=8, name="inference", start_unix_ns=now, end_unix_ns=now)]))

    def Info(self, request, context):
        return compute_pb2.InfoResponse(model="fake", num_slots=LAYOUT.num_slots)


@pytest.fixture
def setup(start_service, tmp_path):
    storage = [("s0", start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0")))]
    agent = start_service("agent", "serve", "smartnic", env=agent_env(storage))
    fake = FakeComputeNode()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(fake, server)
    port = add_port(server, "127.0.0.1:0", as_identity("compute"))  # the fake compute node, with its certificate
    server.start()
    channel = secure_channel(agent.addresses["grpc"], peer="smartnic")
    fake.pool = Pool(smartnic_pb2_grpc.SmartNicStub(channel), compute_address=f"127.0.0.1:{port}")
    yield fake, channel
    fake.pool.close()
    channel.close()
    server.stop(0)


def turn(channel, user: str, context: str, token_ids) -> list[compute_pb2.TurnEvent]:
    stub = compute_pb2_grpc.ComputeNodeStub(channel)
    return list(
        stub.Generate(
            compute_pb2.TurnRequest(
                request_id="r1",
                user_id=user,
                context_id=context,
                token_ids=[int(t) for t in token_ids],
                max_new_tokens=4,
            )
        )
    )


def test_follow_up_is_prefetched_into_a_reserved_slot(setup):
    fake, channel = setup
    offload(fake.pool)
    events = turn(channel, USER, CTX, list(IDS) + [11, 12, 13])
    record = events[-1].record
    assert events[0].token.text == "hi" and record.kv_source == "restored" and record.tokens_reused == 64
    assert fake.restored_ids == list(IDS)
    steps = {s.step: s for s in record.steps}
    assert sorted(steps) == [5, 6, 8] and steps[6].bytes > 0 and steps[5].service == "smartnic"
    assert steps[5].start_unix_ns <= steps[5].end_unix_ns and steps[6].start_unix_ns <= steps[6].end_unix_ns
    assert np.array_equal(fake.pool.kv(SLOT), fake.pool.kv(0))
    # a new context: nothing to prefetch, forwarded as is
    events = turn(channel, USER, "ctx-new", [1, 2, 3])
    assert not fake.seen[-1].has_restore and [s.step for s in events[-1].record.steps] == [5, 8]
    info = compute_pb2_grpc.ComputeNodeStub(channel).Info(compute_pb2.InfoRequest())
    assert info.model == "fake"
    stats = smartnic_pb2_grpc.SmartNicStub(channel).Stats(smartnic_pb2.StatsRequest())
    assert (stats.hits, stats.misses, stats.prefetches) == (1, 0, 1)


def test_other_users_context_and_table_entries(setup):
    fake, channel = setup
    offload(fake.pool)
    with pytest.raises(grpc.RpcError) as err:
        turn(channel, "mallory", CTX, IDS)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "another user" in err.value.details()
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
    turn(channel, USER, CTX, IDS)
    assert not fake.seen[-1].has_restore  # FORWARD: no prefetch
    assert smartnic_pb2_grpc.SmartNicStub(channel).Stats(smartnic_pb2.StatsRequest()).denied == 2
