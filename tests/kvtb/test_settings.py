from __future__ import annotations

import dataclasses
from typing import Mapping

import pytest

from kvtb.settings import SettingsError, load_settings


@dataclasses.dataclass(frozen=True)
class Example:
    data_dir: str = "var"
    queue_depth: int = 128
    ttl_s: float = 1.5
    fsync: bool = True
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self):
        assert self.queue_depth > 0, "queue_depth must be positive"


def test_file_then_environment_then_overrides(tmp_path):
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text("example:\n  queue_depth: 64\n  allowed_hosts: [a, b]\n  ttl_s: 2\n")
    env = {"KVTB_EXAMPLE_QUEUE_DEPTH": "32", "KVTB_EXAMPLE_FSYNC": "no"}
    s = load_settings(Example, "example", cfg, overrides={"data_dir": "/d"}, environ=env)
    assert s == Example(data_dir="/d", queue_depth=32, ttl_s=2.0, fsync=False, allowed_hosts=("a", "b"))


def test_environment_lists_are_comma_separated():
    s = load_settings(Example, "example", None, environ={"KVTB_EXAMPLE_ALLOWED_HOSTS": "x, y"})
    assert s.allowed_hosts == ("x", "y")


@pytest.mark.parametrize("text, message", [
    ("example:\n  nope: 1\n", "unknown settings"),
    ("example:\n  queue_depth: many\n", "expected int"),
    ("example:\n  queue_depth: 0\n", "queue_depth must be positive"),
    ("- a list\n", "mapping of sections"),
])
def test_bad_config_says_what_is_wrong(tmp_path, text, message):
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(Example, "example", cfg, environ={})


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(SettingsError, match="not found"):
        load_settings(Example, "example", tmp_path / "absent.yaml", environ={})


@dataclasses.dataclass(frozen=True)
class WithMapping:
    users: Mapping[str, str] = dataclasses.field(default_factory=dict)


def test_mappings_from_file_and_from_json_in_the_environment(tmp_path):
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text("example:\n  users: {demo: t1}\n")
    assert dict(load_settings(WithMapping, "example", cfg, environ={}).users) == {"demo": "t1"}
    env = {"KVTB_EXAMPLE_USERS": '{"alice": "t2"}'}
    assert dict(load_settings(WithMapping, "example", cfg, environ=env).users) == {"alice": "t2"}
    with pytest.raises(SettingsError, match="JSON object"):
        load_settings(WithMapping, "example", None, environ={"KVTB_EXAMPLE_USERS": "alice"})
    with pytest.raises(SettingsError, match="expected a mapping"):
        load_settings(WithMapping, "example", None, overrides={"users": [1]}, environ={})
