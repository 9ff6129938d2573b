"""`kvtb stats`: the whole system's figures, gathered by the frontend."""
from __future__ import annotations

import argparse
import json
import sys

from chat_client import render
from chat_client.client import DEFAULT_FRONTEND, FrontendClient, RpcFailure


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb stats", description="Print the whole system's figures.")
    parser.add_argument("--frontend", default=DEFAULT_FRONTEND, help="frontend address (host:port)")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--token", default="", help="an operator's bearer token: the detail (storage hosts, "
                        "files) too; without it the aggregates")
    args = parser.parse_args(argv)
    client = FrontendClient(args.frontend, token=args.token)
    try:
        stats = client.system_stats()
    except RpcFailure as exc:
        print(f"kvtb stats: {exc}", file=sys.stderr)
        return 2 if exc.code == "UNAVAILABLE" else 1
    finally:
        client.close()
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print("\n".join(render.stats_lines(stats)))
    return 0
