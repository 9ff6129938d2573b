import pytest

from chat_frontend import limits
from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2


def refusal(fn, *args) -> ChatError:
    with pytest.raises(ChatError) as err:
        fn(*args)
    assert err.value.code == "INVALID_ARGUMENT"
    return err.value


def test_a_grpc_message_may_be_long_but_not_empty():
    err = refusal(limits.check_message, "  \n")
    assert err.message == "message is empty" and err.param == "message"
    limits.check_message("x" * 100_000)  # bounded in tokens, against the context, later


def test_n_is_one_to_max_n():
    assert (limits.check_n(0, 8), limits.check_n(1, 8), limits.check_n(8, 8)) == (1, 1, 8)
    assert refusal(limits.check_n, 9, 8).param == "n"


def fit(prompt, context, requested=None, **kw) -> int:
    return limits.max_new_tokens(prompt, context, requested, **kw)


def overflow(*args, **kw) -> ChatError:
    with pytest.raises(ChatError) as err:
        fit(*args, **kw)
    assert (err.value.code, err.value.openai_code) == ("INVALID_ARGUMENT", "context_length_exceeded")
    return err.value


def test_absent_max_tokens_is_what_the_context_leaves_lowered_by_the_settings():
    assert fit(100, 8192) == 8092  # vLLM's get_max_tokens: max_model_len - prompt
    assert fit(100, 8192, default=256) == 256 and fit(8000, 8192, default=256) == 192
    assert fit(100, 8192, cap=1024) == 1024 and fit(100, 8192, default=2048, cap=1024) == 1024
    assert fit(8191, 8192) == 1  # the last token the context holds


def test_a_requested_max_tokens_must_fit_beside_the_prompt_and_the_cap_lowers_it():
    assert fit(100, 8192, 4096) == 4096 and fit(100, 8192, 8092) == 8092
    assert fit(100, 8192, 4096, default=16) == 4096  # the default is for a request that gives none
    assert fit(100, 8192, 4096, cap=1024) == 1024   # lowered, not refused (vLLM's override_max_tokens)
    err = overflow(100, 8192, 8093)
    assert err.param == "max_tokens" and err.message == (
        "This model's maximum context length is 8192 tokens. However, you requested 8193 tokens (100 in the "
        "messages, 8093 in the completion). Please reduce the length of the messages or completion.")
    assert overflow(100, 8192, 8093, tokens_param="max_completion_tokens").param == "max_completion_tokens"


def test_a_prompt_that_leaves_no_token_names_the_prompt():
    err = overflow(8192, 8192)
    assert err.param == "messages" and err.message == (
        "This model's maximum context length is 8192 tokens. However, you requested 8192 tokens in the "
        "messages. Please reduce the length of the messages.")
    err = overflow(9000, 8192, 16, prompt_param="prompt")  # past the context even alone: the prompt
    assert err.param == "prompt" and "(9000 in the messages, 16 in the completion)" in err.message


def test_the_context_is_the_nodes_never_past_its_pool():
    info = compute_pb2.InfoResponse(max_context_tokens=8192, num_blocks=1024, block_tokens=32)
    assert limits.context_tokens(info) == 8192
    info.num_blocks = 100
    assert limits.context_tokens(info) == 3200
    assert limits.context_tokens(compute_pb2.InfoResponse(max_context_tokens=300)) == 300  # pool unknown
