"""Token ids of a conversation from the tokenizer's chat template, and streaming detokenisation.

A conversation's ids are never re-tokenised: the first turn is the template's rendering of
its messages; a continuation is only the new messages' tokens, appended after the previous
reply's end-of-turn token, exactly as the template would have rendered them.
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")
_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatError(ValueError):
    """Messages the template cannot encode."""


class ChatEncoder:
    """Encodes chat messages with one tokenizer; thread-safe (read-only after init)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_text = tokenizer.eos_token
        self.stop_token_ids = sorted({tid for tid in (tokenizer.eos_token_id,) if tid is not None})
        base = self._render(_PROBE, False)
        cut = base.rfind(self.eos_text)
        if cut < 0:
            raise ChatError("the chat template does not end an assistant turn with the eos token")
        # What the template puts after an assistant reply's end-of-turn token (e.g. "\n").
        self.after_reply = base[cut + len(self.eos_text):]
        self._probe_text = base

    def _render(self, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=continue_final_message)

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, messages: list[dict], continuation: bool = False, add_generation_prompt: bool = True,
               close_previous_turn: bool = False, continue_final_message: bool = False) -> list[int]:
        """Ids for a first turn, or (continuation) the ids to append after the previous reply. With
        continue_final_message the last message, an assistant's, is left open for the reply to continue
        (no end of turn after it, no generation prompt), as vLLM's option of that name."""
        check_messages(messages)
        if continue_final_message:
            if add_generation_prompt or continuation:
                raise ChatError("continue_final_message cannot be used with add_generation_prompt or continuation")
            if messages[-1]["role"] != "assistant":
                raise ChatError(f"continue_final_message needs the last message to be the assistant's, "
                                f"got {messages[-1]['role']!r}")
            return self._tokens(self._render(messages, False, continue_final_message=True))
        if not continuation:
            return self._tokens(self._render(messages, add_generation_prompt))
        full = self._render(_PROBE + messages, add_generation_prompt)
        if not full.startswith(self._probe_text):
            raise ChatError("the chat template renders earlier messages differently with new ones")
        text = self.after_reply + full[len(self._probe_text):]
        if close_previous_turn:
            text = self.eos_text + text
        return self._tokens(text)

    def encode_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The ids of text alone, without the chat template (with the tokenizer's BOS and the like if asked)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def check_messages(messages: list[dict]) -> None:
    if not messages:
        raise ChatError("messages is empty")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise ChatError(f"messages[{i}].role must be one of {ROLES}, got {m.get('role')!r}")


class StreamDecoder:
    """Incremental text of a reply, token by token, holding back incomplete characters."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids before this are settled text
        self.read_offset = 0    # text of ids[prefix_offset:read_offset] was emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        """The text this token adds (may be empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            new = text[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new
        return ""


class TokenPieces:
    """Each token's text alone (tokenizer.decode([id]), special tokens kept), cached: logprobs name the
    likeliest tokens at every position. Bounded by the vocabulary. Engine thread only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        piece = self.cache.get(token_id)
        if piece is None:
            piece = self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return piece
