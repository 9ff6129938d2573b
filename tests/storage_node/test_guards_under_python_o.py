"""The storage node's and the fabric's guards are real errors: they hold under `python -O` too."""
from __future__ import annotations

import pytest

from fabric import frames
from fabric.auth import AuthError, FabricSecurity, HostHandshake, TargetHandshake
from fabric.client import FabricClient
from kvtb.settings import SettingsError
from storage_node.allocator import Extent, ExtentAllocator
from storage_node.queues import QueuePair
from storage_node.settings import StorageSettings
from tests.optimized import run_optimized

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

# each line: an expression that must raise the named error
GUARDS = [
    ("SettingsError", "FabricSecurity('tls', b'k')"),
    ("SettingsError", "FabricSecurity('auth')"),
    ("AuthError", "HostHandshake(b'k', 'nqn.h').channel()"),
    ("AuthError", "TargetHandshake(b'k', 'nqn.h', 'nqn.s').channel()"),
    ("ValueError", "ExtentAllocator(1 << 20, 0)"),
    ("ValueError", "ExtentAllocator(1 << 20).free([Extent(1, 4096)])"),
    ("ValueError", "ExtentAllocator(1 << 20).free([Extent(1 << 20, 4096)])"),
    ("ValueError", "QueuePair(1, 0)"),
    ("ValueError", "FabricClient('inproc://nowhere', 'nqn.h', queue_depth=0)"),
    ("ValueError", "frames.split([b'x'], 0)"),
    ("SettingsError", "StorageSettings(namespaces=('tape',))"),
    ("SettingsError", "StorageSettings(queue_depth=0)"),
    ("SettingsError", "StorageSettings(max_frame_bytes=1 << 20)"),
    ("SettingsError", "StorageSettings(max_half_open=4, max_half_open_per_peer=8)"),
    ("SettingsError", "StorageSettings(max_ranges=0)"),
    ("SettingsError", "StorageSettings(max_response_bytes=1 << 20)"),
    ("SettingsError", "StorageSettings(allowed_hosts='[1]')"),
]

ERRORS = {"SettingsError": SettingsError, "AuthError": AuthError, "ValueError": ValueError}
NAMES = {"FabricSecurity": FabricSecurity, "HostHandshake": HostHandshake, "TargetHandshake": TargetHandshake,
         "ExtentAllocator": ExtentAllocator, "Extent": Extent, "QueuePair": QueuePair,
         "FabricClient": FabricClient, "frames": frames, "StorageSettings": StorageSettings}


@pytest.mark.parametrize("error, expression", GUARDS)
def test_a_guard_raises(error, expression):
    with pytest.raises(ERRORS[error]):
        eval(expression, dict(NAMES))  # fixed expressions of this file


def test_the_guards_hold_under_python_O():
    lines = ["from fabric import frames",
             "from fabric.auth import AuthError, FabricSecurity, HostHandshake, TargetHandshake",
             "from fabric.client import FabricClient",
             "from kvtb.settings import SettingsError",
             "from storage_node.allocator import Extent, ExtentAllocator",
             "from storage_node.queues import QueuePair",
             "from storage_node.settings import StorageSettings",
             "held = 0"]
    for error, expression in GUARDS:
        lines += ["try:", f"    {expression}", f"except {error}:", "    held += 1"]
    lines.append("print(held)")
    assert run_optimized("\n".join(lines)).strip() == str(len(GUARDS))
