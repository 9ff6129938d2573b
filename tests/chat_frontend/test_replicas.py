"""Several replicas as one agent: routing, failover before and after the first token, the health loop.

In-process fakes of the replicas' clients here; real gRPC to fake agents in test_replicas_grpc.py.
"""
import asyncio

import pytest

from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.replicas import Replica, Replicas, sum_stats
from chat_frontend.routing import Route
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb.rpc import Security
from kvtb_proto import compute_pb2, frontend_pb2

from .fakes import FakeEngine


class FakeReplica(FakeEngine):
    """A replica's client: FakeEngine's turns; `down` refuses everything, `fail_after` tokens then
    UNAVAILABLE, `hang` never answers a turn; `stats` are its compute node's figures."""

    def __init__(self, address: str):
        super().__init__()
        self.address = address
        self.model = "fake"
        self.down = False
        self.fail_after: int | None = None
        self.hang = False
        self.stats = compute_pb2.ComputeStatsResponse()

    def _check(self):
        if self.down:
            raise ChatError("UNAVAILABLE", f"the agent at {self.address} cannot be reached: connection refused")

    async def info(self, timeout_s: float = 10.0):
        self._check()
        return await super().info()

    async def encode_chat(self, request):
        self._check()
        return await super().encode_chat(request)

    async def generate(self, request, route=None):
        self.turns.append(request)
        self._check()
        if self.hang:
            await asyncio.Event().wait()
        sent = 0
        async for event in FakeEngine().generate(request):
            if event.HasField("token"):
                if self.fail_after is not None and sent >= self.fail_after:
                    raise ChatError("UNAVAILABLE", f"the agent at {self.address} cannot be reached: reset")
                sent += 1
            yield event

    async def compute_stats(self, timeout_s: float = 5.0):
        self._check()
        return self.stats

    async def agent_stats(self, timeout_s: float = 5.0):
        raise NotImplementedError

    async def close(self):
        pass


def make(n: int = 2, policy: str = "round_robin", threshold: int = 4):
    fakes = [FakeReplica(f"10.0.0.{i}:50051") for i in range(n)]
    replicas = Replicas([Replica(f"replica-{i}", f) for i, f in enumerate(fakes)], Security(None), policy,
                        threshold, health_timeout_s=0.5)
    return replicas, fakes


def turn(replicas: Replicas, user="alice", token_ids=(1, 2, 3), route=None) -> list:
    request = compute_pb2.TurnRequest(request_id="r", user_id=user, tenant="default", token_ids=token_ids,
                                      max_new_tokens=4)

    async def go():
        return [e async for e in replicas.generate(request, route)]
    return asyncio.run(go())


def test_a_replica_down_before_the_first_token_is_retried_once_on_another():
    replicas, fakes = make()
    fakes[0].down = True
    route = Route()
    events = turn(replicas, route=route)
    assert events[-1].record.replica == "replica-1"
    assert (route.replica, route.retried_from) == ("replica-1", "replica-0")
    assert len(fakes[0].turns) == 1 and len(fakes[1].turns) == 1
    assert replicas.figures() == {"up": {"replica-0": 0, "replica-1": 1},
                                  "turns": {"replica-0": 0, "replica-1": 1}, "retries": 1}
    route = Route()
    turn(replicas, route=route)  # out of the rotation: not tried again
    assert (route.replica, route.retried_from) == ("replica-1", "")
    assert len(fakes[0].turns) == 1


def test_both_down_is_unavailable_naming_them():
    replicas, fakes = make()
    fakes[0].down = fakes[1].down = True
    with pytest.raises(ChatError) as err:
        turn(replicas)
    assert err.value.code == "UNAVAILABLE" and "10.0.0.1:50051 cannot be reached" in err.value.message
    with pytest.raises(ChatError) as err:
        turn(replicas)
    assert err.value.code == "UNAVAILABLE"
    assert err.value.message.startswith("no replica is in the rotation")
    assert "replica-0 at 10.0.0.0:50051" in err.value.message and "replica-1 at 10.0.0.1:50051" in err.value.message


