"""Every service as a real process (`kvtb up` on free ports), with the real model."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest
import yaml

from chat_client.client import FrontendClient
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb_proto import frontend_pb2, frontend_pb2_grpc

MAX_NEW_TOKENS = 32
USERS = {"demo": "demo-token", "alice": "alice-token", "bob": "bob-token", "carol": "carol-token",
         "dave": "dave-token"}
TENANTS = {"bob": "team-b", "carol": "team-c", "dave": "team-c"}  # metrics label tenants; alice, demo: "default"
# the operator's quota for team-c's users (the stock admission has none: a user alone takes every place)
QUOTA = {"team-c": {"user_max_concurrent_turns": 2, "user_max_waiting_turns": 4}}
# the operators of team-b and team-c each marked this system prompt's KV shared by their tenant's users
# (two full blocks of 32 tokens and part of a third)
SHARED_PROMPT = ("You are the support assistant of the Example Bakery on Main Street. Answer questions about "
                 "opening hours, cakes, bread, pastries, allergens and orders briefly and politely, in plain "
                 "English, and never invent prices; if you do not know something, say so and suggest calling "
                 "the shop. Orders for the weekend must be placed by Thursday noon.")
PAPER_CHAT = Path(__file__).resolve().parents[2] / "deploy" / "demo-chat.txt"


def paper_messages() -> list[str]:
    lines = PAPER_CHAT.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def write_config(path: Path, frontend: dict | None = None, compute: dict | None = None) -> Path:
    """A config with every address on a free port, a small KV pool and short replies (and `frontend`'s
    settings in its section: routing, for several replicas)."""
    config = {
        "storage": {"admin_address": "127.0.0.1:0", "fabric_address": "tcp://127.0.0.1:0",
                    "namespace_size_bytes": 1 << 30, "metrics_address": "127.0.0.1:0"},
        "smartnic": {"listen_address": "127.0.0.1:0", "salt": "e2e-salt", "metrics_address": "127.0.0.1:0"},
        "compute": {"listen_address": "127.0.0.1:0", "pool_tokens": 8192, "max_context_tokens": 1024,
                    "key_salt": "e2e-salt", "metrics_address": "127.0.0.1:0", **(compute or {})},
        "frontend": {"listen_address": "127.0.0.1:0", "http_address": "127.0.0.1:0",
                     "metrics_address": "127.0.0.1:0", "users": USERS, "tenants": TENANTS,
                     "max_new_tokens_default": MAX_NEW_TOKENS, "operators": ["demo"],
                     "shared_system_prompts": {"team-b": SHARED_PROMPT, "team-c": SHARED_PROMPT},
                     "tenant_limits": QUOTA, **(frontend or {})},
    }
    path.write_text(yaml.safe_dump(config))
    return path


class Up:
    """One `kvtb up` and the addresses it announced."""

    def __init__(self, root: Path, policy: str, placement: str = "shared", replicas: int = 1,
                 frontend: dict | None = None, compute: dict | None = None):
        self.root = root
        self.config = write_config(root / "kvtb.yaml", frontend, compute)
        self.proc = ServiceProcess(f"up-{policy}", kvtb_argv("up", "--config", str(self.config),
                                                             "--data-dir", str(root / "var"),
                                                             "--policy", policy, "--placement", placement,
                                                             "--replicas", str(replicas)),
                                   root / "up.log")

    def start(self) -> "Up":
        self.proc.start(timeout_s=600)
        return self

    @property
    def services(self) -> dict[str, dict[str, str]]:
        return self.proc.ready["services"]

    @property
    def frontend(self) -> str:
        return self.services["frontend"]["grpc"]

    @property
    def agent(self) -> str:
        return self.services["smartnic"]["grpc"]

    def client(self, user: str = "alice") -> FrontendClient:
        return FrontendClient(self.frontend, USERS[user])

    def stop(self) -> None:
        assert self.proc.stop(timeout_s=60) == 0, self.proc.log_tail()


def start_up(tmp_path_factory, policy: str, placement: str = "shared", replicas: int = 1,
             frontend: dict | None = None, compute: dict | None = None) -> Up:
    return Up(tmp_path_factory.mktemp(f"up-{policy}-{placement}-{replicas}"), policy, placement, replicas,
              frontend, compute).start()


@pytest.fixture(scope="session")
def triggered(tmp_path_factory):
    """Every service under the paper's policy, shared by the e2e modules."""
    up = start_up(tmp_path_factory, "triggered")
    yield up
    up.stop()


def kvtb(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `kvtb ARGS` as a user would."""
    return subprocess.run(kvtb_argv(*args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def paper_records(triggered):
    """The paper's chat as `kvtb chat --script deploy/demo-chat.txt --json` prints it (alice)."""
    result = kvtb("chat", "--frontend", triggered.frontend, "--user", "alice", "--token", USERS["alice"],
                  "--script", str(PAPER_CHAT), "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def transcript(frontend: str, user: str, context_id: str) -> frontend_pb2.ContextResponse:
    """GetContext: the stored turns with their summaries."""
    with grpc.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        return stub.GetContext(frontend_pb2.ContextRequest(token=USERS[user], context_id=context_id))


def run_turn(client: FrontendClient, message: str, context_id: str = "", max_new_tokens: int = 0):
    """(streamed text, summary) of one turn."""
    texts, summary = [], None
    for event in client.chat(message, context_id, max_new_tokens):
        if event.WhichOneof("event") == "text":
            texts.append(event.text)
        elif event.WhichOneof("event") == "summary":
            summary = event.summary
    assert summary is not None
    return "".join(texts), summary


def assert_restored_as_resident(replies: dict[str, list]) -> None:
    """The paper's chat under triggered and resident (summaries by policy): the follow-ups restored and
    resident respectively, and the same replies."""
    triggered, resident = replies["triggered"], replies["resident"]
    assert [t.kv_source for t in triggered[1:]] == ["restored", "restored"]
    assert [t.kv_source for t in resident[1:]] == ["resident", "resident"]
    assert [t.reply for t in triggered] == [t.reply for t in resident]


def run_conversation(client: FrontendClient, messages: list[str]) -> list:
    summaries, context_id = [], ""
    for message in messages:
        text, summary = run_turn(client, message, context_id)
        assert text == summary.reply
        context_id = summary.context_id
        summaries.append(summary)
    return summaries
