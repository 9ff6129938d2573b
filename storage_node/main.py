"""`kvtb serve storage [--config FILE] [--data-dir DIR]`: run a storage node until SIGTERM."""
from __future__ import annotations

import argparse
import logging
import signal
import threading

from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.launch import announce_ready
from kvtb.logs import setup_logging
from kvtb.metrics import add_collector, start_metrics_server
from kvtb.service_metrics import storage_families
from kvtb.settings import load_settings
from storage_node.server import StorageNode
from storage_node.settings import StorageSettings

logger = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb serve storage", description="Run a storage node.")
    parser.add_argument("--config", help="YAML settings file (section `storage`)")
    parser.add_argument("--data-dir", help="directory of the namespace files and journals")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs one line per command")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    return parser.parse_args(argv)


def namespace_usage(node: StorageNode) -> list[tuple[int, int, int]]:
    """(nsid, used bytes, keys) of each namespace."""
    return [(nsid, ns.used_bytes, ns.key_count) for nsid, ns in sorted(node.subsystem.namespaces.items())]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging("storage", args.log_json, args.log_level)
    settings = load_settings(StorageSettings, "storage", args.config, overrides={"data_dir": args.data_dir})
    keep_large_buffers_in_the_heap()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    node = StorageNode(settings)
    addresses = node.start()
    add_collector(lambda: storage_families(node.stats.snapshot(), namespace_usage(node)))
    addresses["metrics"] = start_metrics_server(settings.metrics_address)
    announce_ready("storage", addresses, node=settings.node_name, subsystem_nqn=settings.subsystem_nqn)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        node.stop()
    return 0
