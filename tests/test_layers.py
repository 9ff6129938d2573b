"""The package graph has floors: services never import each other; nothing in the product imports bench/.

The user's client (chat_client) is product but no service: it talks to the frontend over gRPC and
imports only the runtime library and the protos, and no service imports it.

Read from the source with `ast` (every import statement, also those inside functions), so a lazy
import cannot hide an edge.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("chat_frontend", "compute_node", "smartnic", "storage_node")
SHARED = ("hostmem", "fabric", "kvtb", "scale")  # what a service may import (and kvtb_proto)
CLIENTS = ("chat_client",)  # the user's command-line client: product, not a service
PRODUCT = SERVICES + SHARED + CLIENTS


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


def test_the_runtime_library_is_the_ground_floor():
    above = set(PRODUCT) - {"kvtb"}
    edges = {module: sorted(tops & above) for module, tops in imported_packages("kvtb").items() if tops & above}
    assert not edges, f"kvtb is what every layer builds on, it imports none of them: {edges}"


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_imports_no_service_only_kvtb(client):
    below = set(SERVICES) | {"hostmem", "fabric"}
    edges = {module: sorted(tops & below) for module, tops in imported_packages(client).items() if tops & below}
    assert not edges, f"the client {client} talks to the frontend over gRPC, imports only kvtb: {edges}"


@pytest.mark.parametrize("client", CLIENTS)
def test_no_service_imports_a_client(client):
    # kvtb is left out while it still holds the benchmarks (they drive chats with the client)
    users = [module for package in SERVICES + ("hostmem", "fabric")
             for module, tops in imported_packages(package).items() if client in tops]
    assert not users, f"the client {client} sits above the services, but these import it: {users}"


@pytest.mark.parametrize("package", PRODUCT)
def test_nothing_in_the_product_imports_bench(package):
    edges = [module for module, tops in imported_packages(package).items() if "bench" in tops]
    assert not edges, f"benchmarks must stay apart from the product, but these import bench/: {edges}"
