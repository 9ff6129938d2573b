"""The code's shape: no class of the compute node (the room every feature lands in) over 400 lines, and
the block size defined once.

Read from the source with `ast` and regular expressions: nothing is imported.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 400
PRODUCT = ("chat_frontend", "compute_node", "smartnic", "storage_node", "hostmem", "fabric", "kvtb", "scale",
           "chat_client")
# A block size typed as a number: a default (`block_tokens: int = 32`, `block_tokens=32` in a
# signature), a constant (`BLOCK_TOKENS = 32`), or a fallback (`... else 32` after a block size); 0
# says "not known yet", not a size.
DEFINED = re.compile(r"(?i)\bblock_tokens\b\s*(?::\s*int\s*)?=\s*[1-9]\d*|\bblock_tokens\b[^\n#]*\belse\s+[1-9]\d*")
# Sizes that are not this testbed's block size, each with why.
OTHER_SIZES = {
    "bench/mooncake.py": "Mooncake's traces hash blocks of 512 tokens: its size, not ours",
    "bench/trigger.py": "a synthetic layout of 8 KiB blocks for the trigger microbenchmark",
    "bench/study/paper_decode.py": "the decode-beside-offload experiment's own small block",
    "bench/study/paper.py": "the paper study's unit: 1 MiB of its 32 KiB tokens",
    "bench/study/paper_causes_compute.py": "the paper study's unit, as bench/study/paper.py",
}
THE_ONE = "compute_node/settings.py"


def classes(package: str, root: Path = ROOT):
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                yield f"{path.relative_to(root)}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_compute_node_class_is_over_400_lines():
    big = {name: lines for name, lines in classes("compute_node") if lines > MAX_CLASS_LINES}
    assert not big, f"split these into classes per kind of state (offload_tracker, restore_tracker): {big}"


def test_the_class_size_check_sees_a_big_class(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class Hall:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert dict(classes("pkg", tmp_path)) == {"pkg/m.py:Hall": MAX_CLASS_LINES + 1}


def definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in (*PRODUCT, "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            hits = [line.strip() for line in path.read_text().splitlines() if DEFINED.search(line)]
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    return found


def test_the_block_size_is_defined_once_in_the_compute_nodes_settings():
    found = definitions()
    assert THE_ONE in found, "the compute node's setting is the block size's one source"
    others = {path: hits for path, hits in found.items() if path != THE_ONE and path not in OTHER_SIZES}
    assert not others, ("a block size typed as a number: ask the compute node (its Info's block_tokens, the "
                        f"agent's registered layout) or read ComputeSettings.block_tokens: {others}")


@pytest.mark.parametrize("line", ["    block_tokens: int = 32", "def f(block_tokens=16):", "BLOCK_TOKENS = 32",
                                  "return reg.layout.block_tokens if reg else 32"])
def test_the_block_size_check_sees_each_way_of_typing_one(line):
    assert DEFINED.search(line)


@pytest.mark.parametrize("line", ["BLOCK_TOKENS = ComputeSettings().block_tokens",
                                  "block_tokens: int = ComputeSettings.block_tokens", "bt = self.block_tokens()",
                                  "def descriptor(b, block_tokens: int = 0):"])
def test_a_block_size_asked_for_is_not_a_definition(line):
    assert not DEFINED.search(line)
