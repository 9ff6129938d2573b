from __future__ import annotations

from kvtb import cli


def test_resolve_takes_the_longest_command():
    assert cli.resolve(["serve", "storage", "--config", "x"]) == ("storage_node.main:main", ["--config", "x"])
    assert cli.resolve(["chat", "--json"]) == ("chat_client.cli:main", ["--json"])
    assert cli.resolve(["serve", "nothing"]) is None


def test_unknown_command_exits_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_help_lists_commands(capsys):
    assert cli.main(["--help"]) == 0
    assert "serve storage" in capsys.readouterr().out
