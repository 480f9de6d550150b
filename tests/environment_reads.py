"""Every environment variable a package's code reads, found in its source (the fuzzer's list of variables).

A read is ``os.environ.get(NAME)``, ``os.environ[NAME]``, ``os.getenv(NAME)`` or ``NAME in os.environ``; a
function that reads the variable one of its parameters names (``environment_int(name, ...)``) is a reader, and
each of its calls with a literal name is a read of that name; a name bound by a ``for`` over a tuple of literal
names is each of them. A read whose name is none of these (built at run time) is reported as unresolved, so that
the fuzzer's list cannot miss it silently. Writes (``setdefault``, an assignment) and the whole environment
handed to a child (``dict(os.environ, ...)``) are not reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

READ_METHODS = ("get", "__getitem__", "__contains__")


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def _key_of_read(node: ast.AST):
    """The expression naming the variable ``node`` reads, or None where ``node`` is no read."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        func = node.func
        if func.attr == "get" and _is_environ(func.value):
            return node.args[0]
        if func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os":
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return node.slice
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _is_environ(node.comparators[0]):
        return node.left
    return None


def _called_name(node: ast.Call):
    return node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) \
        else None


class _Reads(ast.NodeVisitor):
    def __init__(self, where: str, readers: dict[str, int]):
        self.where, self.readers = where, readers
        self.loops: list[dict[str, list[str]]] = []  # names bound by enclosing for-loops over literal names
        self.params: list[list[str]] = []  # the parameters of the enclosing functions
        self.found: dict[str, set[str]] = {}
        self.new_readers: dict[str, int] = {}

    def _resolve(self, key: ast.AST, line: int) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            self.found.setdefault(key.value, set()).add(self.where)
            return
        if isinstance(key, ast.Name):
            for loop in reversed(self.loops):
                if key.id in loop:
                    for name in loop[key.id]:
                        self.found.setdefault(name, set()).add(self.where)
                    return
            if self.params and key.id in self.params[-1]:
                self.new_readers[self.function] = self.params[-1].index(key.id)
                return
        self.found.setdefault("?", set()).add(f"{self.where}:{line}")

    def visit_FunctionDef(self, node):
        previous = getattr(self, "function", None)
        self.function = node.name
        self.params.append([a.arg for a in node.args.posonlyargs + node.args.args])
        self.generic_visit(node)
        self.params.pop()
        self.function = previous

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_For(self, node):
        names = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List)) else []
        literal = names and all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in names)
        self.loops.append({node.target.id: [n.value for n in names]} if literal and isinstance(node.target, ast.Name)
                          else {})
        self.generic_visit(node)
        self.loops.pop()

    def generic_visit(self, node):
        key = _key_of_read(node)
        if key is not None:
            self._resolve(key, node.lineno)
        if isinstance(node, ast.Call) and _called_name(node) in self.readers:
            index = self.readers[_called_name(node)]
            if len(node.args) > index:
                self._resolve(node.args[index], node.lineno)
        super().generic_visit(node)


def variables_read(*packages: Path) -> dict[str, set[str]]:
    """{variable: the files that read it} over every ``.py`` file under ``packages``; "?" holds the places
    of reads whose name could not be resolved."""
    files = sorted((p, p.relative_to(package.parent)) for package in packages for p in package.rglob("*.py"))
    readers: dict[str, int] = {}
    while True:  # a reader found in one file makes its calls in every file reads
        found: dict[str, set[str]] = {}
        new: dict[str, int] = {}
        for file, shown in files:
            visitor = _Reads(str(shown), readers)
            visitor.visit(ast.parse(file.read_text(), str(file)))
            for name, where in visitor.found.items():
                found.setdefault(name, set()).update(where)
            new.update(visitor.new_readers)
        if set(new) <= set(readers):
            return found
        readers.update(new)
