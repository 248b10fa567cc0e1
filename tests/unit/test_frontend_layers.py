"""The frontend's folders are layers (docs/design.md, "The shape of the code"): a module imports
only from its own folder or from the folders below it, the launcher at the top imports from
all of them, and no two modules import each other, however indirectly.

Read from the source with ``ast`` (nothing is imported), so an import inside a function or under
``TYPE_CHECKING`` counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import dynamo.frontend

# Lowest first; "" is the package's top level (the launcher).
LAYERS = ("openai", "parsing", "processors", "routing", "serving", "")
PACKAGE = "dynamo.frontend"
ROOT = Path(dynamo.frontend.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The frontend modules ``name`` imports (a package's ``from pkg import mod`` is ``mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def layer(module: str) -> str:
    """The folder a module (or a folder's own package) is in; "" for the top level."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and (ROOT / parts[2]).is_dir() else ""


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def test_every_folder_is_a_known_layer() -> None:
    folders = {layer(name) for name in modules()}
    assert folders == set(LAYERS), f"declare each folder's place in LAYERS: {folders}"


def test_imports_only_go_down() -> None:
    upward = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in sorted(targets)
        if LAYERS.index(layer(target)) > LAYERS.index(layer(name))
    ]
    assert not upward, "imports running back up the frontend's folders:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    edges = graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for target in sorted(edges[name]):
            circle = visit(target, [*path, name])
            if circle:
                return circle
        done.add(name)
        return None

    for name in sorted(edges):
        circle = visit(name, [])
        assert circle is None, "import circle: " + " -> ".join(circle or ())


def test_the_checks_see_imports() -> None:
    """The graph is not empty by mistake: the top imports its processes' parts."""
    edges = graph()
    assert f"{PACKAGE}.process" in edges[f"{PACKAGE}.main"]
    assert f"{PACKAGE}.openai.protocol" in edges[f"{PACKAGE}.serving.http_service"]
    assert f"{PACKAGE}.openai.fields" in edges[f"{PACKAGE}.openai.protocol"]  # relative import
