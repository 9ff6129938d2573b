"""Clients nobody here wrote, with the official `openai` package over real HTTP to a frontend process
in front of the fake agent: stateless clients resending history, client system messages,
client-named sessions (X-Session-Id, X-Correlation-ID, the `user` field), shared system prompts."""
import itertools

import grpc
import pytest

from kvtb_proto import frontend_pb2, frontend_pb2_grpc

from . import fake_agent
from .fake_agent import DEFAULT_SYSTEM, REPLY_ID, STOP, render
from .test_http_api import SHARED_PROMPT, TOKEN, assert_openai_error, client, post, start_frontend

FIRST, SECOND, THIRD = "Name three colours.", "And three more?", "Which one is warmest?"


@pytest.fixture
def stack(start_service, tmp_path):
    """(addresses, fake node): a frontend that also takes X-Correlation-ID and `user` as the session."""
    addresses, node, server = start_frontend(start_service, tmp_path, session_headers=["X-Correlation-ID"],
                                             session_from_user_field=True)
    yield addresses, node
    server.stop(0)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def transcript(grpc_address: str, token: str, context_id: str) -> frontend_pb2.ContextResponse | None:
    with grpc.insecure_channel(grpc_address) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        try:
            return stub.GetContext(frontend_pb2.ContextRequest(token=token, context_id=context_id))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND, err
            return None


def contexts(grpc_address: str, token: str) -> list[str]:
    with grpc.insecure_channel(grpc_address) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        return list(stub.ListContexts(frontend_pb2.ListContextsRequest(token=token)).context_ids)


def test_a_client_resending_the_whole_history_without_a_session(stack):
    addresses, node = stack
    api = client(addresses["http"])
    messages, sessions = [user(FIRST)], []
    for follow_up in (SECOND, THIRD, None):
        raw = api.chat.completions.with_raw_response.create(model="fake", messages=messages,
                                                            stream=follow_up is None)  # the last one streamed
        assert raw.http_response.status_code == 200
        sessions.append(raw.headers["x-session-id"])
        parsed = raw.parse()
        reply = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices) if follow_up is None \
            else parsed.choices[0].message.content
        messages.append({"role": "assistant", "content": reply})
        if follow_up:
            messages.append(user(follow_up))
    stateless = [list(r.token_ids) for r in node.requests]
    assert len(set(sessions)) == 3  # each a context of its own
    conversation = [(m["role"], m["content"]) for m in messages]
    assert stateless[0] == render(conversation[:1], True)
    assert stateless[1] == render(conversation[:3], True)  # the whole conversation, as the template renders it
    assert stateless[2] == render(conversation[:5], True)
    for before, after in itertools.pairwise(stateless):  # each extends the one before by its reply
        assert after[:len(before) + 2] == [*before, REPLY_ID, STOP]
    # the same conversation under X-Session-Id (only the new messages) sends the same ids
    session = post(addresses["http"], {"model": "fake", "messages": [user(FIRST)]})[2]["X-Session-Id"]
    for follow_up in (SECOND, THIRD):
        assert post(addresses["http"], {"model": "fake", "messages": [user(follow_up)]}, session=session)[0] == 200
    assert [list(r.token_ids) for r in node.requests[3:]] == stateless
    # the last context holds the resent turns (no summary: not served there) and its own
    last = transcript(addresses["grpc"], TOKEN, sessions[2])
    assert [(t.user_message, t.reply, t.HasField("summary")) for t in last.turns] == \
        [(FIRST, " ok", False), (SECOND, " ok", False), (THIRD, " ok", True)]
    assert last.turns[2].summary.turn == 3 and last.tokens == len(stateless[2]) + 2
    # and the whole history under that session's id goes on from its kept ids
    assert post(addresses["http"], {"model": "fake", "messages": [*messages, user("One more.")]},
                session=sessions[2])[0] == 200
    assert list(node.requests[-1].token_ids)[:len(stateless[2]) + 2] == [*stateless[2], REPLY_ID, STOP]


