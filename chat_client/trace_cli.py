"""`kvtb trace CONTEXT_ID`: a context's turns, every service's steps, as a Chrome trace for Perfetto."""
from __future__ import annotations

import argparse
import sys

from chat_client.client import (DEFAULT_FRONTEND, DEFAULT_USER, FrontendClient, RpcFailure,
                                default_config_path, token_for)
from chat_client.trace import write_trace


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb trace", description=__doc__.split(": ", 1)[1])
    parser.add_argument("context_id", help="the context (kvtb chat prints it; X-Session-Id over HTTP)")
    parser.add_argument("--frontend", default=DEFAULT_FRONTEND, help="frontend address (host:port)")
    parser.add_argument("--user", default=DEFAULT_USER, help="user name (picks the token from the config)")
    parser.add_argument("--token", help="bearer token (default: the user's token in the config)")
    parser.add_argument("--config", help="config file to read the token from (default: deploy/kvtb.yaml)")
    parser.add_argument("-o", "--output", help="file to write (default: trace-CONTEXT_ID.json)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    token = args.token
    if token is None:
        token = token_for(args.user, args.config or default_config_path())
    output = args.output or f"trace-{args.context_id}.json"
    client = FrontendClient(args.frontend, token)
    try:
        context = client.get_context(args.context_id)
    except RpcFailure as exc:
        print(f"kvtb trace: {exc}", file=sys.stderr)
        return 2 if exc.code == "UNAVAILABLE" else 1
    finally:
        client.close()
    served = [t.summary for t in context.turns if t.HasField("summary")]  # not the turns a client resent
    events = write_trace(served, output)
    print(f"kvtb trace: {len(served)} turns, {events} events in {output} "
          "(open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
