"""Settings for every service: one frozen dataclass per service, read from one YAML file.

The file has one section per service (`storage`, `smartnic`, `compute`, `frontend`, ...).
Environment variables override it: `KVTB_<SECTION>_<FIELD>` (upper case), for example
`KVTB_STORAGE_QUEUE_DEPTH=64`. Lists are given comma-separated in the environment, mappings
as JSON objects.
The config file itself is `--config FILE`, or `$KVTB_CONFIG` when no flag is given.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml

T = TypeVar("T")

ENV_PREFIX = "KVTB_"


class SettingsError(ValueError):
    """A setting is missing, unknown or of the wrong type."""


def require(condition: object, message: str) -> None:
    """Raise SettingsError(message) unless condition holds: a setting's check that `python -O` keeps."""
    if not condition:
        raise SettingsError(message)


def read_config_file(path: str | os.PathLike | None) -> dict[str, Any]:
    """Return the parsed YAML file at path ($KVTB_CONFIG when None), or {} when there is none."""
    path = path or os.environ.get("KVTB_CONFIG")
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError as exc:
        raise SettingsError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping of sections")
    return data


def _convert(name: str, value: Any, annotation: Any) -> Any:
    """Convert a YAML or environment value to the field's annotated type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(name, value, inner[0])
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{name}: expected a list, got {value!r}")
        item_type = args[0] if args else str
        return tuple(_convert(name, v, item_type) for v in value)
    if origin in (dict, Mapping, collections.abc.Mapping) or annotation in (dict, Mapping):
        if isinstance(value, str):  # from the environment: JSON
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"{name}: expected a JSON object, got {value!r}") from exc
        if not isinstance(value, dict):
            raise SettingsError(f"{name}: expected a mapping, got {value!r}")
        return types.MappingProxyType(dict(value))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name}: expected a boolean, got {value!r}")
    if annotation in (int, float, str):
        try:
            return annotation(value)
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"{name}: expected {annotation.__name__}, got {value!r}") from exc
    return value


def load_settings(
    cls: type[T],
    section: str,
    config_path: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build `cls` from the file's `section`, then environment variables, then `overrides`."""
    environ = os.environ if environ is None else environ
    raw = dict(read_config_file(config_path).get(section) or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - fields
    if unknown:
        raise SettingsError(f"unknown settings in section {section!r}: {sorted(unknown)}")
    prefix = f"{ENV_PREFIX}{section.upper()}_"
    for field in fields:
        env_value = environ.get(prefix + field.upper())
        if env_value is not None:
            raw[field] = env_value
    for key, value in (overrides or {}).items():
        if value is not None:
            raw[key] = value
    kwargs = {key: _convert(f"{section}.{key}", value, hints[key]) for key, value in raw.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise SettingsError(f"invalid settings in section {section!r}: {exc}") from exc