def test_a_resent_reply_keeps_the_ids_the_model_generated(stack):
    """A model may generate a reply split otherwise than its text re-tokenises: the conversation this
    frontend served goes on from the generated ids, as under X-Session-Id; one it did not, from the text."""
    addresses, node = stack
    node.reply = [(12, " o"), (13, "k")]  # " ok", which re-tokenises as [REPLY_ID]
    api = client(addresses["http"])
    api.chat.completions.create(model="fake", messages=[user(FIRST)])
    first = list(node.requests[-1].token_ids)
    history = [user(FIRST), {"role": "assistant", "content": " ok"}, user(SECOND)]
    api.chat.completions.create(model="fake", messages=history)
    resent = list(node.requests[-1].token_ids)
    session = post(addresses["http"], {"model": "fake", "messages": [user(FIRST)]})[2]["X-Session-Id"]
    post(addresses["http"], {"model": "fake", "messages": [user(SECOND)]}, session=session)
    assert resent == list(node.requests[-1].token_ids)  # the X-Session-Id path's ids
    assert resent[:len(first) + 3] == [*first, 12, 13, STOP]
    conversation = [(m["role"], m["content"]) for m in history]
    assert resent != render(conversation, True)  # which re-tokenising " ok" would have sent
    client(addresses["http"], "t-bob").chat.completions.create(model="fake", messages=history)
    assert list(node.requests[-1].token_ids) == render(conversation, True)  # bob: not served to him


def test_a_client_system_message_is_honoured(stack):
    addresses, node = stack
    api = client(addresses["http"], "t-bob")
    api.chat.completions.create(model="fake", messages=[{"role": "system", "content": "You are a pirate."},
                                                        user("hi")])
    assert list(node.requests[-1].token_ids) == render([("system", "You are a pirate."), ("user", "hi")], True)
    api.chat.completions.create(model="fake", messages=[user("hi")])  # none: the template's default
    assert list(node.requests[-1].token_ids) == render([("system", DEFAULT_SYSTEM), ("user", "hi")], True)
    assert list(node.requests[-1].token_ids) != list(node.requests[-2].token_ids)


def test_a_client_chosen_session_is_its_users_alone(stack):
    addresses, node = stack
    http, grpc_address = addresses["http"], addresses["grpc"]
    status, _, headers = post(http, {"model": "fake", "messages": [user(FIRST)]}, session="my-conv-1")
    assert status == 200 and headers["X-Session-Id"] == "my-conv-1"  # started on first sight
    first = list(node.requests[-1].token_ids)
    assert post(http, {"model": "fake", "messages": [user(SECOND)]}, session="my-conv-1")[0] == 200
    assert list(node.requests[-1].token_ids)[:len(first) + 2] == [*first, REPLY_ID, STOP]
    status, _, headers = post(http, {"model": "fake", "messages": [user("Mine?")]}, token="t-bob",
                              session="my-conv-1")
    assert status == 200 and headers["X-Session-Id"] == "my-conv-1"
    bobs = node.requests[-1]
    assert (bobs.user_id, bobs.context_id) == ("bob", "my-conv-1")
    assert list(bobs.token_ids) == render([("user", "Mine?")], True)  # nothing of alice's conversation
    assert [t.user_message for t in transcript(grpc_address, TOKEN, "my-conv-1").turns] == [FIRST, SECOND]
    assert [t.user_message for t in transcript(grpc_address, "t-bob", "my-conv-1").turns] == ["Mine?"]
    assert transcript(grpc_address, "t-carol", "my-conv-1") is None
    assert contexts(grpc_address, "t-bob") == ["my-conv-1"]
    # over gRPC too: bob's turn continues bob's context
    with grpc.insecure_channel(grpc_address) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        events = list(stub.Chat(frontend_pb2.ChatRequest(token="t-bob", context_id="my-conv-1", message="Again.")))
    assert events[-1].summary.turn == 2 and node.requests[-1].user_id == "bob"


def test_sessions_named_by_a_configured_header_or_the_user_field(stack):
    addresses, node = stack
    http = addresses["http"]
    # AIPerf: its own header, the whole history on each turn
    status, body, headers = post(http, {"model": "fake", "messages": [user(FIRST)]},
                                 extra_headers={"X-Correlation-ID": "9f1c2d3e-0001"})
    assert status == 200 and headers["X-Session-Id"] == "9f1c2d3e-0001"
    first = list(node.requests[-1].token_ids)
    history = [user(FIRST), {"role": "assistant", "content": body["choices"][0]["message"]["content"]}, user(SECOND)]
    status, _, headers = post(http, {"model": "fake", "messages": history},
                              extra_headers={"X-Correlation-ID": "9f1c2d3e-0001"})
    assert status == 200 and node.requests[-1].context_id == "9f1c2d3e-0001"
    assert list(node.requests[-1].token_ids)[:len(first) + 2] == [*first, REPLY_ID, STOP]
    assert [t.turn for t in transcript(addresses["grpc"], TOKEN, "9f1c2d3e-0001").turns] == [1, 2]
    # OpenAI's `user` field, as the settings say
    api = client(http)
    raw = api.chat.completions.with_raw_response.create(model="fake", messages=[user(FIRST)], user="end-user-42")
    assert raw.headers["x-session-id"] == "end-user-42" and node.requests[-1].context_id == "end-user-42"


