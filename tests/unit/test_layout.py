"""The layout rules a newcomer relies on, checked on the source
(ARCHITECTURE.md §7): roles never import each other nor the CLI,
production code never imports the test support in `corral.testing`, and
no package has an import circle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("state", "broker", "planner", "worker", "agent", "gateway")
#: the packages the circle check covers
PACKAGES = ("corral", "services", "cli")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, type_checking: bool = False) -> Iterator[str]:
    """Modules `path` imports (see `_imports_in`)."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    return _imports_in(path.read_text(), package, type_checking=type_checking)


def _imports_in(source: str, package: str, *, type_checking: bool = False) -> Iterator[str]:
    """Modules `source` (a module of `package`) imports, relative imports
    resolved: `from a import b` names `a.b` as well as `a`. Imports under
    `if TYPE_CHECKING:` are for the type checker only and are skipped unless
    `type_checking`; function-level imports count."""
    tree = ast.parse(source)
    skip: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def _runtime_imports(path: Path) -> Iterator[str]:
    """Modules imported when `path` runs."""
    return _imports(path)


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def test_roles_never_import_each_other_nor_the_cli() -> None:
    for role in ROLES:
        others = (*(f"services.{r}" for r in ROLES if r != role), "cli")
        for path in _sources(f"services/{role}"):
            bad = [m for m in _imports(path, type_checking=True) if m.startswith(others)]
            assert not bad, f"{_module(path)} imports another role or the CLI: {bad}"


def test_every_role_is_a_package_the_test_knows() -> None:
    roles = {p.name for p in (ROOT / "services").iterdir() if (p / "__main__.py").exists()}
    assert roles == set(ROLES)


def test_production_code_never_imports_test_support() -> None:
    for path in _sources("corral", "services", "cli"):
        if path.is_relative_to(ROOT / "corral" / "testing"):
            continue
        bad = [m for m in _runtime_imports(path) if m.startswith("corral.testing")]
        assert not bad, f"{_module(path)} imports test support: {bad}"


