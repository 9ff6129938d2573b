"""`kvtb serve frontend`: the chat frontend's gRPC server and OpenAI HTTP API on one uvloop loop."""
from __future__ import annotations

import argparse
import sys

from chat_frontend import settings as settings_mod
from chat_frontend.node import serve
from kvtb import placement
from kvtb.logs import setup_logging
from kvtb.node import run
from kvtb.settings import SettingsError
from scale import settings as scale_settings
from scale.dilation import DilationError
from scale.profile import ProfileError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb serve frontend", description="Run the chat frontend.")
    parser.add_argument("--config", help="config file (default $KVTB_CONFIG)")
    parser.add_argument("--listen", help="host:port to listen on (overrides the config)")
    parser.add_argument("--agent", help="the SmartNIC agent's address, its only replica (overrides the config's "
                        "agent_address and replicas)")
    parser.add_argument("--data-dir", help="where sessions are kept (overrides the config)")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (also KVTB_LOG_JSON=1)")
    args = parser.parse_args(argv)
    setup_logging("frontend", args.log_json)
    try:
        settings = settings_mod.load(args.config, listen_address=args.listen, agent_address=args.agent,
                                     replicas=() if args.agent else None, data_dir=args.data_dir)
        cpus = placement.pin("frontend", settings.cpus)  # before any thread starts
        # a hardware profile: the frontend is software on both worlds, its CPU time stretched by D
        scale_settings.install_from(scale_settings.load(args.config))
    except (SettingsError, ProfileError, DilationError) as exc:
        print(f"kvtb serve frontend: {exc}", file=sys.stderr)
        return 2
    return run(serve(settings), cpus=placement.format_cpus(cpus))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
