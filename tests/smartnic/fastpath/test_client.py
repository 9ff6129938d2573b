"""The fast path's client in-process: a restore's block ends once, whoever reports it first (the reader seeing
the child exit, or a send that failed because it did)."""
from __future__ import annotations

import itertools
import threading

from smartnic.fastpath.client import GONE, FastPath


class DeadConn:
    """A connection to a child that exited: the reader abandons the restore while the send fails."""

    def __init__(self, fast_path: FastPath):
        self.fast_path = fast_path

    def send(self, message) -> None:
        self.fast_path._abandon_restores()  # the reader saw the exit first
        raise BrokenPipeError("the child is gone")


def bare_client() -> FastPath:
    client = FastPath.__new__(FastPath)  # no process: only the restore bookkeeping
    client._restores, client._restores_lock = {}, threading.Lock()
    client._restore_ids, client._send_lock = itertools.count(1), threading.Lock()
    client.conn = DeadConn(client)
    return client


def test_a_block_the_reader_ended_is_not_ended_again_by_the_failed_send():
    ended = []
    bare_client().restore(7, ["b0", "b1", "b2", "b3"], [0], lambda i, kind, message: ended.append((i, kind)))
    assert sorted(ended) == [(0, GONE), (1, GONE), (2, GONE), (3, GONE)]


def test_a_failed_send_alone_ends_every_block_once():
    client, ended = bare_client(), []
    class Broken:
        def send(self, message) -> None:
            raise BrokenPipeError("gone")
    client.conn = Broken()
    client.restore(7, ["b0", "b1"], [0], lambda i, kind, message: ended.append((i, kind)))
    assert ended == [(0, GONE), (1, GONE)] and client._restores == {}
