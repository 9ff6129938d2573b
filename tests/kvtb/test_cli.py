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


def test_group_help_lists_the_groups_commands(capsys):
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "kvtb bench COMMAND" in out and "bench ttft" in out and "serve compute" not in out


def test_group_alone_shows_its_commands_and_exits_2(capsys):
    assert cli.main(["serve"]) == 2
    assert "serve storage" in capsys.readouterr().err
