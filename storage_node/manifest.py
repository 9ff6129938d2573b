"""The subsystem's manifest (`subsystem.json`): its namespaces, read even when it is damaged."""
from __future__ import annotations

import json
import logging
import os
import re

from storage_node.journal import copy_private, fsync_dir, open_private
from storage_node.namespace import LBA_BYTES
from storage_node.settings import COMMAND_SETS

logger = logging.getLogger(__name__)

MANIFEST = "subsystem.json"
_DATA_FILE = re.compile(r"ns(\d+)\.data")


def data_path(data_dir: str, nsid: int) -> str:
    """The backing file of namespace nsid."""
    return os.path.join(data_dir, f"ns{nsid}.data")


def check_entry(entry) -> dict:
    """{nsid, command_set, size_bytes} of a manifest entry; ValueError or TypeError when it is not one."""
    if not isinstance(entry, dict):
        raise TypeError(f"entry {entry!r} is not an object")
    nsid, command_set, size = entry.get("nsid"), entry.get("command_set"), entry.get("size_bytes")
    if not isinstance(nsid, int) or not 1 <= nsid < 1 << 32:
        raise ValueError(f"bad nsid {nsid!r}")
    if command_set not in COMMAND_SETS:
        raise ValueError(f"namespace {nsid}: bad command set {command_set!r}")
    if not isinstance(size, int) or size < LBA_BYTES:
        raise ValueError(f"namespace {nsid}: bad size {size!r}")
    return {"nsid": nsid, "command_set": command_set, "size_bytes": size}


def from_files(data_dir: str, default_size: int) -> list[dict]:
    """Entries for the namespace files in data_dir: key-value where a journal is beside the file."""
    entries = []
    for name in sorted(os.listdir(data_dir)):
        match = _DATA_FILE.fullmatch(name)
        if not match or int(match[1]) < 1:
            continue
        path = os.path.join(data_dir, name)
        command_set = "key_value" if os.path.exists(path + ".journal") else "nvm"
        size = max(os.stat(path).st_size // LBA_BYTES * LBA_BYTES, default_size)
        entries.append({"nsid": int(match[1]), "command_set": command_set, "size_bytes": size})
    return sorted(entries, key=lambda e: e["nsid"])


def load(data_dir: str, configured: list[dict], default_size: int) -> list[dict]:
    """The manifest's entries; configured ones when there is none.

    A damaged manifest (unreadable, not JSON, bad entries) is copied aside to
    `subsystem.json.damaged` and logged; its good entries are kept and every namespace file
    it misses is added back from the files themselves.
    """
    path = os.path.join(data_dir, MANIFEST)
    if not os.path.exists(path):
        return configured
    problems, entries = [], []
    try:
        with open(path, "rb") as f:
            listed = json.loads(f.read())["namespaces"]
        if not isinstance(listed, list):
            raise TypeError("namespaces is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
        listed = []
    for entry in listed:
        try:
            entry = check_entry(entry)
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
            continue
        if any(e["nsid"] == entry["nsid"] for e in entries):
            problems.append(f"namespace {entry['nsid']} listed twice")
        else:
            entries.append(entry)
    if not problems:
        return entries
    known = {e["nsid"] for e in entries}
    found = [e for e in from_files(data_dir, default_size) if e["nsid"] not in known]
    if not entries and not found:  # nothing was ever stored: as at first start
        found = configured
    copy_private(path, path + ".damaged")
    logger.error("manifest %s is damaged (%s): a copy is in %s.damaged; kept %d entries, rebuilt %s "
                 "from the data files", path, "; ".join(problems), path, len(entries),
                 [e["nsid"] for e in found] or "none")
    return sorted(entries + found, key=lambda e: e["nsid"])


def save(data_dir: str, subsystem_nqn: str, entries: list[dict]) -> None:
    """Write the manifest atomically (write, fsync, rename, fsync the directory)."""
    path = os.path.join(data_dir, MANIFEST)
    with open_private(path + ".tmp", "w") as f:
        json.dump({"subsystem_nqn": subsystem_nqn, "namespaces": sorted(entries, key=lambda e: e["nsid"])},
                  f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fsync_dir(data_dir)
