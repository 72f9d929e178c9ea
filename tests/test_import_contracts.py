"""The import contracts of docs/architecture.md, checked on the source: the package's layers import one way (down),
the independent siblings of a layer do not import each other, and no two modules or packages that are siblings
anywhere in the tree import each other in a circle. Function-local imports count (they are dependencies all the
same); ``if TYPE_CHECKING:`` imports and ``__main__`` modules (programs that nothing imports) do not."""

import re
from pathlib import Path

import pytest

from import_graph import collapse, cycles, import_graph, module_files

# The layers from the top (the command line) to the bottom (plumbing); the packages of one layer, written "a | b",
# are independent of each other. docs/architecture.md lists the same layers in the same order.
LAYERS = (
    "cli",
    "experiments",
    "app",
    "report | search | pricing",
    "sweep | world",
    "engine",
    "methods",
    "atlas | cache",
    "data",
    "clip",
    "threads",
    "files | errors | progress | vocabulary",
)


def layer_of() -> dict[str, tuple[int, str]]:
    """Top-level name (``atlas_fast.engine``) -> (layer index from the top, the name)."""
    table = {}
    for index, layer in enumerate(LAYERS):
        for name in layer.split("|"):
            table[f"atlas_fast.{name.strip()}"] = (index, name.strip())
    return table


def runtime_graph() -> dict[str, set[str]]:
    graph = import_graph()
    return {module: {m for m in imported if not m.endswith(".__main__")}
            for module, imported in graph.items() if not module.endswith(".__main__")}


def top_level(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_top_level_module_and_package_has_a_layer():
    names = {top_level(m) for m in module_files() if m != "atlas_fast"}
    assert sorted(names - set(layer_of())) == [], "add the new package to LAYERS and docs/architecture.md"
    assert sorted(set(layer_of()) - names) == []


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    layers = layer_of()
    found = []
    for importer, imported in sorted(graph.items()):
        if importer == "atlas_fast":
            continue
        source_index, source = layers[top_level(importer)]
        for module in sorted(imported):
            if module == "atlas_fast" or top_level(module) == top_level(importer):
                continue
            target_index, target = layers[top_level(module)]
            if target_index < source_index:
                found.append(f"{importer} imports {module}: layer '{source}' is below '{target}'")
            elif target_index == source_index:
                found.append(f"{importer} imports {module}: '{source}' and '{target}' are independent siblings")
    return found


def circles(graph: dict[str, set[str]]) -> list[str]:
    files = module_files()
    packages = sorted(m for m in files if files[m].name == "__init__.py")
    return [f"in {package}: {' <-> '.join(cycle)}" for package in packages
            for cycle in cycles(collapse(graph, package))]


def test_layers_import_only_downwards():
    assert layer_violations(runtime_graph()) == []


def test_no_import_circles_between_siblings_anywhere():
    assert circles(runtime_graph()) == []


def test_the_checks_fail_on_a_reintroduced_circle():
    """The checks are not vacuous: put back the data -> world import of old, or an engine circle, and they fail."""
    graph = runtime_graph()
    graph["atlas_fast.data.datasets"] = graph["atlas_fast.data.datasets"] | {"atlas_fast.world.benchmark"}
    assert any("atlas_fast.data" in c and "atlas_fast.world" in c for c in circles(graph))
    assert any("layer 'data' is below 'world'" in v for v in layer_violations(graph))
    graph = runtime_graph()
    graph["atlas_fast.engine.step"] = graph["atlas_fast.engine.step"] | {"atlas_fast.engine.loop"}
    assert any("atlas_fast.engine.loop" in c and "atlas_fast.engine.step" in c for c in circles(graph))


@pytest.mark.parametrize("source", ["from atlas_fast.world import benchmark\n",
                                    "def f():\n    import atlas_fast.world.benchmark\n"])
def test_the_graph_sees_module_level_and_function_local_imports(tmp_path, monkeypatch, source):
    import import_graph as reader

    (tmp_path / "atlas_fast" / "world").mkdir(parents=True)
    for name in ("__init__.py", "data.py", "world/__init__.py", "world/benchmark.py"):
        (tmp_path / "atlas_fast" / name).write_text("")
    (tmp_path / "atlas_fast" / "data.py").write_text(source)
    (tmp_path / "atlas_fast" / "world" / "benchmark.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import atlas_fast.data\n")
    monkeypatch.setattr(reader, "SOURCES", {"atlas_fast": tmp_path / "atlas_fast"})
    graph = reader.import_graph()
    assert "atlas_fast.world.benchmark" in graph["atlas_fast.data"]
    assert graph["atlas_fast.world.benchmark"] == set()  # a TYPE_CHECKING import is no dependency


def test_docs_architecture_lists_the_layers_in_this_order():
    """The layer table's first column names each layer's packages (`cli`, `sweep` | `world`, ...), top first."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [re.split(r"(?<!\\)\|", line)[1] for line in table.splitlines() if line.startswith("| ")]
    listed = [" | ".join(re.findall(r"`([a-z_]+)`", cell)) for cell in rows]
    assert [row for row in listed if row] == list(LAYERS)


def imports_of_the_top_level(top: str, source: str) -> list[str]:
    """The ``top`` package's modules (``tools.world.pretrain``) a source imports, function-local ones included."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [name for name in names if name == top or name.startswith(f"{top}.")]
    return found


def test_the_library_never_imports_the_research_tools():
    """tools/ (the world CLIP's pretraining and measurements) is not installed with atlas_fast: a module of the
    package or of experiments/ that imported it would fail in every installed copy."""
    offenders = {str(path): found for path in module_files().values()
                 if (found := imports_of_the_top_level("tools", path.read_text(encoding="utf-8")))}
    assert offenders == {}
    assert imports_of_the_top_level("tools", "def f():\n    from tools.world import pretrain\n") == ["tools.world"]


def test_the_world_keeps_in_the_package_only_what_users_run():
    """What the demo, `data standins`, the experiments and the benchmark datasets use stays in atlas_fast/world/;
    the research tools that made the shipped CLIP live in tools/world/."""
    repo = Path(__file__).resolve().parents[1]
    kept = sorted(path.stem for path in (repo / "atlas_fast" / "world").glob("*.py"))
    assert kept == ["__init__", "benchmark", "descriptions", "generator", "standin_images", "standin_plan",
                    "standins"]
    assert sorted(p.stem for p in (repo / "tools" / "world").glob("*.py")) == [
        "__init__", "calibration", "language", "pretrain", "properties", "zeroshot"]
