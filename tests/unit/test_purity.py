"""The wire layer, the domain model and the message core are pure: no I/O, no event loop,
no service clients.

Checked on the source with `ast`, so an import inside a function is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "starlight_py"
PURE_PACKAGES = ("amqp", "model", "core")
BANNED = frozenset(
    {"trio", "socket", "kazoo", "pulsar", "asyncio", "threading", "urllib", "ssl", "subprocess"}
)
# What a pure module may import from this project: only other pure modules.
PURE_PROJECT_MODULES = (
    "starlight_py.amqp",
    "starlight_py.model",
    "starlight_py.core",
    "starlight_py.units",
)

PURE_MODULES = sorted(p for package in PURE_PACKAGES for p in (PACKAGE / package).rglob("*.py"))


def module_id(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def imported_modules(source: str, path: Path) -> list[str]:
    """Every module an import in `source` (the text of the file at `path`) names, at any
    depth. `from m import x` gives `m.x`, since x may be a submodule."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                package = path.relative_to(PACKAGE.parent).parent.parts
                parent = ".".join(package[: len(package) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names += [f"{base}.{alias.name}" for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(str(node.args[0].value))
    return names


def imports_of(path: Path) -> list[str]:
    return imported_modules(path.read_text(encoding="utf-8"), path)


def test_the_pure_layers_are_where_we_think() -> None:
    names = {module_id(p) for p in PURE_MODULES}
    assert {"amqp/connection.py", "amqp/framing.py", "model/namespaces.py"} <= names


@pytest.mark.parametrize("path", PURE_MODULES, ids=module_id)
def test_pure_module_imports_no_io(path: Path) -> None:
    banned = [name for name in imports_of(path) if name.split(".")[0] in BANNED]
    assert banned == []


@pytest.mark.parametrize("path", PURE_MODULES, ids=module_id)
def test_pure_module_imports_only_pure_project_modules(path: Path) -> None:
    # Otherwise the check above could be dodged through an impure project module.
    impure = [
        name
        for name in imports_of(path)
        if name.split(".")[0] == "starlight_py"
        and not any(name == pure or name.startswith(pure + ".") for pure in PURE_PROJECT_MODULES)
    ]
    assert impure == []


def test_the_checker_sees_every_kind_of_import() -> None:
    source = (
        "import os, socket as s\n"
        "from urllib.parse import urlsplit\n"
        "from . import framing\n"
        "from ..gateway import server\n"
        "from .errors import AMQPError\n"
        "def later():\n"
        "    import trio\n"
        "    import importlib\n"
        "    importlib.import_module('ssl')\n"
        "    __import__('kazoo.client')\n"
    )
    names = imported_modules(source, PACKAGE / "amqp" / "example.py")
    assert sorted(names) == sorted(
        [
            "os",
            "socket",
            "urllib.parse.urlsplit",
            "starlight_py.amqp.framing",
            "starlight_py.gateway.server",
            "starlight_py.amqp.errors.AMQPError",
            "trio",
            "importlib",
            "ssl",
            "kazoo.client",
        ]
    )
