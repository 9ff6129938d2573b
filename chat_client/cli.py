"""`kvtb chat`: talk to the frontend; a REPL, or a script of messages, with an optional trace."""
from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from chat_client import render
from chat_client.client import (DEFAULT_FRONTEND, DEFAULT_USER, FrontendClient, RpcFailure,
                                default_config_path, token_for)
from chat_client.record import summary_to_dict
from chat_client.trace import write_trace
from kvtb_proto import compute_pb2

HELP_LINE = "commands: /new (a new context), /stats, /quit"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb chat", description="Chat with the testbed's LLM.")
    parser.add_argument("--frontend", default=DEFAULT_FRONTEND, help="frontend address (host:port)")
    parser.add_argument("--user", default=DEFAULT_USER, help="user name (picks the token from the config)")
    parser.add_argument("--token", help="bearer token (default: the user's token in the config)")
    parser.add_argument("--config", help="config file to read the token from (default: deploy/kvtb.yaml)")
    parser.add_argument("--context", default="", help="continue this context id")
    parser.add_argument("--script", help="send each non-empty line of FILE as one message, then exit")
    parser.add_argument("--json", action="store_true", help="print one JSON record per turn")
    parser.add_argument("--trace", action="store_true", help="draw each turn's steps as a timeline")
    parser.add_argument("--trace-out", metavar="FILE",
                        help="write the session's turns as a Chrome trace (Perfetto) at the end")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0: the frontend's default")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class Chat:
    """One chat session: the current context and how to show turns. Output to `out`."""

    def __init__(self, client: FrontendClient, args: argparse.Namespace, out: TextIO):
        self.client = client
        self.args = args
        self.out = out
        self.context_id = args.context
        self.sampling = compute_pb2.Sampling(temperature=args.temperature, top_p=args.top_p,
                                             seed=args.seed)
        self.line_open = False  # a reply is being written on the current line
        self.summaries: list = []  # every completed turn of the session, for --trace-out

    def end_line(self) -> None:
        """End a partly written reply line (before an error message)."""
        if self.line_open:
            self.say()

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()
        self.line_open = False

    def turn(self, message: str, echo: bool = False) -> None:
        """Send one message; stream the reply; show the record (RpcFailure on errors)."""
        streaming = not self.args.json
        if streaming:
            if echo:
                self.say(f"you> {message}")
            self.out.write("llm> ")
            self.out.flush()
            self.line_open = True
        for event in self.client.chat(message, self.context_id, self.args.max_new_tokens, self.sampling):
            kind = event.WhichOneof("event")
            if kind == "text" and streaming:
                self.out.write(event.text)
                self.out.flush()
            elif kind == "summary":
                self.context_id = event.summary.context_id
                self.summaries.append(event.summary)
                self.show(summary_to_dict(event.summary))

    def show(self, record: dict) -> None:
        if self.args.json:
            self.say(json.dumps(record, ensure_ascii=False))
            return
        self.say()
        if record["turn"] == 1:
            self.say(f"(context {record['context_id']})")
        self.say(render.summary_line(record))
        if self.args.trace:
            for line in render.timeline(record):
                self.say(line)
        self.say()

    def command(self, line: str) -> bool:
        """Run a /command; False when the session should end."""
        word = line.split()[0].lower()
        if word == "/quit":
            return False
        if word == "/new":
            self.context_id = ""
            self.say("(a new context starts with your next message)")
        elif word == "/stats":
            for text in render.stats_lines(self.client.system_stats()):
                self.say(text)
        else:
            self.say(f"unknown command {word}; {HELP_LINE}")
        return True


def run_script(chat: Chat, path: str) -> int:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if line.startswith("/"):
            if not chat.command(line):
                break
        else:
            chat.turn(line, echo=True)
    return 0


def run_repl(chat: Chat) -> int:
    if sys.stdin.isatty():
        chat.say(f"kvtb chat with {chat.client.address}; {HELP_LINE}")
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "").strip()
        except (EOFError, KeyboardInterrupt):
            return 0
        if not line:
            continue
        try:
            if line.startswith("/"):
                if not chat.command(line):
                    return 0
            else:
                chat.turn(line)
        except KeyboardInterrupt:
            chat.end_line()
            chat.say("(interrupted; the reply was not kept)")
        except RpcFailure as exc:
            chat.end_line()
            print(f"kvtb chat: {exc}", file=sys.stderr)
            if exc.code == "UNAVAILABLE":
                return 2


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    token = args.token
    if token is None:
        token = token_for(args.user, args.config or default_config_path())
    client = FrontendClient(args.frontend, token)
    chat = Chat(client, args, sys.stdout)
    try:
        client.wait_ready()
        if args.script:
            return run_script(chat, args.script)
        return run_repl(chat)
    except RpcFailure as exc:
        chat.end_line()
        print(f"kvtb chat: {exc}", file=sys.stderr)
        return 2 if exc.code == "UNAVAILABLE" else 1
    except OSError as exc:
        print(f"kvtb chat: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()
        if args.trace_out:
            save_trace(chat, args.trace_out)


def save_trace(chat: Chat, path: str) -> None:
    """Write the session's turns as a Chrome trace (one thread per turn, across contexts)."""
    turns = []
    for index, summary in enumerate(chat.summaries, 1):
        turn = type(summary)()
        turn.CopyFrom(summary)
        turn.turn = index  # a session may span contexts (/new): number its turns in order
        turns.append(turn)
    events = write_trace(turns, path)
    print(f"kvtb chat: {len(turns)} turns, {events} trace events in {path}", file=sys.stderr)
