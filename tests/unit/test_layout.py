"""The layout rules a newcomer relies on, checked on the source
(ARCHITECTURE.md §7): roles never import each other, production code never
imports the test support in `corral.testing`, and the scheduler package has
no import circle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("state", "broker", "planner", "worker", "agent")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path) -> Iterator[str]:
    """Modules imported when `path` runs (imports under `if TYPE_CHECKING:`
    are for the type checker only and are skipped)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def test_roles_never_import_each_other() -> None:
    for role in ROLES:
        others = tuple(f"services.{r}" for r in ROLES if r != role)
        for path in _sources(f"services/{role}"):
            bad = [m for m in _runtime_imports(path) if m.startswith(others)]
            assert not bad, f"{_module(path)} imports another role: {bad}"


def test_production_code_never_imports_test_support() -> None:
    for path in _sources("corral", "services", "cli"):
        if path.is_relative_to(ROOT / "corral" / "testing"):
            continue
        bad = [m for m in _runtime_imports(path) if m.startswith("corral.testing")]
        assert not bad, f"{_module(path)} imports test support: {bad}"


def test_scheduler_package_has_no_import_circle() -> None:
    package = "services.worker.scheduler"
    paths = _sources("services/worker/scheduler")
    modules = {_module(p) for p in paths}
    graph = {
        _module(p): {m for m in _runtime_imports(p) if m in modules and m != _module(p)}
        for p in paths
    }
    assert f"{package}.feasible.checker" in graph and f"{package}.factory" in graph

    def cycle_from(start: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(graph.get(start, ())):
            if nxt in seen:
                return (*seen[seen.index(nxt) :], nxt)
            found = cycle_from(nxt, (*seen, nxt))
            if found:
                return found
        return None

    for module in sorted(graph):
        if module.endswith("__init__") or module == package:
            continue
        cycle = cycle_from(module, (module,))
        assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_every_proto_service_is_served_from_a_handlers_module() -> None:
    """A newcomer finds the code of `corral.v1.<Service>/<Rpc>` in the
    `handlers` module of the role that serves it."""
    import importlib
    import re

    servicer = re.compile(r"^class \w+\(\w+_pb2_grpc\.(\w+)Servicer\)", re.M)
    served: set[str] = set()
    for path in _sources("services"):
        if path.stem == "handlers" or path.parent.name == "handlers":
            served.update(servicer.findall(path.read_text()))
        elif path.stem != "__main__":
            assert not servicer.search(path.read_text()), f"{_module(path)} defines a servicer"
    declared = set()
    for path in sorted((ROOT / "corral" / "v1").glob("*_pb2.py")):
        module = importlib.import_module(f"corral.v1.{path.stem}")
        declared.update(module.DESCRIPTOR.services_by_name)
    assert declared and declared <= served, f"no handler for {sorted(declared - served)}"


def test_every_rpc_has_an_access_rule() -> None:
    """corral.security.access refuses an RPC it has no rule for; a new RPC without
    one would be unreachable, a rule without an RPC a stale name."""
    import importlib

    from corral.security.access import RULES

    declared: set[str] = set()
    for path in sorted((ROOT / "corral" / "v1").glob("*_pb2.py")):
        module = importlib.import_module(f"corral.v1.{path.stem}")
        for service in module.DESCRIPTOR.services_by_name.values():
            declared.update(f"/{service.full_name}/{m.name}" for m in service.methods)
    assert declared - set(RULES) == set(), "RPCs without an access rule"
    assert set(RULES) - declared == set(), "access rules for RPCs that do not exist"
