"""`kvtb serve smartnic [--config FILE]`: the SmartNIC agent as a gRPC server."""
from __future__ import annotations

import argparse
import logging

from kvtb import placement
from kvtb.heap import keep_large_buffers_in_the_heap
from kvtb.logs import setup_logging
from kvtb.node import run
from kvtb.settings import SettingsError, load_settings
from scale import settings as scale_settings
from scale.dilation import DilationError
from scale.profile import ProfileError
from smartnic.node import serve
from smartnic.settings import SmartNicSettings

logger = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve smartnic", description="The SmartNIC agent.")
    parser.add_argument("--config", help="YAML config file (section `smartnic`)")
    parser.add_argument("--listen", help="host:port for gRPC (overrides listen_address)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("smartnic", args.log_json)
    try:
        settings = load_settings(SmartNicSettings, "smartnic", args.config,
                                 overrides={"listen_address": args.listen})
        cpus = placement.pin("smartnic", settings.cpus)  # before any thread starts
        scale_settings.install_from(scale_settings.load(args.config))  # a hardware profile: paced, in virtual time
    except (SettingsError, ProfileError, DilationError) as exc:
        logger.error("%s", exc)
        return 2
    keep_large_buffers_in_the_heap()
    return run(serve(settings), cpus=placement.format_cpus(cpus))
