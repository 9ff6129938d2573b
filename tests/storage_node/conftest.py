"""Fixtures for the storage node's tests: settings, an in-process command harness, a real node."""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from kvtb_proto import nvmeof_pb2 as pb
from storage_node.commands import CommandProcessor
from storage_node.settings import StorageSettings
from storage_node.stats import Stats
from storage_node.subsystem import Subsystem

GOOD_HOST = "nqn.2026-11.org.kvtestbed:test-host"


def settings_for(tmp_path, **overrides) -> StorageSettings:
    """Small namespaces in tmp_path, port 0 everywhere, GOOD_HOST allowed."""
    values = {"data_dir": str(tmp_path / "data"), "namespace_size_bytes": 256 << 20,
              "admin_address": "127.0.0.1:0", "fabric_address": "tcp://127.0.0.1:0",
              "allowed_hosts": {GOOD_HOST: "*"}, **overrides}
    return StorageSettings(**values)


class Harness:
    """Drives a CommandProcessor directly (no sockets): one message in, its response out."""

    def __init__(self, settings: StorageSettings):
        self.subsystem = Subsystem(settings)
        self.subsystem.open()
        self.executor = ThreadPoolExecutor(2)
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.processor = CommandProcessor(self.subsystem, self.executor, lambda c, r: self.done.put((c, r)),
                                          Stats())
        self.next_cid = 0

    def send(self, header: bytes, payload=(), session: bytes = b"s1"):
        """Response capsule and frames for one raw message."""
        replies = self.replies(header, payload, session)
        assert len(replies) == 1
        return replies[0].capsule, replies[0].frames

    def replies(self, header: bytes, payload=(), session: bytes = b"s1"):
        """Every message one raw message is answered with (data PDUs, then the response)."""
        replies = self.processor.receive(session, [memoryview(header), *map(memoryview, payload)])
        if not replies:
            cmd, result = self.done.get(timeout=10)
            replies = self.processor.complete(cmd, result)
        return replies

    def command(self, payload=(), session: bytes = b"s1", **fields):
        """Send a CommandCapsule built from fields (with a fresh command id unless given)."""
        if "command_id" not in fields:
            self.next_cid += 1
            fields["command_id"] = self.next_cid
        return self.send(pb.CommandCapsule(**fields).SerializeToString(), payload, session)

    def connect(self, host: str = GOOD_HOST, session: bytes = b"s1"):
        return self.command(session=session, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                            host_nqn=host)[0]

    def close(self):
        self.executor.shutdown()
        self.subsystem.close()


@pytest.fixture
def harness(tmp_path):
    h = Harness(settings_for(tmp_path))
    yield h
    h.close()


@pytest.fixture
def node_config(tmp_path):
    """Write a YAML config for a real node (GOOD_HOST allowed); returns a function(**overrides) -> path
    (an override of None leaves the setting at the node's default)."""
    def write(**overrides) -> str:
        section = {"data_dir": str(tmp_path / "data"), "namespace_size_bytes": 4 << 30,
                   "admin_address": "127.0.0.1:0", "fabric_address": "tcp://127.0.0.1:0",
                   "allowed_hosts": {GOOD_HOST: "*"}, **overrides}
        section = {k: v for k, v in section.items() if v is not None}  # None: the node's default
        path = tmp_path / "storage.yaml"
        path.write_text(yaml.safe_dump({"storage": section}))
        return str(path)
    return write
