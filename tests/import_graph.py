"""The package's import graph read from the source (no module is imported): every ``import``/``from ... import`` of
an ``atlas_fast`` module anywhere in a file, function-local ones included (they are dependencies all the same),
leaving out only the imports under ``if TYPE_CHECKING:`` (never executed). The top-level ``experiments/`` folder is
read as ``atlas_fast.experiments``, the name it installs under."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = {"atlas_fast": REPO / "atlas_fast", "atlas_fast.experiments": REPO / "experiments"}


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package (``__init__`` files name their package)."""
    modules = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([prefix, *parts])] = path
    return modules


def _runtime_nodes(tree: ast.AST):
    """The tree's nodes, skipping the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from a import b`` counts ``a.b`` when that is a module)."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                imported.add(base)
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def collapse(graph: dict[str, set[str]], parent: str) -> dict[str, set[str]]:
    """The imports between the children of ``parent`` (each child standing for everything inside it)."""
    depth = len(parent.split(".")) + 1

    def child(module: str) -> str | None:
        parts = module.split(".")
        if module.startswith(parent + ".") and len(parts) >= depth:
            return ".".join(parts[:depth])
        return None

    collapsed: dict[str, set[str]] = {}
    for importer, imported in graph.items():
        source = child(importer)
        if source is None:
            continue
        collapsed.setdefault(source, set())
        for module in imported:
            target = child(module)
            if target is not None and target != source:
                collapsed[source].add(target)
    return collapsed


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
