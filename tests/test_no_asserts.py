"""No check in the product or the benchmarks is an `assert`: `python -O` removes them.

A check that guards memory, state or a measurement raises a real error instead (settings use
`kvtb.settings.require`). Read from the source with `ast`, so every assert statement counts,
also those inside functions; tests/ are the one place asserts belong.
"""
from __future__ import annotations

import ast
import sys

import pytest

from tests.optimized import run_optimized
from tests.test_layers import PRODUCT, ROOT

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

CHECKED = (*PRODUCT, "bench", "deploy")


def asserts_in(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    return found


@pytest.mark.parametrize("package", CHECKED)
def test_no_check_is_an_assert(package):
    found = asserts_in(package)
    assert not found, f"assert statements (removed by python -O) in {package}; raise instead: {found}"


def test_the_finder_sees_an_assert(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    assert x > 0, 'x must be positive'\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert asserts_in("pkg") == ["pkg/m.py:2"]


def test_a_setting_check_holds_under_python_O():
    """The settings' checks are real errors also where asserts are gone."""
    out = run_optimized("""
        from kvtb.settings import require, SettingsError
        assert False, "not optimized"
        try:
            require(False, "no")
        except SettingsError as e:
            print("raised", e)
    """)
    assert out.strip() == "raised no"
