"""The one shape of every service: `serve(settings) -> Node`, then `start()`, `stop()`, `addresses`.

Each service package has a `node.py` with its `serve(settings)`; its `main.py` only parses the
command line, loads the settings and hands the node to `run`, which is the common tail of every
`kvtb serve NAME`: start, announce the ready line, wait for SIGTERM or SIGINT, stop.

`run` makes the process private (umask 077, kvtb.private) before the node starts, so that what a
service makes is its user's only however it was started (`kvtb serve` does so already, first).
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Protocol

from kvtb.launch import announce_ready
from kvtb.private import make_private

logger = logging.getLogger(__name__)
# how soon a stop signal that the kernel handed to another thread is seen (each stop waited half of it)
SIGNAL_POLL_S = 0.05


class Node(Protocol):
    """A service that can be started and stopped; `addresses` is filled by start()."""

    service: str                # "storage", "smartnic", "compute" or "frontend"
    addresses: dict[str, str]   # ready-line keys: grpc or admin, fabric, http, metrics

    def start(self) -> None:
        """Bind, serve, and return once the node answers (its health is SERVING or will be)."""

    def stop(self) -> None:
        """Stop taking requests, finish or fail what runs, release what it holds."""

    def ready_extra(self) -> dict[str, Any]:
        """Extra fields for the ready line (e.g. the compute node's policy)."""


def run(node: Node, **ready: Any) -> int:
    """Start the node, announce it (with `ready`'s fields too, e.g. its cpus), serve until SIGTERM or
    SIGINT, stop it; the exit code."""
    make_private()  # before start() makes the node's files
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node.start()
    except (RuntimeError, OSError) as exc:  # e.g. an address is taken, a peer refuses us
        logger.error("%s failed to start: %s", node.service, exc)
        node.stop()
        return 1
    announce_ready(node.service, node.addresses, **ready, **node.ready_extra())
    logger.info("%s serving: %s", node.service, node.addresses)
    # a signal the kernel hands to another thread does not end a wait without a timeout: Python runs
    # handlers on the main thread once it wakes
    while not stop.wait(SIGNAL_POLL_S):
        pass
    logger.info("%s stopping", node.service)
    node.stop()
    return 0
