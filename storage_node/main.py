"""`kvtb serve storage [--config FILE] [--data-dir DIR]`: run a storage node until SIGTERM."""
from __future__ import annotations

import argparse
import logging
import signal
import threading

from kvtb.launch import announce_ready
from kvtb.settings import load_settings
from storage_node.server import StorageNode
from storage_node.settings import StorageSettings

logger = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb serve storage", description="Run a storage node.")
    parser.add_argument("--config", help="YAML settings file (section `storage`)")
    parser.add_argument("--data-dir", help="directory of the namespace files and journals")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings(StorageSettings, "storage", args.config, overrides={"data_dir": args.data_dir})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    node = StorageNode(settings)
    addresses = node.start()
    announce_ready("storage", addresses, node=settings.node_name, subsystem_nqn=settings.subsystem_nqn)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        node.stop()
    return 0
