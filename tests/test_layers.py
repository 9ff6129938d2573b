"""The package graph has floors: services never import each other; nothing in the product imports bench/.

Read from the source with `ast` (every import statement, also those inside functions), so a lazy
import cannot hide an edge.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("chat_frontend", "compute_node", "smartnic", "storage_node")
SHARED = ("hostmem", "fabric", "kvtb")  # what a service may import (and kvtb_proto)
PRODUCT = SERVICES + SHARED


def imported_packages(package: str) -> dict[str, set[str]]:
    """Top-level packages imported by each module of `package` (absolute imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        tops = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = tops
    return found


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service):
    others = set(SERVICES) - {service}
    edges = {module: sorted(tops & others) for module, tops in imported_packages(service).items()
             if tops & others}
    assert not edges, f"{service} imports other services (move the shared code to {SHARED}): {edges}"


@pytest.mark.parametrize("package", SHARED)
def test_a_shared_layer_imports_no_service(package):
    edges = {module: sorted(tops & set(SERVICES)) for module, tops in imported_packages(package).items()
             if tops & set(SERVICES)}
    assert not edges, f"the shared layer {package} imports services: {edges}"


@pytest.mark.parametrize("package", PRODUCT)
def test_nothing_in_the_product_imports_bench(package):
    edges = [module for module, tops in imported_packages(package).items() if "bench" in tops]
    assert not edges, f"benchmarks must stay apart from the product, but these import bench/: {edges}"
