"""The fields of an OpenAI API request and what the server does with each, as vLLM's docs list them. Pure.

Each endpoint's parser (openai_format for chat, completions_format) has one table of every field
it knows: SUPPORTED (honoured), DEFAULT_ONLY (accepted with the value the server behaves as anyway;
any other value is a 400 naming the field) or REFUSED (a 400 saying why). `SHARED` holds the fields
both endpoints handle alike (the sampling parameters, vLLM's extras); `check_fields` refuses the
first field a request sends that is unknown, refused or not its default; `check_keys` does the same
for an object inside the body (a chat message, a content part). The README's tables list the same
(a test checks them against these). Reading a field's value (a flag, a bounded number) is
request_parsing's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from chat_frontend.request_parsing import bad, printable, shown

SUPPORTED = "supported"
DEFAULT_ONLY = "accepted when it is the default"
REFUSED = "refused (400)"


def null_or(*values: Any) -> Callable[[Any, dict], bool]:
    """Accepts the field left out (null) or one of values (of the same type: True is not 1)."""
    return lambda value, body: value is None or any(value == v and type(value) is type(v) for v in values)


def empty(value: Any, body: dict) -> bool:
    return value is None or value in ([], {}, "")


def best_of(value: Any, body: dict) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and value == (body.get("n") or 1))


@dataclasses.dataclass(frozen=True)
class Field:
    """What the API does with a request field: `handling` (SUPPORTED, DEFAULT_ONLY, REFUSED);
    `note`: the values accepted (DEFAULT_ONLY), or why it is refused, or what it does."""

    handling: str
    note: str = ""
    accepts: Callable[[Any, dict], bool] = null_or()  # DEFAULT_ONLY: (value, body) -> accepted


def yes(note: str = "") -> Field:
    return Field(SUPPORTED, note)


def default(note: str, accepts: Callable[[Any, dict], bool]) -> Field:
    return Field(DEFAULT_ONLY, note, accepts)


def no(note: str) -> Field:
    return Field(REFUSED, note)


# The fields chat completions and completions handle alike (OpenAI's, then vLLM's sampling parameters
# and extras). A null value is the field left out.
SHARED: dict[str, Field] = {
    "model": yes("must be the served model"),
    "frequency_penalty": yes("[-2, 2]"),
    "presence_penalty": yes("[-2, 2]"),
    "logit_bias": yes("token id -> [-100, 100], at most 300"),
    "seed": yes("int64; absent: a random one per request"),
    "stream": yes(),
    "stream_options": yes("include_usage; continuous_usage_stats false"),
    "temperature": yes("default: the model's generation config, else 1.0"),
    "top_p": yes("(0, 1]"),
    "response_format": yes("text, json_object, json_schema (constrained decoding)"),
    "top_k": yes("-1 or 0: off"),
    "min_p": yes("[0, 1]"),
    "repetition_penalty": yes("(0, 2]"),
    "stop_token_ids": yes("up to 64"),
    "include_stop_str_in_output": yes(),
    "ignore_eos": yes(),
    "min_tokens": yes("at most max_tokens"),
    "skip_special_tokens": default("true", null_or(True)),
    "spaces_between_special_tokens": default("true", null_or(True)),
    "use_beam_search": default("false", null_or(False)),
    "best_of": default("n", best_of),
    "length_penalty": default("1.0 (beam search only)", null_or(1, 1.0)),
    "truncate_prompt_tokens": no("prompts are not truncated: a prompt past the context is 400"),
    "prompt_logprobs": no("prompt logprobs are not computed"),
    "allowed_token_ids": no("use logit_bias"),
    "bad_words": default("[]", empty),
    "logits_processors": no("custom logits processors are not loaded"),
    "guided_json": yes("as response_format json_schema"),
    "guided_regex": no("only JSON (response_format, guided_json)"),
    "guided_choice": no("only JSON (response_format, guided_json)"),
    "guided_grammar": no("only JSON (response_format, guided_json)"),
    "structural_tag": no("only JSON (response_format, guided_json)"),
    "structured_outputs": no("use response_format"),
    "guided_decoding_backend": no("one backend (llguidance)"),
    "guided_whitespace_pattern": no("not configurable"),
    "priority": default("0 (no priority scheduling)", null_or(0)),
    "return_tokens_as_token_ids": yes("logprobs' tokens as token_id:<id>"),
    "cache_salt": default("absent: KV is always salted by tenant and user; a request's own salt is not "
                           "supported", null_or()),
    "kv_transfer_params": no("no disaggregated serving"),
    "vllm_xargs": no("no custom extensions"),
}


def check_fields(body: dict, fields: dict[str, Field], api: str) -> None:
    """INVALID_ARGUMENT naming the first field that is unknown, refused, or not its default."""
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            where = printable(name)[:60]
            raise bad(f"unknown field {where!r}: not part of the {api} API this server implements", where)
        _check_value(name, field, value, body)


def check_keys(obj: dict, fields: dict[str, Field], where: str, what: str) -> None:
    """As check_fields, for the keys of an object inside the body (a message, a content part): the
    param names the key under `where` (messages[0].weird)."""
    for key, value in obj.items():
        param = f"{where}.{printable(key)[:60]}"
        field = fields.get(key)
        if field is None:
            raise bad(f"{param}: unknown field {printable(key)[:60]!r}; {what} has only "
                      f"{', '.join(fields)}", param)
        _check_value(param, field, value, obj)


def _check_value(param: str, field: Field, value, obj: dict) -> None:
    """INVALID_ARGUMENT naming param when its value is refused or not its default (None passes)."""
    if value is None or field.handling == SUPPORTED:
        return
    if field.handling == REFUSED:
        raise bad(f"{param} is not supported: {field.note}", param)
    if not field.accepts(value, obj):
        raise bad(f"{param} {shown(value)} is not supported; accepted: {field.note}", param)
