"""The conversation as token ids: what a turn sends the engine and what it keeps. Pure.

The KV on the storage nodes corresponds to an exact sequence of token ids, so the frontend
never re-tokenises: the first turn is the chat template over (system?, user message) with the
generation prompt; each reply is kept as the ids the model generated; a follow-up appends the
template's continuation for the new user message.
"""
from __future__ import annotations

from typing import Sequence

from kvtb_proto import compute_pb2


def first_messages(system_prompt: str, message: str) -> list[compute_pb2.ChatMessage]:
    """Messages of a new conversation's first turn."""
    messages = [compute_pb2.ChatMessage(role="system", content=system_prompt)] if system_prompt else []
    messages.append(compute_pb2.ChatMessage(role="user", content=message))
    return messages


def encode_request(system_prompt: str, message: str, follow_up: bool) -> compute_pb2.EncodeChatRequest:
    """The EncodeChat request for this turn's user message."""
    if follow_up:
        messages = [compute_pb2.ChatMessage(role="user", content=message)]
    else:
        messages = first_messages(system_prompt, message)
    return compute_pb2.EncodeChatRequest(messages=messages, continuation=follow_up,
                                         add_generation_prompt=True)


def closed_reply(reply_ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """The reply's ids as generated, ended by a stop token if generation was cut short."""
    ids = list(reply_ids)
    if stop_ids and (not ids or ids[-1] not in stop_ids):
        ids.append(stop_ids[0])
    return ids
