"""The engine's sampling through the node's gRPC service: every parameter per sequence in the batched
step (a tiny random Llama for plumbing; the real model, slow, where the behaviour matters)."""
from __future__ import annotations

import concurrent.futures
import copy
import time

import grpc
import pytest
import torch

from kvtb_proto import compute_pb2
from tests.compute_node.conftest import run_turn

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

PROMPT = list(range(300, 330))


def generate(node, ids=PROMPT, n=12, context="c", ignore_eos=True, **sampling):
    """(token events, record) of one turn."""
    request = compute_pb2.TurnRequest(request_id=f"r-{context}", user_id="u", context_id=context, token_ids=ids,
                                      max_new_tokens=n, policy="resident", ignore_eos=ignore_eos,
                                      sampling=compute_pb2.Sampling(**sampling))
    tokens, record = [], None
    for event in node.stub.Generate(request, timeout=120):
        if event.HasField("token"):
            tokens.append(event.token)
        elif event.HasField("record"):
            record = event.record
    return tokens, record


def ids_of(tokens):
    return [t.id for t in tokens]


def text_of(tokens):
    return "".join(t.text for t in tokens)


def test_a_logit_bias_of_100_makes_greedy_pick_its_token(make_node):
    node = make_node()
    plain, _ = generate(node)
    assert 4242 not in ids_of(plain)
    biased, rec = generate(node, logit_bias={4242: 100.0})
    assert ids_of(biased) == [4242] * 12 == list(rec.output_token_ids)


def test_stop_token_ids_end_the_reply_there_with_the_id_as_stop_reason(make_node):
    node = make_node()
    plain, _ = generate(node)
    stop = ids_of(plain)[4]
    first = ids_of(plain).index(stop)
    tokens, rec = generate(node, stop_token_ids=[stop])
    assert ids_of(tokens) == ids_of(plain)[:first + 1]
    assert (rec.finish_reason, rec.stop_reason) == ("stop", str(stop))
    tokens, rec = generate(node, stop_token_ids=[stop], min_tokens=first + 2)  # not before min_tokens
    assert len(tokens) > first + 1 and rec.tokens_out == len(tokens)


def test_min_tokens_holds_off_the_end_of_turn_however_likely(make_node):
    node = make_node()
    tokens, rec = generate(node, n=10, ignore_eos=False, min_tokens=6, logit_bias={2: 100.0})
    assert len(tokens) == 7 and ids_of(tokens)[-1] == 2 and 2 not in ids_of(tokens)[:6]
    assert (rec.finish_reason, rec.stop_reason, rec.tokens_out) == ("stop", "", 7)


def test_a_presence_penalty_changes_a_greedy_reply(make_node):
    node = make_node()
    favour = {4242: 1.0}  # a favourite the tiny model repeats (its logits span about 0.7)
    plain, _ = generate(node, n=16, logit_bias=favour)
    assert ids_of(plain) == [4242] * 16
    presence, _ = generate(node, n=16, logit_bias=favour, presence_penalty=2.0)
    frequency, _ = generate(node, n=16, logit_bias=favour, frequency_penalty=2.0)
    repetition, _ = generate(node, n=16, logit_bias=favour, repetition_penalty=2.0)
    for penalised in (presence, frequency, repetition):
        assert ids_of(penalised)[0] == 4242 and ids_of(penalised) != ids_of(plain)
    assert ids_of(presence).count(4242) == ids_of(frequency).count(4242) == 1  # 2 below its rivals once generated


def test_top_k_1_is_greedy_and_a_seed_reproduces_a_reply_whatever_shares_its_batch(make_node):
    node = make_node()
    plain, _ = generate(node)
    top1, _ = generate(node, temperature=1.0, top_k=1, seed=3)
    assert ids_of(top1) == ids_of(plain)
    mine = dict(temperature=1.5, top_p=0.95, top_k=50, min_p=0.001, seed=1234)
    alone, _ = generate(node, **mine)
    others = [dict(), dict(temperature=1.0, seed=1), dict(presence_penalty=1.0, logprobs=True),
              dict(temperature=0.8, seed=1234, logit_bias={5: 3.0})]
    with concurrent.futures.ThreadPoolExecutor(len(others) + 1) as pool:
        futures = [pool.submit(generate, node, list(range(400 + 9 * i, 430 + 9 * i)), 12, f"o{i}", True, **kw)
                   for i, kw in enumerate(others)]
        futures.append(pool.submit(generate, node, PROMPT, 12, "mine", True, **mine))
        results = [f.result() for f in futures]
    tokens, rec = results[-1]
    assert ids_of(tokens) == ids_of(alone) and ids_of(tokens) != ids_of(plain)
    assert max(r.batch_size for _, r in results) > 1


