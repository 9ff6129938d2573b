"""Every C extension setup.py names is built where this machine can build it.

They are optional (setup.py): without a C compiler the install goes on and each module's Python path
serves instead, so a build that fails turns its tests into skips, not failures. Here, where a compiler
is present on Linux x86-64 (where all of them build), a module that does not import is a failure: a
compile error in a fresh clone shows up as one.
"""
import importlib
import platform
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = re.findall(r'Extension\("([\w.]+)"', (ROOT / "setup.py").read_text())
BUILDABLE = (shutil.which("cc") or shutil.which("gcc")) and sys.platform == "linux" \
    and platform.machine().lower() in ("x86_64", "amd64")


def test_setup_names_the_extensions():
    assert {"hostmem._dma", "hostmem._lander", "hostmem._trigger", "smartnic._poller"} <= set(NAMES)


@pytest.mark.skipif(not BUILDABLE, reason="no C compiler, or not Linux x86-64: the Python paths serve")
@pytest.mark.parametrize("name", NAMES)
def test_every_extension_was_built(name):
    try:
        importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"{name} was not built ({e}): its compile error is in the install's output (make install)")
