"""The layers point one way: cli -> runners -> core. Read from the source, every import included
(those inside functions too), so a lazy import cannot hide an upward dependency."""

import ast
from pathlib import Path

import euclip_cli

PACKAGE = Path(euclip_cli.__file__).parent

# The task registry and its aggregation are the evaluation protocol, torch-free, read by every runner.
REGISTRIES = ("evaluate.tasks", "evaluate.aggregate")
RUNNERS = ("train", "evaluate", "analysis", "report", "bench", "study", "released")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def euclip_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n.removeprefix("euclip_cli.") for n in names if n.startswith("euclip_cli.")}
    return found


def layer(module: str) -> str:
    if module.startswith("cli") or module == "__main__":
        return "cli"
    if module.startswith(REGISTRIES):
        return "registry"
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
        return b in ("core", "registry") or b == a  # a runner never reaches into another runner
    if a == "registry":
        return b in ("core", "registry")
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


def test_the_layer_rule_catches_an_upward_import():
    assert not allowed("data.webshards", "evaluate.evalsets")  # the import this test was written after
    assert not allowed("analysis.embeddings", "evaluate.runner")
    assert not allowed("report.tables", "train.loop")
    assert allowed("report.tables", "evaluate.aggregate") and allowed("cli.train", "train.loop")