def test_logprobs_come_with_each_token_and_its_likeliest(make_node, tokenizer):
    node = make_node()
    tokens, _ = generate(node, n=6, logprobs=True, top_logprobs=5)
    for token in tokens:
        tops = [t.logprob for t in token.top_logprobs]
        assert token.logprob <= 0 and len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert token.top_logprobs[0].id == token.id and token.top_logprobs[0].logprob == token.logprob  # greedy
        assert token.piece == tokenizer.decode([token.id])
        assert all(t.piece == tokenizer.decode([t.id]) for t in token.top_logprobs)
    plain, _ = generate(node, n=6)
    assert ids_of(plain) == ids_of(tokens) and not plain[0].top_logprobs and plain[0].logprob == 0


def split_stop(tokens) -> tuple[str, int]:
    """A stop string across two consecutive tokens' texts (the end of one, the start of the next) that the
    reply's text holds first there; and how much text comes before it."""
    text = ""
    for a, b in zip(tokens, tokens[1:]):
        before = text + a.text
        text = before
        if len(a.text.strip()) >= 2 and len(b.text.strip()) >= 2:
            stop = a.text[-2:] + b.text[:2]
            if (before + b.text).find(stop) == len(before) - 2:
                return stop, len(before) - 2
    raise AssertionError("no two tokens with text in the reply")


def test_a_stop_string_across_two_tokens_ends_the_reply_and_is_not_streamed(make_node):
    node = make_node()
    plain, _ = generate(node, n=24)
    full = text_of(plain)
    stop, at = split_stop(plain)
    tokens, rec = generate(node, n=24, stop=[stop, "never in there \x00"])
    assert text_of(tokens) == full[:at] and (rec.finish_reason, rec.stop_reason) == ("stop", stop)
    assert ids_of(tokens) == list(rec.output_token_ids) == ids_of(plain)[:len(tokens)]  # every token generated
    assert len(tokens) < 24
    tokens, rec = generate(node, n=24, stop=[stop], include_stop_str_in_output=True)
    assert text_of(tokens) == full[:at + len(stop)] and rec.finish_reason == "stop"
    # the turn after a stop string's finish reuses the blocks as after any finish
    _, follow = generate(node, PROMPT + list(rec.output_token_ids) + [7, 8], n=4)
    assert follow.kv_source == "resident" and follow.tokens_reused > 0


