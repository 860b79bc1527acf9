"""The import structure of aps: floors from the bottom (errors) to the top (the command line),
imports only run down or sideways, and no circle closes among the modules.

Why a test: a lower room that imports a higher one cannot be read, tested or reused without
it (the telemetry module once reached into the server and the trainer while both imported it;
the launcher once imported the command line's plot tool). The floors below are the written
layering of the package; docs/architecture.md describes the same floors and why.

The modules are parsed (ast), never imported, so the test is fast and sees every import:
module level, inside functions and classes, and under ``if TYPE_CHECKING:``. A type-only
import does not run, but it still names the higher floor and so counts for the floors, and it
may close no circle either. Dynamic lookups by name (``importlib.import_module``: the built-in
models, ``aps``'s lazy public names) are not imports and are not checked.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "aps"

#: the floors, bottom first; a module may import its own floor and the floors below it.
#: An entry names a module or a package (then every module under it).
FLOORS: list[tuple[str, ...]] = [
    # the error tree everything raises
    ("aps.errors",),
    # small leaves with no aps dependency but errors
    ("aps.specs", "aps.mixer", "aps.validate", "aps.log", "aps.digests", "aps.durable", "aps.tls", "aps.procs",
     "aps.metrics", "aps.cluster", "aps.records", "aps.telemetry", "aps.npyio"),
    # values built on the leaves: the one sharding rule of client and server
    ("aps.sharding",),
    # where rows live and how they change: stores, indexes, initialisers, optimizer kernels (numpy/numba)
    ("aps.storage",),
    # what a checkpoint is on disk: shard directories, manifests, table files, delta chains
    ("aps.checkpoints",),
    # sans-IO protocol
    ("aps.wire",),
    # the pserver: its request handlers, saves and loads, the TCP server
    ("aps.server",),
    # the read-only store over exports and the server's storage kernels
    ("aps.serving",),
    # the async client (its exports write the serving layout)
    ("aps.client",),
    # the trainer runtime over the client
    ("aps.trainer",),
    # built-in models, plug-ins of the trainer; aps.torch, the plug-in made from a user's torch module
    ("aps.models", "aps.torch"),
    # processes: the local launcher and aps-ray's driver start, watch and stop pservers and trainers
    ("aps.launcher",),
    # the reference's role API for a user's own script
    ("aps.fleet",),
    # entry points
    ("aps.cli",),
    # the public names (lazy)
    ("aps",),
]


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    type_only: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, type_only: bool = False):
    """Every Import / ImportFrom node, with whether it sits under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]), type_only)
        else:
            yield from _import_nodes(node, type_only)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The aps module that ``name`` (a module or a name inside one) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(modules: dict[str, Path]) -> list[Import]:
    found = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node, type_only in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # ``from pkg import mod`` imports the module, ``from mod import name`` the module
                names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
            for name in names:
                target = _owner(name, modules) if name.split(".")[0] == "aps" else None
                if target is not None and target != source:
                    found.append(Import(source, target, node.lineno, type_only))
    return found


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching entry, floor)
    for level, entries in enumerate(FLOORS):
        for entry in entries:
            if module == entry or module.startswith(entry + ".") and entry != "aps":
                if best is None or len(entry) > best[0]:
                    best = (len(entry), level)
    return None if best is None else best[1]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_floor() -> None:
    missing = [m for m in all_modules() if floor_of(m) is None]
    assert not missing, f"modules on no floor (add them to FLOORS in {__file__}): {missing}"


def test_no_import_runs_from_a_lower_floor_to_a_higher_one() -> None:
    modules = all_modules()
    upward = sorted({
        f"{modules[i.source].relative_to(PACKAGE.parent)}:{i.line} {i.source} (floor {floor_of(i.source)}) imports "
        f"{i.target} (floor {floor_of(i.target)}){' under TYPE_CHECKING' if i.type_only else ''}"
        for i in imports(modules)
        if floor_of(i.source) is not None and (floor_of(i.target) or 0) > floor_of(i.source)  # type: ignore[operator]
    })
    assert not upward, "imports up the floors:\n" + "\n".join(upward)


def test_no_circle_among_the_modules() -> None:
    modules = all_modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports(modules):
        if not i.type_only:
            edges[i.source].add(i.target)
    assert cycles(edges) == []


def test_type_only_imports_close_no_circle_either() -> None:
    """A type-only import runs nowhere, but a circle it closes still ties two modules into one
    unit a reader must hold at once (the client once named its own client type inside the export
    module that it imports); a narrow protocol or the callable a module needs breaks it."""
    modules = all_modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports(modules):
        edges[i.source].add(i.target)
    assert cycles(edges) == []


def test_the_checker_sees_imports_in_functions_relative_and_type_only(tmp_path: Path) -> None:
    """The parser's own rules on a made-up package, so a pass above means something."""
    root = tmp_path / "aps"
    (root / "low").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("from .base import X\n")
    (root / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import Y\n"
        "def f():\n    from .. import high\n"
    )
    (root / "high.py").write_text("import aps.low.base\nfrom aps.low import X\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, root
    try:
        modules = all_modules()
        found = {(i.source, i.target, i.type_only) for i in imports(modules)}
    finally:
        PACKAGE = saved
    assert found == {
        ("aps.low", "aps.low.base", False),
        ("aps.low.base", "aps.high", True),
        ("aps.low.base", "aps.high", False),
        ("aps.high", "aps.low.base", False),
        ("aps.high", "aps.low", False),
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: the modules outside aps.server that may import it, and what of it. Those that run a pserver
#: (its command, the fleet role API, aps's public names) take it whole; aps-serve composes the
#: transport (listener, connections, request stats, config) with its own read-only core and
#: imports nothing of the training core. Storage and checkpoint formats sit below the server, so
#: the trainer, the models, the client and the launcher reach rows and checkpoints without it.
SERVER_IMPORTERS = {
    "aps": ("aps.server",),
    "aps.fleet": ("aps.server",),
    "aps.cli.server": ("aps.server",),
    "aps.cli.serve": ("aps.server.config",),
    "aps.serving.core": ("aps.server.transport", "aps.server.config", "aps.server.stats"),
    "aps.serving.server": ("aps.server.transport", "aps.server.config"),
}


def test_only_what_runs_a_pserver_imports_the_server_package() -> None:
    modules = all_modules()
    found = sorted({
        f"{i.source} imports {i.target}"
        for i in imports(modules)
        if i.target.startswith("aps.server") and not i.source.startswith("aps.server")
        and not any(i.target == a or i.target.startswith(a + ".") for a in SERVER_IMPORTERS.get(i.source, ()))
    })
    assert not found, "\n".join(found)


def test_the_transport_knows_no_core() -> None:
    """The listener and connections are typed against the RequestCore protocol
    (aps/server/transport/service.py), never against the training core or aps-serve's."""
    modules = all_modules()
    found = sorted({
        f"{i.source} imports {i.target}" for i in imports(modules)
        if i.source.startswith("aps.server.transport") and not i.target.startswith("aps.server.transport")
        and i.target.startswith(("aps.server", "aps.serving")) and i.target not in ("aps.server.config", "aps.server.stats")
    })
    assert not found, "\n".join(found)