BAD_SESSIONS = [  # headers, body fields, the param named
    ({"X-Session-Id": "two words"}, {}, "X-Session-Id"),
    ({"X-Session-Id": "x" * 241}, {}, "X-Session-Id"),
    ({"X-Session-Id": "../etc/passwd"}, {}, "X-Session-Id"),
    ({"X-Correlation-ID": "corr/1"}, {}, "X-Correlation-ID"),
    ({}, {"user": "Alice Smith"}, "user"),
    ({}, {"user": "ü" * 10}, "user"),
]


def test_bad_session_ids_get_a_400_in_openai_s_shape(stack):
    addresses, node = stack
    before = len(node.requests)
    for headers, fields, param in BAD_SESSIONS:
        status, got, _ = post(addresses["http"], {"model": "fake", "messages": [user("hi")], **fields},
                              extra_headers=headers)
        assert_openai_error(status, got, 400)
        assert (got["error"]["code"], got["error"]["param"]) == ("invalid_argument", param), got
    assert len(node.requests) == before  # none reached the agent
    status, _, headers = post(addresses["http"], {"model": "fake", "messages": [user("hi")]},
                              extra_headers={"X-Session-Id": "x" * 240})
    assert status == 200 and headers["X-Session-Id"] == "x" * 240


def test_only_a_tenants_shared_system_prompt_is_shared_and_only_in_that_tenant(stack):
    addresses, node = stack
    shared_ids = render([("system", SHARED_PROMPT)], False)
    cases = [  # token, system message (None: none sent), shared prefix expected
        (TOKEN, SHARED_PROMPT, len(shared_ids)),        # alice, team-a
        ("t-carol", SHARED_PROMPT, len(shared_ids)),    # carol, team-a
        ("t-bob", SHARED_PROMPT, 0),                    # bob, tenant default: not his tenant's
        (TOKEN, "You help team B.", 0),                 # another system message
        (TOKEN, None, 0),                               # the template's default system message
    ]
    for token, system, expected in cases:
        messages = ([] if system is None else [{"role": "system", "content": system}]) + [user("hi")]
        client(addresses["http"], token).chat.completions.create(model="fake", messages=messages)
        request = node.requests[-1]
        assert request.shared_prefix_tokens == expected, (token, system)
        assert list(request.token_ids[:len(shared_ids)]) == shared_ids or expected == 0
    assert [r.tenant for r in node.requests[-5:]] == ["team-a", "team-a", "default", "team-a", "team-a"]
    # a follow-up in alice's shared context still marks the prefix
    raw = client(addresses["http"]).chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "system", "content": SHARED_PROMPT}, user("hi")])
    post(addresses["http"], {"model": "fake", "messages": [user("more")]}, session=raw.headers["x-session-id"])
    assert node.requests[-1].shared_prefix_tokens == len(shared_ids)


def test_a_frontend_with_a_default_shared_prompt(start_service, tmp_path):
    """The configured system prompt is the tenant's shared one: a client sending none shares it."""
    addresses, node, server = start_frontend(start_service, tmp_path, system_prompt=SHARED_PROMPT)
    try:
        client(addresses["http"], "t-carol").chat.completions.create(model="fake", messages=[user("hi")])
        assert node.requests[-1].shared_prefix_tokens == len(render([("system", SHARED_PROMPT)], False))
        client(addresses["http"], "t-bob").chat.completions.create(model="fake", messages=[user("hi")])
        assert node.requests[-1].shared_prefix_tokens == 0
    finally:
        server.stop(0)


assert fake_agent.tokenize(" ok") == [REPLY_ID]  # the fake's reply re-tokenises to its generated id
