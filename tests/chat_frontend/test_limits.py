import pytest

from chat_frontend import limits
from chat_frontend.errors import ChatError


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


def test_max_new_tokens_default_and_cap():
    assert limits.resolve_max_new_tokens(0, 64, 128) == 64
    assert limits.resolve_max_new_tokens(128, 64, 128) == 128
    assert refusal(limits.resolve_max_new_tokens, 130, 64, 128).message == \
        "max_new_tokens is 130, over the limit of 128 by 2"


def test_context_limit_names_the_excess():
    limits.check_context_fits(100, 20, 8, 128)
    msg = refusal(limits.check_context_fits, 100, 20, 10, 128).message
    assert "would need 130 tokens (100 so far + 20 for this message + 10 to generate)" in msg
    assert "context of 128 tokens by 2" in msg


def test_the_default_shrinks_to_the_room_left_but_a_request_does_not():
    assert limits.fit_default(256, 0, 100) == 100
    assert limits.fit_default(256, 0, 0) == 1  # then check_context_fits refuses, saying by how much
    assert limits.fit_default(200, 200, 100) == 200
