"""The package's import graph stays layered: no import circle between bouquet's modules, and no
floor imports one above it (engine/ and server/ know nothing of the gateway; jobs/ use the
engine and the tokenizer, not the HTTP layer). Imports inside functions count too: a lazy
import is still a dependency."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "bouquet"
# (importer prefix, imported prefix) pairs that must not occur
FORBIDDEN = [
    ("bouquet.engine", "bouquet.server"), ("bouquet.engine", "bouquet.gateway"), ("bouquet.engine", "bouquet.jobs"),
    ("bouquet.server", "bouquet.gateway"), ("bouquet.server", "bouquet.jobs"),
    ("bouquet.jobs", "bouquet.gateway"), ("bouquet.jobs", "bouquet.server"),
    ("bouquet.proto", "bouquet.gateway"), ("bouquet.proto", "bouquet.server"), ("bouquet.proto", "bouquet.engine"),
    ("bouquet.tokenization", "bouquet.gateway"), ("bouquet.tokenized", "bouquet.gateway"), ("bouquet.bpe_fast", "bouquet.gateway"),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """Module → the bouquet modules it imports (``from a.b import c`` counts ``a.b.c`` when that is
    a module, else ``a.b``)."""
    modules = {module_name(p) for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        name = module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("bouquet")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bouquet"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in modules else node.module)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_circle() -> None:
    graph = imports()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " → ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_import_runs_up_a_floor() -> None:
    bad = [(m, d) for m, deps in imports().items() for d in deps
           for low, high in FORBIDDEN if (m == low or m.startswith(low + ".")) and (d == high or d.startswith(high + "."))]
    assert not bad, bad


# engine/'s floors, top to bottom: a module imports only from its own floor or those below
# (attention and linear share a floor and do not import each other); plan.py is the ground floor,
# dispatch.py (the documentation renderer) stands above everything
ENGINE_FLOORS = [("runtime",), ("heads",), ("models",), ("linear", "attention"), ("kernels",), ("plan",)]


def _engine_floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["bouquet", "engine"] or len(parts) < 3:
        return None
    return next((i for i, names in enumerate(ENGINE_FLOORS) if parts[2] in names), None)


def test_engine_subpackages_import_only_downward() -> None:
    bad = []
    for m, deps in imports().items():
        fm = _engine_floor(m)
        if fm is None:
            continue
        for d in deps:
            fd = _engine_floor(d)
            if fd is not None and (fd < fm or (fd == fm and m.split(".")[2] != d.split(".")[2])):
                bad.append((m, d))
    assert not bad, bad


def test_modelspec_and_the_family_table_import_nothing_of_the_engine() -> None:
    graph = imports()
    for m in ("bouquet.modelspec", "bouquet.families"):
        assert not [d for d in graph[m] if d.startswith("bouquet.engine")], graph[m]