def import_graph(*folders: str) -> dict[str, set[str]]:
    """Module → the modules of `folders` it imports, any way (top level,
    in a function or for the type checker). Importing `a.b.c` runs the
    packages `a` and `a.b` first, so it depends on them too: a package
    module that imports a module importing its siblings is a circle."""
    paths = _sources(*folders)
    modules = {_module(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = _module(path)
        deps: set[str] = set()
        for name in _imports(path, type_checking=True):
            parts = name.split(".")
            deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[me] = {d for d in deps if d in modules and d != me}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere() -> None:
    graph = import_graph(*PACKAGES)
    assert "services.worker.scheduler.feasible.checker" in graph and "cli.main" in graph
    assert circles(graph) == []


def test_the_circle_check_sees_deferred_and_type_checking_imports() -> None:
    """The check is not blind to the ways circles used to hide."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.pool import Pool\n"
        "def later():\n"
        "    from . import sibling\n"
        "    from ..other import thing\n"
    )
    seen = set(_imports_in(source, "top.pkg", type_checking=True))
    assert {"pkg.pool", "top.pkg.sibling", "top.other.thing"} <= seen
    assert "pkg.pool" not in set(_imports_in(source, "top.pkg"))


def _topicish(node: ast.AST) -> bool:
    """Source that is about topics: a name or attribute with "topic" in it
    (`ev.topic`, `TOPICS`, `parse_topic`)."""
    return any(
        "topic" in (n.id if isinstance(n, ast.Name) else n.attr).lower()
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    )


def _spells_a_topic(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """`node` (a topic's name) is used as a topic: an event's or a filter's
    `topic=`, compared with or looked up in something about topics, handed
    to a function about topics, collected into something named for topics,
    or given as the value of a mapping (the CLI's aliases were one)."""
    child: ast.AST = node
    parent = parents.get(id(node))
    while parent is not None:
        if isinstance(parent, ast.keyword):
            return parent.arg is not None and "topic" in parent.arg.lower()
        if isinstance(parent, ast.Compare | ast.Subscript):
            return _topicish(parent)
        if isinstance(parent, ast.Call):
            return _topicish(parent.func)
        if isinstance(parent, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            return any(_topicish(t) for t in targets)
        if isinstance(parent, ast.Dict):
            if any(v is child for v in parent.values):
                return True
        elif not isinstance(parent, ast.Tuple | ast.List | ast.Set | ast.Starred):
            return False
        child, parent = parent, parents.get(id(parent))
    return False


def test_no_module_spells_a_topic_by_hand() -> None:
    """Topic names live in the topic registry (corral/domain/topics.py);
    everything else reads them from there, so adding or renaming a topic is
    one change. (The words themselves stay free for what else they name:
    Nomad's JSON keys, headings, a scaling target's keys.)"""
    from corral.domain import topics

    names = {t.name for t in topics.ALL}
    registry = ROOT / "corral" / "domain" / "topics.py"
    found = []
    for path in _sources("corral", "services", "cli", "bench", "scripts"):
        if path == registry or path.is_relative_to(ROOT / "corral" / "v1"):
            continue
        tree = ast.parse(path.read_text())
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        constants = [n for n in ast.walk(tree) if isinstance(n, ast.Constant)]
        for node in constants:
            if node.value in names and _spells_a_topic(node, parents):
                found.append(f"{_module(path)}:{node.lineno} {node.value!r}")
    assert not found, "topic names spelled by hand: " + ", ".join(found)


def test_the_topic_spelling_check_sees_the_ways_topics_were_spelled() -> None:
    source = (
        'E = pb.Event(topic="Node")\n'
        'F = ev.topic == "Deployment"\n'
        'TOPICS = ("Job", "*")\n'
        'ALIASES = {"eval": "Evaluation"}\n'
        'T = parse_topic("Allocation")\n'
        'OK = {"Job": job, "Node": n}, data.get("Job"), ("Node", "final score")\n'
    )
    tree = ast.parse(source)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    spelled = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value in {"Job", "Node", "Deployment", "Evaluation", "Allocation"}
        and _spells_a_topic(n, parents)
    ]
    assert sorted(spelled) == ["Allocation", "Deployment", "Evaluation", "Job", "Node"]


def test_only_the_topic_registry_reads_which_payload_an_event_carries() -> None:
    """Code that handles changes dispatches on `topics.of(event)`, not on
    the payload field's name."""
    registry = ROOT / "corral" / "domain" / "topics.py"
    for path in _sources("corral", "services", "cli", "bench", "scripts"):
        if path != registry and not path.is_relative_to(ROOT / "corral" / "v1"):
            assert 'WhichOneof("payload")' not in path.read_text(), _module(path)


def test_every_role_starts_through_the_runner() -> None:
    """Each role's `__main__` hands its service to the one runner
    (corral/runtime/runner.py), which starts it, reports it ready and stops
    it; only the runtime's bootstraps start servers: gRPC in `server.py`,
    HTTP (uvicorn) in `http_server.py`. The gateway is the runner's HTTP
    flavour."""
    for role in ROLES:
        source = (ROOT / "services" / role / "__main__.py").read_text()
        assert "runner.main(" in source or "runner.run(" in source, role
    http = ROOT / "corral" / "runtime" / "http_server.py"
    grpc_server = ROOT / "corral" / "runtime" / "server.py"
    for path in _sources("corral", "services", "cli"):
        if path != http:
            assert "uvicorn" not in set(_imports(path, type_checking=True)), _module(path)
        if path != grpc_server:
            assert "grpc.aio.server(" not in path.read_text(), _module(path)

    from corral.runtime.runner import HttpRole
    from services.gateway.__main__ import GatewayProcess

    assert issubclass(GatewayProcess, HttpRole)


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
