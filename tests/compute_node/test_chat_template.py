"""Conversation ids from the chat template; continuations never re-tokenise earlier turns."""
from __future__ import annotations

import pytest

from compute_node.chat_template import ChatEncoder, ChatError, StreamDecoder


def test_a_continuation_equals_the_template_rendering_of_the_whole_conversation(tokenizer):
    enc = ChatEncoder(tokenizer)
    first = [{"role": "user", "content": "Give me a cheesecake recipe."}]
    ids = enc.encode(first)
    reply = tokenizer.encode("Mix cream cheese and sugar.", add_special_tokens=False) + [tokenizer.eos_token_id]
    follow = [{"role": "user", "content": "Only °C from now on."}]
    conversation = ids + reply + enc.encode(follow, continuation=True)
    whole = first + [{"role": "assistant", "content": "Mix cream cheese and sugar."}] + follow
    text = tokenizer.apply_chat_template(whole, tokenize=False, add_generation_prompt=True)
    assert conversation == tokenizer.encode(text, add_special_tokens=False)


def test_close_previous_turn_prepends_the_end_of_turn_token(tokenizer):
    enc = ChatEncoder(tokenizer)
    msg = [{"role": "user", "content": "hi"}]
    assert enc.encode(msg, continuation=True, close_previous_turn=True) == \
        [tokenizer.eos_token_id] + enc.encode(msg, continuation=True)


def test_bad_messages_are_refused(tokenizer):
    enc = ChatEncoder(tokenizer)
    with pytest.raises(ChatError, match="empty"):
        enc.encode([])
    with pytest.raises(ChatError, match="role"):
        enc.encode([{"role": "robot", "content": "x"}])


def test_streamed_text_adds_up_to_the_decoded_reply(tokenizer):
    ids = tokenizer.encode("Preheat the oven to 160 °C — ünïcödé ✓.", add_special_tokens=False)
    decoder = StreamDecoder(tokenizer)
    assert "".join(decoder.push(i) for i in ids) == tokenizer.decode(ids)


def test_a_continued_final_message_is_left_open_for_the_reply(tokenizer):
    from compute_node.chat_template import TokenPieces
    enc = ChatEncoder(tokenizer)
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A ripe"}]
    ids = enc.encode(messages, add_generation_prompt=False, continue_final_message=True)
    closed = enc.encode(messages, add_generation_prompt=False)
    assert closed[:len(ids)] == ids and tokenizer.decode(ids).endswith("assistant\nA ripe")
    assert closed[len(ids)] == tokenizer.eos_token_id  # the template's end of turn is what is left out
    with pytest.raises(ChatError, match="add_generation_prompt"):
        enc.encode(messages, continue_final_message=True)
    with pytest.raises(ChatError, match="assistant"):
        enc.encode(messages[:1], add_generation_prompt=False, continue_final_message=True)
    assert enc.encode_text("A ripe") == tokenizer.encode("A ripe", add_special_tokens=False)
    pieces = TokenPieces(tokenizer)
    assert pieces(tokenizer.eos_token_id) == tokenizer.eos_token and pieces(ids[-1]) == pieces.cache[ids[-1]]
