"""The package graph has floors: services never import each other; nothing in the product imports bench/.

The user's client (chat_client) is product but no service: it talks to the frontend over gRPC and
imports only the runtime library and the protos, and no service imports it.

Inside the product, module by module: no modules import each other in a circle (not even through
a lazy import), and no module uses another module's private (`_name`) names: what two modules share
is public in one of them, or in a third.

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


# Module by module

# Private names one product module may still use of another (file: {"module._name"}): none now; an entry
# names a knot left for later, and the test fails once it is untied (remove the entry then).
PRIVATE_USES_ALLOWED: dict[str, set[str]] = {}


def product_modules(root: Path = ROOT, packages: tuple[str, ...] = PRODUCT) -> dict[str, Path]:
    """Every Python module of the packages by dotted name (a package by its __init__.py)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name a `from X import ...` takes its names from (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` is, or lies in (a.b.C -> a.b); None outside the modules."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The modules each module imports: `import a.b` is a.b, `from a import b` is a.b when b is a module
    (else a), relative imports resolved. Only edges between `modules`."""
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(_nearest(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, path, node)
                targets.update(_nearest(f"{base}.{alias.name}", modules) for alias in node.names)
        graph[module] = targets - {None, module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as [a, b, ..., a], or None when it has none (depth first, no recursion)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:  # all it imports is done: so is it
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            if following in on_path:
                return path[path.index(following):] + [following]
            if following not in done and following in graph:
                path.append(following)
                on_path.add(following)
                stack.append(iter(sorted(graph[following])))
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(modules: dict[str, Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Per file, the private names of other modules it uses ("module._name"): `alias._name` where alias is
    bound by importing the module, and `from module import _name`. A package's own private submodule
    (a C extension such as smartnic._poller, imported inside the package) is the package's to use."""
    found: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bound, uses = {}, set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname \
                        else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, path, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                    elif _private(alias.name) and base in modules and base != module \
                            and not module.startswith(base + "."):
                        uses.add(f"{base}.{alias.name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):  # a.b.c._x: the module a.b.c, bound as a
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                target = ".".join([bound[value.id], *reversed(chain)])
                if target in modules and target != module:
                    uses.add(f"{target}.{node.attr}")
        if uses:
            found[str(path.relative_to(root))] = uses
    return found


def test_no_modules_of_the_product_import_each_other_in_a_circle():
    cycle = find_cycle(module_imports(product_modules()))
    assert cycle is None, ("modules import each other in a circle (move what they share into a module "
                           f"of its own): {' -> '.join(cycle or [])}")


def test_no_module_uses_another_module_s_private_names():
    found = private_uses(product_modules())
    new = {path: sorted(uses - PRIVATE_USES_ALLOWED.get(path, set())) for path, uses in found.items()
           if uses - PRIVATE_USES_ALLOWED.get(path, set())}
    assert not new, f"modules use other modules' private names (make the shared ones public): {new}"
    stale = {path: sorted(allowed - found.get(path, set())) for path, allowed in PRIVATE_USES_ALLOWED.items()
             if allowed - found.get(path, set())}
    assert not stale, f"untied: remove these from PRIVATE_USES_ALLOWED: {stale}"


def test_the_checks_find_a_planted_cycle_and_private_use(tmp_path):
    (tmp_path / "pkg").mkdir()
    sources = {"__init__.py": "from pkg import a\n",
               "a.py": "from pkg import b\n\ndef f():\n    return b.g()\n",
               "b.py": "def g():\n    from . import c\n    return c._hidden() + c.__name__\n",
               "c.py": "import pkg.a\nfrom pkg.b import _own\n\ndef _hidden():\n    return pkg.a._x\n",
               "d.py": "from pkg import c\n"}
    for name, text in sources.items():
        (tmp_path / "pkg" / name).write_text(text)
    modules = product_modules(tmp_path, ("pkg",))
    graph = module_imports(modules)
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a", "pkg.b"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert find_cycle({**graph, "pkg.c": {"pkg.b"}}) == ["pkg.b", "pkg.c", "pkg.b"]
    assert find_cycle({**graph, "pkg.c": set()}) is None
    assert private_uses(modules, tmp_path) == {"pkg/b.py": {"pkg.c._hidden"},
                                               "pkg/c.py": {"pkg.a._x", "pkg.b._own"}}
