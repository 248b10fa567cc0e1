"""Upstream ai-dynamo's release wheels, read without installing them.

``scripts/setup_upstream_env.sh`` downloads one ``ai_dynamo-X-py3-none-any.whl`` per release
the adapters are checked against (``pip download --no-deps``) into ``.upstream-wheels/`` in the
checkout, or into ``$UPSTREAM_WHEELS``; the tests find them there (``DYNAMO_UPSTREAM_WHEELS``
names another directory). A module of a release is its file in the wheel, parsed and compiled by
this Python, never run: its functions are code objects (what
:func:`dynamo_gc.upstream.hooks.looks_up_global` reads), its top-level names come from the syntax
tree (functions, classes, constants, and what it imports from where).
"""

from __future__ import annotations

import ast
import os
import types
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WHEELS_ENV = "DYNAMO_UPSTREAM_WHEELS"
DEFAULT_WHEELS = REPO / ".upstream-wheels"


def wheels_dir() -> Path:
    return Path(os.environ.get(WHEELS_ENV) or DEFAULT_WHEELS)


def wheel_path(version: str) -> Path | None:
    """The release's wheel in the wheels directory, or ``None``."""
    found = sorted(wheels_dir().glob(f"ai_dynamo-{version}-*.whl"))
    return found[-1] if found else None


def _walk_top_level(body: list[ast.stmt]):
    """The statements of a module's top level, into ``if`` / ``try`` blocks (imports guarded by
    a try, definitions under a version check) but not into functions or classes."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _walk_top_level(node.body)
            yield from _walk_top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _walk_top_level(block)
            for handler in node.handlers:
                yield from _walk_top_level(handler.body)


def _code_named(code: types.CodeType, name: str, line: int) -> types.CodeType:
    """The code object of the definition ``name`` whose ``def`` is on ``line`` (a decorated one
    starts at its first decorator, above it): the nearest one at or above that line."""
    candidates = [
        const
        for const in code.co_consts
        if isinstance(const, types.CodeType)
        and const.co_name == name
        and const.co_firstlineno <= line
    ]
    if not candidates:
        raise LookupError(f"no code object {name} at line {line}")
    return max(candidates, key=lambda const: const.co_firstlineno)


@dataclass
class StaticModule:
    """One module of a release: ``dotted`` name, its source, parsed and compiled."""

    dotted: str
    source: str
    tree: ast.Module = field(init=False)
    code: types.CodeType = field(init=False)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.source, filename=self.dotted)
        self.code = compile(self.tree, self.dotted, "exec")

    @cached_property
    def _definitions(self) -> dict[str, ast.AST]:
        found: dict[str, ast.AST] = {}
        for node in _walk_top_level(self.tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name, node)
        return found

    @cached_property
    def imports(self) -> dict[str, str]:
        """Each name imported at the top level (``from X import name``) and its module ``X``,
        relative imports resolved against this module's package."""
        package = self.dotted.rsplit(".", 1)[0]
        found: dict[str, str] = {}
        for node in _walk_top_level(self.tree.body):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parent = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                for alias in node.names:
                    found.setdefault(alias.asname or alias.name, base)
        return found

    def function(self, name: str) -> types.CodeType | None:
        """A top-level ``def`` / ``async def``, as its code object."""
        node = self._definitions.get(name)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        return _code_named(self.code, name, node.lineno)

    def is_async(self, name: str) -> bool:
        return isinstance(self._definitions.get(name), ast.AsyncFunctionDef)

    def method(self, class_name: str, name: str) -> types.CodeType | None:
        """A method of a top-level class, as its code object."""
        node = self._definitions.get(class_name)
        if not isinstance(node, ast.ClassDef):
            return None
        class_code = _code_named(self.code, class_name, node.lineno)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                return _code_named(class_code, name, item.lineno)
        return None

    def caller(self, dotted_caller: str) -> types.CodeType | None:
        """``function`` or ``Class.method``, as the adapters' hooks name their callers."""
        if "." in dotted_caller:
            class_name, name = dotted_caller.split(".", 1)
            return self.method(class_name, name)
        return self.function(dotted_caller)

    def constant(self, name: str) -> Any:
        """The literal a top-level ``NAME = <literal>`` assigns (``LookupError`` otherwise)."""
        for node in _walk_top_level(self.tree.body):
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == name for target in node.targets
            ):
                return ast.literal_eval(node.value)
        raise LookupError(f"{self.dotted} assigns no literal to {name}")

    def calls_in(self, function: str) -> list[tuple[int, str]]:
        """``(line, name)`` of every call by plain name (``make_engine(...)``) in a top-level
        function, in source order: where upstream's steps happen relative to each other."""
        node = self._definitions.get(function)
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), function
        calls = [
            (call.lineno, call.func.id)
            for call in ast.walk(node)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        ]
        return sorted(calls)

    def first_call(self, function: str, name: str) -> int:
        """The line of the first call of ``name`` in ``function`` (``LookupError``: none)."""
        for line, called in self.calls_in(function):
            if called == name:
                return line
        raise LookupError(f"{self.dotted}.{function} never calls {name}")


class Release:
    """One release's wheel: its modules, read on demand."""

    def __init__(self, version: str, path: Path) -> None:
        self.version = version
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self._names = set(self._zip.namelist())

    def _file(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self._names:
                return candidate
        return None

    def has_module(self, dotted: str) -> bool:
        return self._file(dotted) is not None

    def module(self, dotted: str) -> StaticModule:
        name = self._file(dotted)
        if name is None:
            raise LookupError(f"ai-dynamo {self.version} has no module {dotted}")
        return StaticModule(dotted, self._zip.read(name).decode("utf-8"))

    def sources_under(self, package: str) -> dict[str, str]:
        """Every ``.py`` file under ``package`` (``dynamo.frontend``): its path and its text."""
        prefix = package.replace(".", "/") + "/"
        return {
            name: self._zip.read(name).decode("utf-8")
            for name in sorted(self._names)
            if name.startswith(prefix) and name.endswith(".py")
        }

    def entry_points(self) -> str:
        """The wheel's entry_points.txt (empty when it has none)."""
        for name in self._names:
            if name.endswith(".dist-info/entry_points.txt"):
                return self._zip.read(name).decode("utf-8")
        return ""

    def close(self) -> None:
        self._zip.close()
