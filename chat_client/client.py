"""A blocking client of the frontend for the CLI: turns as events, errors as one-line messages."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterator

import grpc

from kvtb.rpc import READ_STREAMS_ON_CALLER
from kvtb.settings import SettingsError, read_config_file
from kvtb_proto import compute_pb2, frontend_pb2, frontend_pb2_grpc

DEFAULT_FRONTEND = "127.0.0.1:50050"
DEFAULT_USER = "demo"
REPO_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "kvtb.yaml"


def default_config_path() -> str | None:
    """$KVTB_CONFIG, else the repository's deploy/kvtb.yaml when there is one."""
    if os.environ.get("KVTB_CONFIG"):
        return os.environ["KVTB_CONFIG"]
    return str(REPO_CONFIG) if REPO_CONFIG.exists() else None


def token_for(user: str, config_path: str | None) -> str:
    """The user's token from the config's frontend.users ('' when not found)."""
    try:
        users = (read_config_file(config_path).get("frontend") or {}).get("users") or {}
    except SettingsError:
        return ""
    return str(users.get(user, ""))


@dataclasses.dataclass
class RpcFailure(Exception):
    """The frontend could not be reached or refused: a status name and its message."""

    address: str
    code: str
    details: str
    reached: bool = False  # the frontend itself answered (a service behind it is unavailable)

    def __str__(self) -> str:
        if self.code == "UNAVAILABLE" and self.reached:
            return f"the frontend at {self.address} is up but cannot serve the turn: {self.details}"
        if self.code == "UNAVAILABLE":
            return f"cannot reach the frontend at {self.address} ({self.details}); is `kvtb up` running?"
        return f"the frontend refused: {self.code}: {self.details}"


class FrontendClient:
    """Blocking ChatFrontend client; not thread-safe."""

    def __init__(self, address: str, token: str, timeout_s: float = 600.0):
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.insecure_channel(address, options=[READ_STREAMS_ON_CALLER])
        self._stub = frontend_pb2_grpc.ChatFrontendStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout_s: float = 5.0) -> None:
        """Connect now (RpcFailure UNAVAILABLE when the frontend cannot be reached)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise RpcFailure(self.address, "UNAVAILABLE", f"no connection within {timeout_s:g} s") from None

    def _failure(self, exc: grpc.RpcError) -> RpcFailure:
        code = exc.code().name
        reached = False
        if code == "UNAVAILABLE":  # from the transport, or from the frontend about the agent?
            try:
                grpc.channel_ready_future(self._channel).result(timeout=0.5)
                reached = True
            except grpc.FutureTimeoutError:
                pass
        return RpcFailure(self.address, code, exc.details() or "", reached)

    def chat(self, message: str, context_id: str = "", max_new_tokens: int = 0,
             sampling: compute_pb2.Sampling | None = None) -> Iterator[frontend_pb2.ChatEvent]:
        """The turn's events (text deltas, then the summary); RpcFailure on errors."""
        request = frontend_pb2.ChatRequest(context_id=context_id, message=message,
                                           max_new_tokens=max_new_tokens, sampling=sampling)
        try:
            yield from self._stub.Chat(request, metadata=self._metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._failure(exc) from None

    def get_context(self, context_id: str) -> frontend_pb2.ContextResponse:
        """The context's stored turns with their summaries."""
        try:
            return self._stub.GetContext(frontend_pb2.ContextRequest(context_id=context_id),
                                         metadata=self._metadata, timeout=30.0)
        except grpc.RpcError as exc:
            raise self._failure(exc) from None

    def system_stats(self) -> dict:
        """The whole system's figures."""
        try:
            reply = self._stub.SystemStats(frontend_pb2.SystemStatsRequest(), timeout=30.0)
        except grpc.RpcError as exc:
            raise self._failure(exc) from None
        return json.loads(reply.json)
