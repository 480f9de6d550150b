"""The layers point one way: cli -> runners -> core, and inside the core from floor to floor
(docs/architecture.md). Read from the source, every import included (those inside functions too),
so a lazy import can hide neither an upward dependency nor an import cycle."""

import ast
import re
import sys
from pathlib import Path

import pytest

import euclip_cli

PACKAGE = Path(euclip_cli.__file__).parent

RUNNERS = ("train", "evaluate", "analysis", "report", "study", "released", "publish", "download")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def euclip_imports(path: Path, module_level: bool = False) -> set[str]:
    """The euclip modules (or module.name) ``path`` imports; ``module_level``: at import time only."""
    found = set()
    tree = ast.parse(path.read_text())
    for node in (tree.body if module_level else ast.walk(tree)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n.removeprefix("euclip_cli.") for n in names if n.startswith("euclip_cli.")}
    return found


# Drawing (matplotlib), which the runners share and the core never does.
FIGURES = "figures"


def layer(module: str) -> str:
    if module.startswith("cli") or module == "__main__":
        return "cli"
    if module == FIGURES:
        return "figures"
    if module.split(".")[0] in RUNNERS:
        return "runner:" + module.split(".")[0]
    return "core"


def allowed(importer: str, imported: str) -> bool:
    a, b = layer(importer), layer(imported)
    if a == "cli":
        return True
    if b == "cli":
        return False
    if a.startswith("runner"):
        return b in ("core", "figures") or b == a  # a runner never reaches into another runner
    if a == "figures":
        return b == "core"
    return b == "core"


def test_no_module_imports_from_a_higher_layer():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    wrong = []
    for name, path in modules.items():
        for imported in euclip_imports(path):
            # ``from euclip_cli.geometry import sphere`` names a module; ``... import Geometry`` a class in one.
            target = imported if imported in modules else imported.rsplit(".", 1)[0]
            if target in modules and not allowed(name, target):
                wrong.append(f"{name} ({layer(name)}) imports {target} ({layer(target)})")
    assert not wrong, "\n".join(wrong)


# The core's floors, bottom up: a module imports from its own floor or lower ones only.
CORE_FLOORS = (
    ("foundations", ("errors", "readers", "startup", "stats", "published", "data", "data.world", "data.decode", "geometry.facts",
                     "geometry.sphere", "geometry.euclidean", "geometry.lorentz")),
    ("facilities", ("device", "workers", "rundir", "worlddir", "hierarchy", "data.downloads", "data.fetch",
                    "data.datacomp", "data.loader", "data.world_tasks", "data.wordnet")),
    ("protocol", ("protocol", "protocol.tasks", "protocol.aggregate", "protocol.hits")),
    ("geometries", ("geometry", "geometry.registry")),
    ("config", ("config",)),
    ("parts", ("loss", "optim", "data.feed", "data.openclip_pipeline", "data.world_files", "data.redcaps",
               "data.photo_shards")),
    ("towers", ("towers", "towers.archs", "towers.attention", "towers.text", "towers.vision", "towers.checkpointing")),
    ("model", ("model",)),
    ("model users", ("step", "encode", "exported")),
)


def floor(module: str) -> int:
    for i, (_, members) in enumerate(CORE_FLOORS):
        if module in members:
            return i
    raise AssertionError(f"core module {module} has no floor in CORE_FLOORS (and docs/architecture.md)")


def target_of(imported: str, modules: dict) -> str:
    return imported if imported in modules else imported.rsplit(".", 1)[0]


def facades(modules: dict) -> set[str]:
    """The core modules docs/library.md documents: the library's surface, what the CLI may call."""
    text = (PACKAGE.parent / "docs" / "library.md").read_text()
    found = set()
    for name in re.findall(r"euclip_cli((?:\.[A-Za-z_]+)+)", text):
        parts = name.strip(".").split(".")
        found |= {".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules}
    return {m for m in found if layer(m) in ("core", "figures")}


def test_the_cli_calls_runners_and_the_librarys_documented_surface_only():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    surface = facades(modules)
    wrong = []
    for name, path in modules.items():
        if layer(name) != "cli":
            continue
        for target in import_targets(path, modules):
            if layer(target) in ("core", "figures") and target not in surface and target != "":  # "": the package, for its version
                wrong.append(f"{name} imports {target}, which docs/library.md does not document")
    assert not wrong, "\n".join(wrong)


def test_the_documented_surface_is_read_from_the_docs():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    surface = facades(modules)
    assert {"config", "rundir", "worlddir", "errors", "device", "geometry", "figures"} <= surface
    assert "data.loader" not in surface and "evaluate.runner" not in surface  # undocumented; a runner


def test_the_bench_stands_beside_the_product():
    """euclip_bench uses the library; the library knows the bench only as the CLI's ``bench`` alias and
    the ``euclip-bench`` entry point that starts it stoppable (and its models only through the
    ``euclip.archs`` entry point)."""
    reaching = [module_name(p) for p in PACKAGE.rglob("*.py")
                if any(n == "euclip_bench" or n.startswith("euclip_bench.") for n in all_imports(p))]
    assert sorted(reaching) == ["cli.entry", "cli.main"]


def all_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_the_core_is_built_floor_by_floor():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    wrong = []
    for name, path in modules.items():
        if layer(name) != "core":
            continue
        for imported in euclip_imports(path):
            target = target_of(imported, modules)
            if target in modules and target != name and layer(target) == "core" and floor(target) > floor(name):
                wrong.append(f"{name} ({CORE_FLOORS[floor(name)][0]}) imports {target} ({CORE_FLOORS[floor(target)][0]})")
    assert not wrong, "\n".join(wrong)


def import_targets(path: Path, modules: dict) -> set[str]:
    """The euclip modules ``path`` imports, at import time or inside a function: ``from package import
    submodule`` needs the submodule (the package is already being imported, as Python allows), and
    ``from module import name`` needs that module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("euclip_cli"):
            base = node.module.removeprefix("euclip_cli").lstrip(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}".lstrip(".")
                found.add(sub if sub in modules else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("euclip_cli.") for a in node.names if a.name.startswith("euclip_cli.")}
    return {t for t in found if t in modules}


def test_no_import_cycle_even_through_an_import_inside_a_function():
    """A function-level import hides a cycle from Python but not from the reader: two modules that need
    each other are one room."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {t for t in import_targets(path, modules) if t != name}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_cycle_check_finds_a_cycle(monkeypatch, tmp_path):
    package = tmp_path / "euclip_cli"
    package.mkdir()
    (package / "a.py").write_text("from euclip_cli import b\n")
    (package / "b.py").write_text("import json\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    test_no_import_cycle_even_through_an_import_inside_a_function()
    for b in ("import euclip_cli.a\n", "def f():\n    from euclip_cli import a\n"):
        (package / "b.py").write_text(b)
        with pytest.raises(AssertionError, match="import cycle: a -> b -> a|import cycle: b -> a -> b"):
            test_no_import_cycle_even_through_an_import_inside_a_function()


def test_the_layer_rule_catches_an_upward_import():
    assert not allowed("download.webshards", "evaluate.evalsets")  # the import this test was written after
    assert not allowed("analysis.embeddings", "evaluate.runner")
    assert not allowed("report.tables", "train.loop")
    assert allowed("report.tables", "protocol.aggregate") and allowed("cli.train", "train.loop")
    assert not allowed("protocol.tasks", "evaluate.runner")
    assert allowed("study.runner", "figures") and not allowed("figures", "study.runner")
    assert not allowed("model", "figures")