def test_a_replica_failing_mid_reply_is_a_clear_unavailable_and_not_retried():
    replicas, fakes = make()
    fakes[0].fail_after = 1
    with pytest.raises(ChatError) as err:
        turn(replicas)
    assert err.value.code == "UNAVAILABLE"
    assert "replica replica-0 failed mid-reply" in err.value.message
    assert "the next turn goes to replica-1, which restores the conversation's KV from storage" in err.value.message
    assert fakes[1].turns == [] and replicas.retries == 0
    assert not replicas.replicas[0].up
    assert turn(replicas)[-1].record.replica == "replica-1"


def test_a_turn_waiting_on_a_replica_that_leaves_the_rotation_goes_to_another():
    replicas, fakes = make()
    fakes[0].hang = True

    async def go():
        route = Route()
        request = compute_pb2.TurnRequest(request_id="r", user_id="u", token_ids=[1, 2], max_new_tokens=4)
        task = asyncio.ensure_future(_collect(replicas.generate(request, route)))
        await asyncio.sleep(0.05)
        assert not task.done()
        fakes[0].down = True
        assert await replicas.probe_all()  # the health loop's probe takes replica-0 out
        events = await asyncio.wait_for(task, 5)
        return route, events
    route, events = asyncio.run(go())
    assert (route.replica, route.retried_from) == ("replica-1", "replica-0")
    assert events[-1].record.replica == "replica-1"


async def _collect(stream) -> list:
    return [e async for e in stream]


def test_the_health_loop_takes_a_replica_out_and_puts_it_back():
    replicas, fakes = make()

    class Health:
        serving = False

        def set_serving(self):
            self.serving = True

    async def go():
        fakes[0].down = fakes[1].down = True
        health = Health()
        loop = asyncio.ensure_future(replicas.run(health, interval_s=0.02, retry_s=0.02))
        await asyncio.sleep(0.1)
        assert not health.serving and [r.up for r in replicas.replicas] == [False, False]
        fakes[1].down = False
        fakes[1].stats = compute_pb2.ComputeStatsResponse(num_requests_running=3, num_requests_waiting=1)
        await asyncio.sleep(0.1)
        assert health.serving and [r.up for r in replicas.replicas] == [False, True]
        assert replicas.replicas[1].load().sequences == 4  # its figures feed least_loaded
        fakes[0].down = False
        await asyncio.sleep(0.1)
        assert [r.up for r in replicas.replicas] == [True, True]
        fakes[1].down = True
        await asyncio.sleep(0.1)
        assert [r.up for r in replicas.replicas] == [True, False]
        assert "health probe" in replicas.replicas[1].reason
        loop.cancel()
    asyncio.run(go())


def test_least_loaded_uses_the_figures_and_the_turns_sent_since():
    replicas, fakes = make(policy="least_loaded")
    fakes[0].stats = compute_pb2.ComputeStatsResponse(num_requests_running=2)
    fakes[1].stats = compute_pb2.ComputeStatsResponse(num_requests_waiting=0)
    asyncio.run(replicas.probe_all())
    served = [turn(replicas)[-1].record.replica for _ in range(4)]
    # 2 running on replica-0: replica-1 twice (0, then 1 sent), then a tie at 2 each, in turn
    assert served == ["replica-1", "replica-1", "replica-0", "replica-1"]


def test_kv_aware_sends_a_conversation_back_to_its_replica_and_elsewhere_when_it_is_down():
    replicas, fakes = make(policy="kv_aware")
    alice = list(range(100, 164))  # two blocks
    bob = list(range(100, 164))    # the same tokens: another owner
    first = turn(replicas, "alice", alice)[-1].record.replica
    assert first == "replica-0"
    bob_at = turn(replicas, "bob", bob)[-1].record.replica
    assert bob_at == "replica-1"  # nothing of bob's anywhere: the least loaded (in turn)
    follow_up = alice + [11, 2] + list(range(500, 540))
    assert [turn(replicas, "alice", follow_up)[-1].record.replica for _ in range(3)] == ["replica-0"] * 3
    fakes[0].down = True
    asyncio.run(replicas.probe_all())
    route = Route()
    assert turn(replicas, "alice", follow_up, route)[-1].record.replica == "replica-1"
    assert route.retried_from == ""  # it was out of the rotation: never tried


