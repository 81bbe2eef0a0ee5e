"""orchestrator's and orch_trainer's modules import each other without a cycle (``backends/base.py`` once imported
its own subclasses; ``orch_trainer.finish`` <-> ``orch_trainer.loop`` met through an import under ``TYPE_CHECKING``).
Walks the source (no import). Imports at any depth count: a function-level import defers a heavy or optional
dependency, never a cycle (``goodputquick`` <-> ``goodputview`` and ``orch_trainer.attempt -> runfiles -> ranks ->
attempt`` hid behind such imports); so do imports under ``if TYPE_CHECKING:``, since two modules that name each
other's types are one module split in two."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "orchestrator"
PACKAGES = (PKG, ROOT / "orch_trainer")
# Known cycles still being removed, as (importer, imported) edges left out of the graph: the test fails once such
# an edge is gone from the source, so a stale exception cannot linger. None left.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, modules: set[str]) -> list[str]:
    """What a module imports, at any depth; ``from pkg import submodule`` counts as the submodule."""
    names: list[str] = []
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Import):
            names += [a.name for a in sub.names]
        elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
            subs = [f"{sub.module}.{a.name}" for a in sub.names]
            names += [m for m in subs if m in modules] or [sub.module]
    return names


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in pkg.rglob("*.py") if "migrations" not in p.parts]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = {d for d in _imports(ast.parse(path.read_text()), set(modules)) if d in modules and d != name}
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_orchestrator_and_orch_trainer_have_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 30 and "orch_trainer.loop" in graph  # the walk found both packages
    stale = {e for e in KNOWN_CYCLE_EDGES if e[1] not in graph.get(e[0], set())}
    assert not stale, f"known cycle edge gone from the source: remove it from KNOWN_CYCLE_EDGES: {stale}"
    for importer, imported in KNOWN_CYCLE_EDGES:
        graph[importer].discard(imported)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _all_imports(tree: ast.Module) -> set[str]:
    """Every module a source file names in an import, at any depth (function-level imports too)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_orchestrator_never_imports_the_bundled_trainer() -> None:
    # The integrations imported the bundled `trainer` package, so a user's own trainer.py (a
    # very common name) broke them with "'trainer' is not a package". The in-job kit lives in
    # orchestrator.kit; the bundled trainer (orch_trainer) uses it, never the other way round.
    offenders = {}
    for path in PKG.rglob("*.py"):
        bad = {m for m in _all_imports(ast.parse(path.read_text()))
               if m.split(".")[0] in ("trainer", "orch_trainer")}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}
