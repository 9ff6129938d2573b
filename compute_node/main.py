"""`kvtb serve compute [--config FILE] [--policy P]`: the LLM, its KV pool and the ComputeNode service."""
from __future__ import annotations

import argparse

from compute_node.node import serve
from compute_node.settings import POLICIES, ComputeSettings
from kvtb.logs import setup_logging
from kvtb.node import run
from kvtb.settings import load_settings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve compute", description=__doc__)
    parser.add_argument("--config", help="YAML config file (section `compute`)")
    parser.add_argument("--policy", choices=POLICIES, help="KV policy (default: the config's)")
    parser.add_argument("--listen", help="gRPC address (default: the config's listen_address)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("compute", args.log_json)
    settings = load_settings(ComputeSettings, "compute", args.config,
                             overrides={"policy": args.policy, "listen_address": args.listen})
    return run(serve(settings))
