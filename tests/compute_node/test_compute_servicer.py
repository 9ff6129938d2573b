"""The ComputeNode service in-process with a tiny model: streaming, statuses, multiplexing."""
from __future__ import annotations

import grpc
import pytest

from kvtb_proto import compute_pb2, compute_pb2_grpc
from tests.conftest import secure_channel


def _stub(node):
    return compute_pb2_grpc.ComputeNodeStub(secure_channel(node.address, peer="compute"))


def _turn(stub, ids, ctx="c1", policy="", n=8, **kw):
    tokens, record = [], None
    for event in stub.Generate(compute_pb2.TurnRequest(request_id="r", user_id="u", context_id=ctx,
                                                       token_ids=ids, max_new_tokens=n, policy=policy, **kw),
                               timeout=60):
        if event.HasField("token"):
            tokens.append(event.token.id)
        else:
            record = event.record
    return tokens, record


def _code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_a_resident_follow_up_prefills_only_its_new_tokens(make_node):
    node = make_node(policy="resident")
    stub = _stub(node)
    ids = list(range(500, 530))
    tokens, rec = _turn(stub, ids, n=10)
    assert rec.kv_source == "none" and rec.tokens_prefilled == 30 and rec.tokens_out == len(tokens)
    assert list(rec.output_token_ids) == tokens and rec.ttft_ms > 0
    follow = ids + tokens + list(range(600, 605))
    tokens2, rec2 = _turn(stub, follow, n=10)
    assert rec2.kv_source == "resident" and rec2.tokens_reused == (30 + len(tokens) - 1) // 8 * 8  # full blocks
    assert rec2.tokens_prefilled == len(follow) - rec2.tokens_reused
    _, again = _turn(stub, follow, n=10, policy="recompute")
    assert again.kv_source == "recomputed" and list(again.output_token_ids) == tokens2
    stats = stub.Stats(compute_pb2.ComputeStatsRequest())
    assert stats.turns == 3 and stats.kv_source_counts["resident"] == 1


def test_bad_input_gets_a_clear_status_and_the_node_goes_on(make_node):
    node = make_node()
    stub = _stub(node)
    code, msg = _code(lambda: _turn(stub, [1, 2, 99999]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "token_ids[2] = 99999" in msg
    code, msg = _code(lambda: _turn(stub, list(range(300))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == ("This model's maximum context length is 256 "
                                                                "tokens. However, you requested 300 tokens in "
                                                                "the messages. Please reduce the length of the "
                                                                "messages.")
    code, msg = _code(lambda: _turn(stub, []))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "empty" in msg
    code, msg = _code(lambda: _turn(stub, [1, 2], policy="magic"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown policy" in msg
    code, msg = _code(lambda: _turn(stub, [1, 2], policy="triggered"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "agent" in msg
    code, msg = _code(lambda: _turn(stub, [1, 2], stored_tokens=3))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "stored_tokens (3)" in msg
    code, msg = _code(lambda: stub.Decode(compute_pb2.DecodeRequest(token_ids=[49152])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, msg = _code(lambda: stub.EncodeChat(compute_pb2.EncodeChatRequest(
        messages=[compute_pb2.ChatMessage(role="robot", content="x")])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "role" in msg
    tokens, rec = _turn(stub, [1, 2, 3])
    assert rec.tokens_out == len(tokens) > 0
    info = stub.Info(compute_pb2.InfoRequest())
    assert info.num_blocks == 64 and info.block_tokens == 8 and info.vocab_size == 49152
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4 and "resident" in info.policies


def test_sampling_values_are_checked_before_torch(make_node):
    stub = _stub(make_node())
    nan, inf = float("nan"), float("inf")
    for sampling in (compute_pb2.Sampling(temperature=nan), compute_pb2.Sampling(temperature=inf),
                     compute_pb2.Sampling(temperature=-1e-300), compute_pb2.Sampling(top_p=nan),
                     compute_pb2.Sampling(temperature=1.0, top_p=inf)):
        code, msg = _code(lambda sampling=sampling: _turn(stub, [1, 2, 3], sampling=sampling))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "sampling." in msg
    # overflowing logits / temperature: sampled at the smallest safe temperature, not NaN
    tokens, rec = _turn(stub, [1, 2, 3], sampling=compute_pb2.Sampling(temperature=1e-300, seed=2**64 - 1))
    assert rec.tokens_out == len(tokens) > 0


def test_past_the_queue_bound_a_turn_gets_resource_exhausted(make_node):
    node = make_node(max_num_seqs=1, max_num_batched_tokens=8, queue_bound=1)
    stub = _stub(node)
    running = stub.Generate(compute_pb2.TurnRequest(user_id="u", context_id="x", token_ids=[1, 2],
                                                    max_new_tokens=200, ignore_eos=True))
    next(running)  # it runs: the batch of one is full
    waiting = stub.Generate(compute_pb2.TurnRequest(user_id="u", context_id="y", token_ids=[1, 2]))
    import time
    deadline = time.monotonic() + 5
    while stub.Stats(compute_pb2.ComputeStatsRequest()).num_requests_waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    code, msg = _code(lambda: _turn(stub, [1, 2], ctx="z"))
    # the intake's bound, or the scheduler's (the same number) when the waiting turn was between the two
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and ("queue_bound" in msg or "max_waiting 1" in msg), msg
    waiting.cancel()
    running.cancel()


def test_only_the_agent_may_send_turns_to_the_node(make_node):
    from kvtb.rpc import Security, channel
    node = make_node()
    request = compute_pb2.TurnRequest(request_id="r", user_id="alice", context_id="c", token_ids=[1, 2])
    for identity in ("frontend", "storage", "compute"):
        with secure_channel(node.address, peer="compute", identity=identity) as ch:
            with pytest.raises(grpc.RpcError) as err:
                list(compute_pb2_grpc.ComputeNodeStub(ch).Generate(request, timeout=10))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, identity
            with pytest.raises(grpc.RpcError) as err:
                compute_pb2_grpc.ComputeNodeStub(ch).Decode(compute_pb2.DecodeRequest(token_ids=[1]), timeout=10)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, identity
    with channel(node.address, Security.off()) as ch, pytest.raises(grpc.RpcError) as err:
        compute_pb2_grpc.ComputeNodeStub(ch).Info(compute_pb2.InfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with secure_channel(node.address, peer="compute", identity="smartnic") as ch:
        assert compute_pb2_grpc.ComputeNodeStub(ch).Decode(compute_pb2.DecodeRequest(token_ids=[1]), timeout=10)
