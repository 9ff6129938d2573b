"""The token ids a turn sends the engine, with the encoder behind the agent.

Four cases, by what the store holds for the user and what the client sent:

- a context the user has under that session: its kept ids (never re-tokenised) and the template's
  continuation for the new message; a resent history must be its transcript, a system message the
  one it began with;
- no such context and no history: a first turn, (system?, user message) through the template;
- no such context and a history this frontend served to the user (the transcript of one of their
  contexts): that context's kept ids and the continuation, in the new context, so a stateless
  client's conversation has the ids the model generated, as a session's has;
- no such context and a history it did not serve: the whole conversation through the template
  (the replies re-tokenised from their text).

In the last two, the earlier turns are recorded in the new context as resent turns. Messages that
are not that alternation (`conversation.Whole`) are rendered whole by the template into a new
context, recorded as one turn (its user message: the last user message); they cannot continue a
stored context, whose ids the template would not reproduce.
`SharedPrefix` says how many leading ids are the tenant's shared system prompt.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Protocol

from chat_frontend import conversation
from chat_frontend.conversation import History, Whole
from chat_frontend.errors import ChatError
from chat_frontend.store import Context, TurnRow
from kvtb_proto import compute_pb2

logger = logging.getLogger(__name__)


class Encoder(Protocol):
    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]: ...


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What a turn sends: kept ids + new ids; the resent turns and system message to record."""

    kept_ids: tuple[int, ...]          # the context's (or the resent conversation's) ids so far, as kept
    new_ids: tuple[int, ...]           # what this turn appends (a whole resent conversation, or one message)
    resent: tuple[TurnRow, ...] = ()   # earlier turns the client resent for a context not stored yet
    system: str | None = None          # the system message a new context starts with

    @property
    def token_ids(self) -> list[int]:
        return [*self.kept_ids, *self.new_ids]


Source = tuple[Context, list[TurnRow]]  # a context whose transcript is the resent history, and its turns


async def build(encoder: Encoder, default_system: str, ctx: Context | None, stored: list[TurnRow],
                message: str, history: History, system: str | None, source: Source | None = None) -> Prompt:
    """The turn's prompt (INVALID_ARGUMENT when the history or system message contradicts the context)."""
    if ctx is not None:
        conversation.check_history(history, [(t.user_message, t.reply) for t in stored])
        conversation.check_system(system, ctx.system_prompt, default_system)
        new_ids = await encoder.encode_chat(conversation.encode_follow_up(message))
        return Prompt(ctx.token_ids, tuple(new_ids))
    system = conversation.effective_system(system, default_system)
    if source is not None:
        found, turns = source
        new_ids = await encoder.encode_chat(conversation.encode_follow_up(message))
        resent = tuple(dataclasses.replace(t, summary=b"") for t in turns)
        return Prompt(found.token_ids, tuple(new_ids), resent, system)
    new_ids = await encoder.encode_chat(conversation.encode_whole(system, history, message))
    resent = tuple(TurnRow(i + 1, user, reply, (), (), b"")
                   for i, (user, reply) in enumerate(conversation.turn_pairs(history)))
    return Prompt((), tuple(new_ids), resent, system)


async def build_whole(encoder: Encoder, default_system: str, ctx: Context | None, whole: Whole) -> Prompt:
    """The prompt of messages rendered whole (INVALID_ARGUMENT when they name a stored context)."""
    if ctx is not None:
        raise ChatError("INVALID_ARGUMENT", "these messages are not a system message then user and assistant "
                        "in turn ending with the user's, so they cannot continue the session's transcript; send "
                        "them without a session (a new context)", "messages")
    new_ids = await encoder.encode_chat(whole.encode(default_system))
    system = whole.system if whole.system is not None else (default_system or None)
    return Prompt((), tuple(new_ids), (), system)


class SharedPrefix:
    """Leading ids of a conversation that are its tenant's shared system prompt (cached per text).

    Only those ids are hashed under the tenant's salt alone; the rest of a conversation under the
    tenant's and the user's. Never across tenants: the tenant is always in the salt.
    """

    def __init__(self, encoder: Encoder, prompts: Mapping[str, str]):
        self.encoder = encoder
        self.prompts = prompts                        # tenant -> shared system prompt
        self._ids: dict[tuple[str, str], tuple[int, ...]] = {}  # (model, prompt) -> its ids alone

    async def tokens(self, tenant: str, model: str, token_ids: list[int]) -> int:
        """How many of token_ids' leading ids render the tenant's shared system message (0: none)."""
        text = self.prompts.get(tenant)
        if text is None:
            return 0
        key = (model, text)
        if key not in self._ids:
            self._ids[key] = tuple(await self.encoder.encode_chat(conversation.encode_system(text)))
            logger.info("tenant %s: the shared system prompt is %d tokens", tenant, len(self._ids[key]))
        return conversation.shared_prefix_tokens(token_ids, self._ids[key])
