"""`kvtb serve storage [--config FILE] [--data-dir DIR]`: run a storage node until SIGTERM."""
from __future__ import annotations

import argparse
import sys

from kvtb import placement
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.logs import setup_logging
from kvtb.node import run
from kvtb.settings import SettingsError, load_settings
from scale import settings as scale_settings
from scale.dilation import DilationError
from scale.profile import ProfileError
from storage_node.node import serve
from storage_node.settings import StorageSettings


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb serve storage", description="Run a storage node.")
    parser.add_argument("--config", help="YAML settings file (section `storage`)")
    parser.add_argument("--data-dir", help="directory of the namespace files and journals")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs one line per command")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging("storage", args.log_json, args.log_level)
    try:
        settings = load_settings(StorageSettings, "storage", args.config, overrides={"data_dir": args.data_dir})
        cpus = placement.pin("storage", settings.cpus)  # before any thread starts
        scale_settings.install_from(scale_settings.load(args.config))  # a hardware profile: paced, in virtual time
    except (SettingsError, ProfileError, DilationError) as exc:
        print(f"kvtb serve storage: {exc}", file=sys.stderr)
        return 2
    keep_large_buffers_in_the_heap()
    return run(serve(settings), cpus=placement.format_cpus(cpus))
