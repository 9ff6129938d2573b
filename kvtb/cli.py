"""The `kvtb` command: a thin dispatcher to each package's own entry point.

Each subcommand names a module and a function taking the remaining argv, so that every
package owns its own argument parsing and this file never grows logic.
"""
from __future__ import annotations

import importlib
import sys

from kvtb.launch import die_with_parent_if_asked
from kvtb.private import make_private

# (words) -> "module:function"; the function receives the argv that follows the words.
COMMANDS: dict[tuple[str, ...], str] = {
    ("serve", "storage"): "storage_node.main:main",
    ("serve", "smartnic"): "smartnic.main:main",
    ("serve", "compute"): "compute_node.main:main",
    ("serve", "frontend"): "chat_frontend.main:main",
    ("bench", "storage"): "bench.storage:main",
    ("bench", "soak"): "bench.storage_soak:main",
    ("bench", "smartnic"): "bench.smartnic:main",
    ("bench", "offload"): "bench.offload:main",
    ("bench", "ttft"): "bench.ttft:main",
    ("bench", "followup"): "bench.followup:main",
    ("bench", "datapath"): "bench.datapath:main",
    ("bench", "concurrency"): "bench.concurrency:main",
    ("bench", "eviction"): "bench.eviction:main",
    ("bench", "decode"): "bench.decode:main",
    ("bench", "attention"): "bench.attention:main",
    ("bench", "landing"): "bench.landing:main",
    ("bench", "replay"): "bench.replay:main",
    ("bench", "fairness"): "bench.fairness:main",
    ("bench", "abuse"): "bench.abuse:main",
    ("bench", "aiperf"): "bench.aiperf:main",
    ("bench", "all"): "bench.suite:main",
    ("simulate",): "bench.simulate:main",
    ("profile", "check"): "bench.profile_check:main",
    ("study", "poster"): "bench.study.poster:main",
    ("study", "scalellm"): "bench.study.scalellm:main",
    ("study", "paper"): "bench.study.paper:main",
    ("study", "eviction"): "bench.study.eviction:main",
    ("study", "all"): "bench.study.all:main",
    ("chat",): "chat_client.cli:main",
    ("up",): "kvtb.up:main",
    ("stats",): "chat_client.stats_cli:main",
    ("trace",): "chat_client.trace_cli:main",
    ("health",): "kvtb.grpc_health:main",
    ("credentials",): "kvtb.credentials:main",
}

# Commands that run services: umask 077 before anything is imported, so that every file they and their
# children make is their user's only (kvtb.private).
PRIVATE_GROUPS = ("serve", "up")

HELP = """usage: kvtb COMMAND [ARGS...]

commands:
{commands}

Run `kvtb COMMAND --help` for a command's own options."""


def _usage() -> str:
    rows = sorted(" ".join(words) for words in COMMANDS)
    return HELP.format(commands="\n".join(f"  {r}" for r in rows))


def _group_usage(group: str) -> str | None:
    """The commands under a group word such as `bench` or `serve`, or None if it is not one."""
    rows = sorted(" ".join(words) for words in COMMANDS if len(words) > 1 and words[0] == group)
    if not rows:
        return None
    return (f"usage: kvtb {group} COMMAND [ARGS...]\n\ncommands:\n"
            + "\n".join(f"  {r}" for r in rows)
            + f"\n\nRun `kvtb {group} COMMAND --help` for a command's own options.")


def resolve(argv: list[str]) -> tuple[str, list[str]] | None:
    """Find the longest command prefix of argv; return its target and the rest."""
    for n in (2, 1):
        key = tuple(argv[:n])
        if len(key) == n and key in COMMANDS:
            return COMMANDS[key], argv[n:]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    found = resolve(argv)
    group = _group_usage(argv[0])
    if found is None and group is not None and (len(argv) == 1 or argv[1] in ("-h", "--help", "help")):
        print(group, file=sys.stdout if len(argv) > 1 else sys.stderr)
        return 0 if len(argv) > 1 else 2
    if found is None:
        print(f"kvtb: unknown command: {' '.join(argv[:2])}\n\n{_usage()}", file=sys.stderr)
        return 2
    target, rest = found
    if argv[0] in PRIVATE_GROUPS:
        make_private()
    if argv[0] == "serve":
        die_with_parent_if_asked()
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"kvtb: `{' '.join(argv[:2])}` is not available yet ({module_name})", file=sys.stderr)
            return 2
        raise
    result = getattr(module, func_name)(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
