"""The conversation as token ids: what a turn sends the engine and what it keeps. Pure.

The KV on the storage nodes corresponds to an exact sequence of token ids, so within a context the
frontend never re-tokenises: the first turn is the chat template over (system?, user message) with
the generation prompt; each reply is kept as the ids the model generated; a follow-up appends the
template's continuation for the new user message.

A client that resends the whole history (no session, or a session the frontend has not seen) sends
its replies as text. When the frontend served that conversation to the user, it goes on from the
ids kept then (prompt.py); otherwise it is the template's rendering of all its messages, which
equals the ids a session would have kept whenever each re-tokenised reply equals its generated ids
(the template's continuation renders as the whole conversation does). With SmolLM2's tokenizer a
reply the model split otherwise (e.g. "\n\n" as one token before "1.", which re-tokenises as two)
differs from there on; the agent finds the stored prefix by content either way.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2

History = Sequence[tuple[str, str]]   # (role, content) of the messages before the new one


@dataclasses.dataclass(frozen=True)
class Whole:
    """A conversation the chat template renders whole, as vLLM renders any sequence of messages: not
    the alternation a context's turns make (two messages of one role in a row, an assistant first, a
    system message later, a trailing assistant message), or without the generation prompt. With
    continue_final_message the last message (the assistant's) is left open for the reply to go on."""

    messages: tuple[tuple[str, str], ...]   # (role, content), roles system, user, assistant
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @property
    def user_message(self) -> str:
        """The last user message (the transcript's user message of the turn), "" when there is none."""
        return next((content for role, content in reversed(self.messages) if role == "user"), "")

    @property
    def system(self) -> str | None:
        """The leading system message, if any."""
        return self.messages[0][1] if self.messages and self.messages[0][0] == "system" else None

    def encode(self, default_system: str) -> compute_pb2.EncodeChatRequest:
        """The EncodeChat request: the configured system message first when the client sent none."""
        messages = [_message(role, content) for role, content in self.messages]
        if default_system and not any(role == "system" for role, _ in self.messages):
            messages.insert(0, _message("system", default_system))
        return compute_pb2.EncodeChatRequest(messages=messages, add_generation_prompt=self.add_generation_prompt,
                                             continue_final_message=self.continue_final_message)


def effective_system(client_system: str | None, default: str) -> str | None:
    """The conversation's system message: the client's, else the configured one (None: the template's)."""
    if client_system is not None:
        return client_system
    return default or None


def _message(role: str, content: str) -> compute_pb2.ChatMessage:
    return compute_pb2.ChatMessage(role=role, content=content)


def whole_messages(system: str | None, history: History, message: str) -> list[compute_pb2.ChatMessage]:
    """The messages of a conversation from its start: system?, history, the new user message."""
    messages = [] if system is None else [_message("system", system)]
    messages.extend(_message(role, content) for role, content in history)
    messages.append(_message("user", message))
    return messages


def encode_whole(system: str | None, history: History, message: str) -> compute_pb2.EncodeChatRequest:
    """The EncodeChat request of a conversation from its start (a first turn, or resent history)."""
    return compute_pb2.EncodeChatRequest(messages=whole_messages(system, history, message),
                                         add_generation_prompt=True)


def encode_follow_up(message: str) -> compute_pb2.EncodeChatRequest:
    """The EncodeChat request that continues a kept conversation with a new user message."""
    return compute_pb2.EncodeChatRequest(messages=[_message("user", message)], continuation=True,
                                         add_generation_prompt=True)


def encode_system(system: str) -> compute_pb2.EncodeChatRequest:
    """The EncodeChat request of a system message alone: the leading ids of every conversation with it."""
    return compute_pb2.EncodeChatRequest(messages=[_message("system", system)])


def shared_prefix_tokens(token_ids: Sequence[int], system_ids: Sequence[int]) -> int:
    """len(system_ids) when token_ids start with them (the shared system part), else 0."""
    n = len(system_ids)
    return n if n and len(token_ids) >= n and list(token_ids[:n]) == list(system_ids) else 0


def turn_pairs(history: History) -> list[tuple[str, str]]:
    """(user message, reply) per earlier turn of a history that alternates user, assistant."""
    return [(history[i][1], history[i + 1][1]) for i in range(0, len(history) - 1, 2)]


def check_history(history: History, stored: Sequence[tuple[str, str]]) -> None:
    """INVALID_ARGUMENT unless the history is absent or the stored transcript ((user, reply) per turn)."""
    if not history:
        return
    expected = [pair for user, reply in stored for pair in (("user", user), ("assistant", reply))]
    if list(history) == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(history, expected)) if a != b),
                 min(len(history), len(expected)))
    raise ChatError("INVALID_ARGUMENT", f"the earlier messages ({len(history)}) do not match the session's "
                    f"transcript ({len(expected)} messages) from message {first} on; send only the new user "
                    "message, or the transcript as the responses gave it", "messages")


def check_system(system: str | None, kept: str | None, default: str) -> None:
    """INVALID_ARGUMENT when a follow-up's system message is not the one its context started with.

    kept None: the context started with no system message (or before the store recorded it), when
    the configured one applied.
    """
    if system is None or system == kept or (kept is None and default and system == default):
        return
    raise ChatError("INVALID_ARGUMENT", "the system message differs from the one this session started "
                    "with; it is part of the session's KV: leave it out, or start a new session", "messages")


def closed_reply(reply_ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """The reply's ids as generated, ended by a stop token if generation was cut short."""
    ids = list(reply_ids)
    if stop_ids and (not ids or ids[-1] not in stop_ids):
        ids.append(stop_ids[0])
    return ids