def test_compute_stats_add_up_over_the_replicas_that_answer():
    replicas, fakes = make(3)
    fakes[0].stats = compute_pb2.ComputeStatsResponse(turns=2, num_requests_running=1, kv_cache_usage_perc=0.5,
                                                      kv_source_counts={"resident": 1})
    fakes[1].stats = compute_pb2.ComputeStatsResponse(turns=3, num_requests_running=2, kv_cache_usage_perc=0.1,
                                                      kv_source_counts={"resident": 2, "restored": 1})
    fakes[2].down = True
    total = asyncio.run(replicas.compute_stats())
    assert (total.turns, total.num_requests_running) == (5, 3)
    assert total.kv_cache_usage_perc == pytest.approx(0.3)
    assert dict(total.kv_source_counts) == {"resident": 3, "restored": 1}
    assert sum_stats([]).turns == 0


def test_info_and_encoding_fail_over_and_a_lone_replica_is_always_tried():
    replicas, fakes = make()
    fakes[0].down = True
    ids = asyncio.run(replicas.encode_chat(compute_pb2.EncodeChatRequest(
        messages=[compute_pb2.ChatMessage(role="user", content="hi there")])))
    assert ids and len(fakes[1].encoded) == 1 and not replicas.replicas[0].up
    lone, (fake,) = make(1)
    fake.down = True
    for _ in range(2):  # each time its own error, not "no replica in the rotation"
        with pytest.raises(ChatError, match="the agent at 10.0.0.0:50051 cannot be reached"):
            turn(lone)
    fake.down = False
    assert turn(lone)[-1].record.replica == "replica-0"


def test_the_turn_summary_names_the_replica_the_retry_and_the_kv_origin(tmp_path):
    replicas, fakes = make()
    fakes[0].fail_after = 0  # it encodes, then fails the turn before its first token
    settings = FrontendSettings(data_dir=str(tmp_path), users={"alice": "ta"})
    service = ChatService(settings, SessionStore(settings.db_path), replicas)

    async def go():
        request = frontend_pb2.ChatRequest(token="ta", message="hello", max_new_tokens=4)
        return [e async for e in service.chat(request)]
    summary = asyncio.run(go())[-1].summary
    assert (summary.replica, summary.retried_from, summary.kv_origin) == ("replica-1", "replica-0", "recompute")


def test_a_requests_choices_go_to_its_first_choices_replica_whatever_the_policy(tmp_path):
    replicas, fakes = make(3, policy="round_robin")
    settings = FrontendSettings(data_dir=str(tmp_path), users={"alice": "ta"})
    service = ChatService(settings, SessionStore(settings.db_path), replicas)

    async def go():
        request = frontend_pb2.ChatRequest(token="ta", message="hello", max_new_tokens=4, n=3,
                                           sampling=compute_pb2.Sampling(temperature=1.0, seed=7))
        return [e.summary for e in [e async for e in service.chat(request)] if e.HasField("summary")]
    summaries = asyncio.run(go())
    assert [s.choice for s in summaries] == [0, 1, 2]
    assert {s.replica for s in summaries} == {"replica-0"}
    assert [len(f.turns) for f in fakes] == [3, 0, 0]
    summaries = asyncio.run(go())  # the next request: the next replica, all its choices there
    assert {s.replica for s in summaries} == {"replica-1"} and [len(f.turns) for f in fakes] == [3, 3, 0]


def test_the_replicas_pacers_add_up_as_one_under_a_profile():
    import json
    one = {"profile": "p", "dilation": 2.0, "kinds": {"gpu_step": {"ops": 3, "violations": 1, "real_s": 1.0,
                                                                  "modeled_s": 1.0, "overrun_s": 0.1,
                                                                  "worst_ratio": 4.0}}}
    two = {"profile": "p", "dilation": 2.0, "kinds": {"gpu_step": {"ops": 5, "violations": 0, "real_s": 1.0,
                                                                  "modeled_s": 2.0, "overrun_s": 0.0,
                                                                  "worst_ratio": 1.0}}}
    merged = sum_stats([compute_pb2.ComputeStatsResponse(turns=1, pacing_json=json.dumps(one)),
                        compute_pb2.ComputeStatsResponse(turns=2, pacing_json=json.dumps(two))])
    assert merged.turns == 3
    kinds = json.loads(merged.pacing_json)["kinds"]["gpu_step"]
    assert kinds["ops"] == 8 and kinds["violations"] == 1 and kinds["worst_ratio"] == 4.0
    assert sum_stats([compute_pb2.ComputeStatsResponse(turns=1)]).pacing_json == ""  # real time
