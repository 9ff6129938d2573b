"""`kvtb serve compute [--config FILE] [--policy P]`: the LLM, its KV pool and the ComputeNode service.

The process is pinned to its `cpus` and torch's OpenMP threads sized and bound to that set before
torch is first imported (compute_node.torch_threads): compute_node.node is imported only then.
"""
from __future__ import annotations

import argparse
import logging
import sys

from compute_node.settings import POLICIES, ComputeSettings
from compute_node.torch_threads import bind_openmp, thread_count
from kvtb import placement
from kvtb.logs import setup_logging
from kvtb.node import run
from kvtb.settings import SettingsError, load_settings
from scale import settings as scale_settings
from scale.dilation import DilationError
from scale.profile import ProfileError

logger = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve compute", description=__doc__)
    parser.add_argument("--config", help="YAML config file (section `compute`)")
    parser.add_argument("--policy", choices=POLICIES, help="KV policy (default: the config's)")
    parser.add_argument("--listen", help="gRPC address (default: the config's listen_address)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("compute", args.log_json)
    try:
        settings = load_settings(ComputeSettings, "compute", args.config,
                                 overrides={"policy": args.policy, "listen_address": args.listen})
        cpus = placement.pin("compute", settings.cpus)
        scale_settings.install_from(scale_settings.load(args.config))  # a hardware profile: paced, in virtual time
    except (SettingsError, ProfileError, DilationError) as exc:
        print(f"kvtb serve compute: {exc}", file=sys.stderr)
        return 2
    threads = thread_count(settings.torch_threads, cpus)
    if settings.cpus.strip() and settings.torch_bind:
        bind_openmp(cpus, threads)
    from compute_node.node import serve  # imports torch: after the binding above
    placement.apply(cpus)  # libgomp bound the importing thread to the first place: back on the whole set
    logger.info("torch: %d threads%s", threads, " bound one per CPU" if settings.cpus.strip() and settings.torch_bind
                else "")
    return run(serve(settings), cpus=placement.format_cpus(cpus))