def test_a_reply_ended_by_a_stop_string_stores_its_blocks_and_is_restored_as_any(make_node):
    plain, _ = generate(make_node(), n=24)
    stop, _ = split_stop(plain)
    node = make_node(nic=True)
    ids, rec, _ = run_turn(node, PROMPT, "ctx", "triggered", n=24, sampling=compute_pb2.Sampling(stop=[stop]))
    assert rec.finish_reason == "stop" and rec.stop_reason == stop and len(ids) < 24
    computed = len(PROMPT) + len(ids) - 1  # the last token has no KV, as after any finish
    assert rec.chunks_offloaded == -(-computed // node.settings.block_tokens)
    time.sleep(0.05)
    _, follow, _ = run_turn(node, PROMPT + ids + [7, 8], "ctx", "triggered", n=4)
    assert follow.kv_source == "restored" and follow.tokens_reused == computed, follow.fallback_reason


def test_a_seeded_reply_is_the_same_when_its_restore_left_the_batch_for_a_step(make_node):
    node = make_node(nic=True, restore_layer_wait_s=0.1)
    seeded = compute_pb2.Sampling(temperature=1.0, seed=99)
    first, _, _ = run_turn(node, PROMPT, "ctx", "triggered", n=10)
    time.sleep(0.05)
    follow = PROMPT + first + [7, 8, 9]
    reference, _, _ = run_turn(node, follow, "ref", "recompute", n=10, sampling=seeded)
    node.nic.group_delay_s = 0.5  # past the forward's wait: its first step in the batch is dropped
    tokens, rec, _ = run_turn(node, follow, "ctx", "triggered", n=10, sampling=seeded)
    assert rec.kv_source == "restored" and tokens == reference  # the dropped step drew nothing from its seed


def test_held_back_text_goes_out_at_the_end_when_no_stop_string_matched(make_node):
    node = make_node()
    plain, _ = generate(node, n=10)
    last = plain[-1].text or plain[-2].text
    tokens, rec = generate(node, n=10, stop=[last[-1] + "\x00never"])  # its start ends the reply's text
    assert text_of(tokens) == text_of(plain) and rec.finish_reason == "length" and not rec.stop_reason


BAD = [
    ("sampling.top_p", dict(top_p=1.5)),
    ("sampling.top_k", dict(top_k=-2)),
    ("sampling.min_p", dict(min_p=float("nan"))),
    ("sampling.presence_penalty", dict(presence_penalty=3.0)),
    ("sampling.frequency_penalty", dict(frequency_penalty=float("inf"))),
    ("sampling.repetition_penalty", dict(repetition_penalty=2.5)),
    ("sampling.logit_bias", dict(logit_bias={49152: 1.0})),
    ("sampling.logit_bias", dict(logit_bias={5: -101.0})),
    ("sampling.stop[0]", dict(stop=[""])),
    ("sampling.stop_token_ids", dict(stop_token_ids=[60000])),
    ("sampling.min_tokens", dict(min_tokens=13)),
    ("sampling.top_logprobs", dict(logprobs=True, top_logprobs=21)),
    ("sampling.top_logprobs", dict(top_logprobs=3)),
]


def test_each_bad_sampling_value_is_refused_naming_its_field(make_node):
    node = make_node()
    for field, sampling in BAD:
        with pytest.raises(grpc.RpcError) as info:
            generate(node, n=12, **sampling)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details(), field
    with pytest.raises(grpc.RpcError) as info:
        generate(node, ignore_eos=True, structured=compute_pb2.StructuredOutput(json_object=True))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ignore_eos" in info.value.details()
    tokens, rec = generate(node, top_k=10**6, temperature=1.0, seed=1)  # top_k past the vocabulary: off
    assert rec.tokens_out == len(tokens) == 12


def test_info_reports_the_sampling_defaults_the_models_generation_config_sets(make_node, tiny_model):
    from transformers import GenerationConfig
    node = make_node()
    assert dict(node.stub.Info(compute_pb2.InfoRequest()).generation_defaults) == {}
    model = copy.deepcopy(tiny_model)
    model.generation_config = GenerationConfig(temperature=0.6, top_p=0.9, top_k=20, do_sample=True)
    info = make_node(model=model).stub.Info(compute_pb2.InfoRequest())
    assert dict(info.generation_defaults) == pytest.approx({"temperature": 0.6, "top_p": 0.9, "top_k": 20.0})


def test_raw_text_and_a_continued_final_message_are_encoded(make_node, tokenizer):
    stub = make_node().stub
    raw = stub.EncodeChat(compute_pb2.EncodeChatRequest(text="Once upon a time"))
    assert list(raw.token_ids) == tokenizer.encode("Once upon a time", add_special_tokens=False)
    messages = [compute_pb2.ChatMessage(role="user", content="Say hi"),
                compute_pb2.ChatMessage(role="assistant", content="Hi there, I am")]
    ids = list(stub.EncodeChat(compute_pb2.EncodeChatRequest(messages=messages, continue_final_message=True)).token_ids)
    text = tokenizer.decode(ids)
    assert text.endswith("Hi there, I am") and tokenizer.eos_token_id not in ids[-3:]
    for request in (compute_pb2.EncodeChatRequest(messages=messages, continue_final_message=True,
                                                   add_generation_prompt=True),
                    compute_pb2.EncodeChatRequest(messages=messages[:1], continue_final_message=True),
                    compute_pb2.EncodeChatRequest(messages=messages, text="both")):
        with pytest.raises(grpc.RpcError) as info:
            stub.EncodeChat(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_structured_reply_follows_its_schema_and_ends_where_the_grammar_does(make_node):
    node = make_node()
    schema = '{"enum": ["yes", "no"]}'
    tokens, rec = generate(node, n=12, ignore_eos=False, structured=compute_pb2.StructuredOutput(json_schema=schema))
    assert text_of(tokens) in ('"yes"', '"no"') and ids_of(tokens)[-1] == 2 and rec.finish_reason == "stop"
    # min_tokens cannot hold off the grammar's end: the reply ends there all the same
    tokens, rec = generate(node, n=12, ignore_eos=False, min_tokens=10,
                           structured=compute_pb2.StructuredOutput(json_schema=schema))
    assert text_of(tokens) in ('"yes"', '"no"') and rec.finish_reason == "stop"
    with pytest.raises(grpc.RpcError) as info:
        generate(node, ignore_eos=False, structured=compute_pb2.StructuredOutput(json_schema="{not json"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "json_schema" in info.value.details()


# -- the real model (slow): behaviour a user would see

@pytest.fixture(scope="module")
def real_model():
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    model, _ = load_model(ComputeSettings().model_cache_dir, reference=True)
    return model


def chat(tokenizer, text: str) -> list[int]:
    from compute_node.chat_template import ChatEncoder
    return ChatEncoder(tokenizer).encode([{"role": "user", "content": text}])


@pytest.mark.slow
def test_real_model_penalties_stop_strings_seeds_and_logprobs(make_node, real_model, tokenizer):
    import math
    node = make_node(model=real_model, pool_tokens=2048, max_context_tokens=512)
    ids = chat(tokenizer, "List ten fruits, one per line.")
    plain, rec = generate(node, ids, n=48, ignore_eos=False)
    text = text_of(plain)
    penalised, _ = generate(node, ids, n=48, ignore_eos=False, presence_penalty=1.5, frequency_penalty=1.0)
    assert text_of(penalised) != text
    # a stop string that occurs: the reply ends before it, and it is not streamed
    lines = text.split("\n")
    stop = lines[2][:3]
    at = text.find(stop)
    stopped, rec = generate(node, ids, n=48, ignore_eos=False, stop=[stop])
    assert text_of(stopped) == text[:at] and (rec.finish_reason, rec.stop_reason) == ("stop", stop)
    # sampled with a seed: the same reply alone or beside another, another seed another reply
    kw = dict(temperature=1.0, top_p=0.95, seed=7)
    alone, _ = generate(node, ids, n=24, **kw)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        beside = pool.submit(generate, node, chat(tokenizer, "Hello!"), 24, "other", True, temperature=0.9, seed=1)
        again = pool.submit(generate, node, ids, 24, "again", True, **kw)
        assert ids_of(again.result()[0]) == ids_of(alone)
        beside.result()
    other, _ = generate(node, ids, n=24, temperature=1.0, top_p=0.95, seed=8)
    assert ids_of(other) != ids_of(alone)
    # logprobs: the model's own log probabilities (as transformers gives them), the greedy token the likeliest
    tokens, _ = generate(node, ids, n=8, logprobs=True, top_logprobs=20)
    assert ids_of(tokens) == ids_of(plain)[:8]
    with torch.inference_mode():
        logits = real_model(input_ids=torch.tensor([ids])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), dim=-1).topk(20)
    first = tokens[0].top_logprobs
    assert [t.id for t in first] == expected.indices.tolist()
    assert [t.logprob for t in first] == pytest.approx(expected.values.tolist(), abs=1e-3)
    for token in tokens:
        mass = sum(math.exp(t.logprob) for t in token.top_logprobs)
        assert token.top_logprobs[0].id == token.id and 0.0 < mass <= 1.0 + 1e-4


@pytest.mark.slow
def test_real_model_json_schema_reply_validates(make_node, real_model, tokenizer):
    import json
    node = make_node(model=real_model, pool_tokens=2048, max_context_tokens=512)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    ids = chat(tokenizer, "Describe a person named Ann who is 31, as JSON with name and age.")
    tokens, rec = generate(node, ids, n=64, ignore_eos=False,
                           structured=compute_pb2.StructuredOutput(json_schema=json.dumps(schema)))
    reply = json.loads(text_of(tokens))
    assert rec.finish_reason == "stop" and set(reply) == {"name", "age"} and isinstance(reply["age"], int)
