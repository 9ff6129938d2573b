"""vLLM's /tokenize and /detokenize bodies as compute-node requests."""
import json

import pytest

from chat_frontend import tokenize_format as tf
from chat_frontend.errors import ChatError


def raw(**body) -> bytes:
    return json.dumps(body).encode()


def refused(parse, **body) -> str:
    with pytest.raises(ChatError) as info:
        parse(raw(**body))
    assert info.value.code == "INVALID_ARGUMENT"
    return info.value.param


def test_a_prompt_is_raw_text_with_special_tokens_by_default():
    req = tf.parse_tokenize(raw(model="m", prompt="hi there", return_token_strs=True))
    assert req.model == "m" and req.return_token_strs
    assert req.encode.text == "hi there" and req.encode.add_special_tokens and not req.encode.messages
    assert not tf.parse_tokenize(raw(prompt="x", add_special_tokens=False)).encode.add_special_tokens


def test_messages_go_through_the_template():
    req = tf.parse_tokenize(raw(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                                add_generation_prompt=False, continue_final_message=True))
    assert [(m.role, m.content) for m in req.encode.messages] == [("user", "a"), ("assistant", "b")]
    assert req.encode.continue_final_message and not req.encode.add_generation_prompt and req.model is None
    assert tf.parse_tokenize(raw(messages=[{"role": "user", "content": "a"}])).encode.add_generation_prompt


def test_tokenize_refusals_name_the_field():
    assert refused(tf.parse_tokenize) == "prompt"  # neither
    assert refused(tf.parse_tokenize, prompt="a", messages=[]) == "prompt"  # both
    assert refused(tf.parse_tokenize, prompt=["a"]) == "prompt"
    assert refused(tf.parse_tokenize, prompt="a", add_generation_prompt=True) == "add_generation_prompt"
    assert refused(tf.parse_tokenize, messages=[{"role": "user", "content": "a"}],
                   add_special_tokens=True) == "add_special_tokens"
    assert refused(tf.parse_tokenize, prompt="a", chat_template="x") == "chat_template"
    assert refused(tf.parse_tokenize, prompt="a", tools=[{"type": "function"}]) == "tools"
    assert refused(tf.parse_tokenize, prompt="a", other=1) == "other"
    assert refused(tf.parse_tokenize, prompt="a", model=3) == "model"
    assert tf.parse_tokenize(raw(prompt="a", tools=[], chat_template=None)).encode.text == "a"


def test_detokenize():
    assert tf.parse_detokenize(raw(model="m", tokens=[1, 2])) == ("m", [1, 2])
    assert tf.parse_detokenize(raw(tokens=[])) == (None, [])
    for body in [{}, {"tokens": "12"}, {"tokens": [1.5]}, {"tokens": [True]}, {"tokens": [-1]},
                 {"tokens": [0] * (tf.MAX_DETOKENIZE_TOKENS + 1)}]:
        assert refused(tf.parse_detokenize, **body) == "tokens"
    assert refused(tf.parse_detokenize, tokens=[1], prompt="x") == "prompt"


def test_tokenize_response_is_vllms():
    assert tf.tokenize_response([5, 6], 8192, None) == {"count": 2, "max_model_len": 8192, "tokens": [5, 6],
                                                        "token_strs": None}
