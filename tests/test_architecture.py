"""The import rules of docs/architecture.md, enforced on the source with ``ast``.

Why: the layers only hold if every import points down.  One convenient import
is enough for the pure core to drag grpc into the local runtime and the oracle,
for the SDK to drag a server into a user's process, or for a service to start
depending on another service's internals; none of that breaks a test that runs
code, so it is checked here, statically, on every module of the package.

What counts as an import of module ``M``: every ``import x`` and ``from x import
y`` anywhere in ``M`` (module level, inside functions, under ``if
TYPE_CHECKING:``), relative imports resolved against ``M``'s package, and
``importlib.import_module("x")`` / ``__import__("x")`` with a literal name.
``from p import y`` is an import of the module ``p.y`` when the package has such
a module (``from flamestream import roles``), otherwise of ``p``; outside the
package it is taken as ``p.y`` (the test cannot tell a submodule from an
attribute without importing it, and the rules match by prefix anyway).

``TYPE_CHECKING`` imports count for every rule, third-party ones included: a
type named in a signature is a dependency of that signature (mypy must resolve
it, and so does anyone reading the layer), and no rule needs the exemption
today.  They are labelled in failure messages so the fix is obvious.

The walk follows the symlinked service folders (``flamestream/fronts -> ../fronts``)
so they are checked under the names they are imported by, and skips the
generated ``flamestream/wire/flamestream_pb2*.py`` (they still count as modules
that can be imported).  The rule texts are the doc's: ``test_doc_states_every_rule``
fails when the two drift apart.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flamestream"
DOC = ROOT / "docs" / "architecture.md"
GENERATED = "flamestream_pb2"
"""Prefix of the generated stubs in flamestream/wire/: not parsed (protoc's output is not ours to layer)."""

SERVICES = ("fronts", "workers", "acker", "barrier", "coordinator")
SERVICE_PACKAGES = tuple(f"flamestream.{name}" for name in SERVICES)
TOP = ("flamestream.__main__", "flamestream.cli", "flamestream.roles", "flamestream.bench", "flamestream.spark")
"""The top layer: entry points and batch tools, which may import anything below them."""

CORE_MAY_LOAD_NONE_OF = ("grpc", "grpc_health", "google.protobuf", "kazoo", "pyspark", "uvloop", "psutil")
"""What importing every core module in a fresh interpreter must leave out of sys.modules."""


def under(name: str, *prefixes: str) -> bool:
    """Whether dotted ``name`` is one of ``prefixes`` or inside one of them (``a.b`` is under ``a``, ``ab`` is not)."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


# -- the walk ---------------------------------------------------------------------------------------------------


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name, following the symlinked service folders."""
    found: dict[str, Path] = {}
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(PACKAGE, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back into the tree would otherwise walk forever
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(name for name in dirnames if name != "__pycache__")
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                path = Path(dirpath) / filename
                parts = path.relative_to(ROOT).with_suffix("").parts
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = module_files()
PARSED = {name: path for name, path in MODULES.items() if not path.name.startswith(GENERATED)}


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module."""
    target: str
    """The imported module, absolute."""
    line: int
    how: str = ""
    """Where the import sits when that is not plain module level: in a function, under TYPE_CHECKING..."""

    def __str__(self) -> str:
        return f"{self.module} imports {self.target} (line {self.line}{', ' + self.how if self.how else ''})"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """Collects one module's imports, resolved, with the context each sits in."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[Import] = []
        self._context: list[str] = []

    def _add(self, target: str, node: ast.stmt | ast.expr, how: str = "") -> None:
        context = [*self._context, how] if how else self._context
        self.found.append(Import(self.module, target, node.lineno, ", ".join(dict.fromkeys(context))))

    def _within(self, context: str, nodes: list[ast.stmt]) -> None:
        self._context.append(context)
        for node in nodes:
            self.visit(node)
        self._context.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for expr in [*node.decorator_list, node.args, *([node.returns] if node.returns else [])]:
            self.visit(expr)
        self._within("in a function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._within("under TYPE_CHECKING", node.body)
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if alias.name == "*":
                self._add(base, node)
            elif under(base, "flamestream"):
                self._add(sub if sub in MODULES else base, node)
            else:
                self._add(sub, node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
                self._add(first.value, node, f"via {name}()")
        self.generic_visit(node)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        parts = self.package.split(".")
        if node.level - 1 >= len(parts):
            raise AssertionError(f"{self.module}, line {node.lineno}: relative import beyond the top-level package")
        base = ".".join(parts[:len(parts) - (node.level - 1)])
        return f"{base}.{node.module}" if node.module else base


def imports_of(module: str, path: Path) -> list[Import]:
    collector = _Imports(module, path.name == "__init__.py")
    collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return collector.found


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return [found for module, path in PARSED.items() for found in imports_of(module, path)]


# -- the rules (docs/architecture.md, "Import rules", states the same texts) ---------------------------------------


@dataclass(frozen=True)
class Rule:
    id: str
    text: str
    """The rule as the doc states it, word for word (whitespace aside)."""
    applies: Callable[[str], bool]
    """Whether the rule constrains this importing module."""
    violated: Callable[[str, str], bool]
    """Whether importing ``target`` from ``module`` breaks the rule."""


def _only(*allowed: str) -> Callable[[str, str], bool]:
    """Violated by anything outside the standard library and ``allowed`` (module prefixes)."""
    return lambda _module, target: not (stdlib(target) or under(target, *allowed))


def _service_of(module: str) -> str | None:
    return next((service for service in SERVICE_PACKAGES if under(module, service)), None)


RULES = [
    Rule("core", "`flamestream.core.*` imports only the standard library, `orjson` and `flamestream.core.*`.",
         lambda module: under(module, "flamestream.core"),
         _only("orjson", "flamestream.core")),
    Rule("wire", "`flamestream.wire.*` imports only the standard library, `orjson`, `grpc`, `google.protobuf`, "
                 "`flamestream.core.*` and `flamestream.wire.*`.",
         lambda module: under(module, "flamestream.wire"),
         _only("orjson", "grpc", "google.protobuf", "flamestream.core", "flamestream.wire")),
    Rule("storage", "`flamestream.storage.*` imports only the standard library, `orjson`, `flamestream.core.*` and "
                    "`flamestream.storage.*`.",
         lambda module: under(module, "flamestream.storage"),
         _only("orjson", "flamestream.core", "flamestream.storage")),
    Rule("cluster", "`flamestream.cluster` imports only the standard library, `orjson`, `kazoo` and "
                    "`flamestream.core.*`.",
         lambda module: module == "flamestream.cluster",
         _only("orjson", "kazoo", "flamestream.core")),
    Rule("sdk", "`flamestream.client` imports nothing server-side: no `flamestream.runtime.*`, no service package, "
                "nothing of the top layer.",
         lambda module: module == "flamestream.client",
         lambda _module, target: under(target, "flamestream.runtime", *SERVICE_PACKAGES, *TOP)),
    Rule("runtime", "`flamestream.runtime.*` imports no service package, not `flamestream.client`, nothing of the "
                    "top layer.",
         lambda module: under(module, "flamestream.runtime"),
         lambda _module, target: under(target, *SERVICE_PACKAGES, "flamestream.client", *TOP)),
    Rule("services", "A service package never imports another service package.",
         lambda module: _service_of(module) is not None,
         lambda module, target: _service_of(target) not in (None, _service_of(module))),
    Rule("top", "Only the top layer imports the top layer (`flamestream.__main__`, `flamestream.cli`, "
                "`flamestream.roles`, `flamestream.bench.*`, `flamestream.spark.*`).",
         lambda module: not under(module, *TOP),
         lambda _module, target: under(target, *TOP)),
    Rule("examples", "Only `flamestream.bench.*` imports `examples` (its workloads are the example graphs).",
         lambda module: not under(module, "flamestream.bench"),
         lambda _module, target: under(target, "examples")),
    Rule("old-names", "No module imports `fronts`, `workers`, `acker`, `barrier` or `coordinator` as top-level "
                      "packages (they are `flamestream.fronts` ...).",
         lambda _module: True,
         lambda _module, target: target.split(".")[0] in SERVICES),
]

CORE_RUNTIME_RULE = ("core-runtime", "In a fresh interpreter, importing every `flamestream.core` module (and so "
                     "`flamestream/__init__.py`) loads none of " + ", ".join(f"`{n}`" for n in CORE_MAY_LOAD_NONE_OF)
                     + ".")


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_import_rule(rule: Rule, imports: list[Import]) -> None:
    constrained = [found for found in imports if rule.applies(found.module)]
    assert constrained, f"rule {rule.id} constrains no import at all: the walk or the rule is broken"
    broken = [found for found in constrained if rule.violated(found.module, found.target)]
    assert not broken, f"rule {rule.id!r} ({rule.text}) is broken by:\n" + "\n".join(f"  {b}" for b in broken)


def test_core_imports_no_server_library_at_runtime() -> None:
    """The static rule misses what a core import drags in transitively (the package __init__ runs first)."""
    core = sorted(name for name in PARSED if under(name, "flamestream.core"))
    probe = "\n".join([
        "import importlib, json, sys",
        f"sys.path.insert(0, {str(ROOT)!r})",
        f"def loaded(): return [name for name in {CORE_MAY_LOAD_NONE_OF!r} if name in sys.modules]",
        f"for name in {core!r}: importlib.import_module(name)",
        "core = loaded()",
        # The control: a probe that would see nothing proves nothing.
        "importlib.import_module('flamestream.wire.transport')",
        "print(json.dumps({'core': core, 'control': loaded()}))",
    ])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "grpc" in result["control"], "the probe does not see grpc loaded by flamestream.wire.transport"
    assert result["core"] == [], f"importing {', '.join(core)} loaded {', '.join(result['core'])}"


def test_walk_sees_every_layer() -> None:
    """Rules over a partial walk pass vacuously: the linked services and the generated stubs must be found."""
    expected = ["flamestream", "flamestream.core.meta", "flamestream.wire.codec", "flamestream.storage.log",
                "flamestream.cluster", "flamestream.client", "flamestream.runtime.node", "flamestream.roles",
                "flamestream.cli", "flamestream.bench.workloads", "flamestream.spark.replay",
                *SERVICE_PACKAGES, "flamestream.fronts.service",
                "flamestream.workers.service", "flamestream.acker.service", "flamestream.barrier.service",
                "flamestream.coordinator.zookeeper"]
    assert [name for name in expected if name not in PARSED] == []
    assert {"flamestream.wire.flamestream_pb2", "flamestream.wire.flamestream_pb2_grpc"} <= set(MODULES) - set(PARSED)


def test_resolution_of_relative_conditional_and_dynamic_imports() -> None:
    """The resolver itself, on the shapes the package uses: a rule is only as good as what it is fed."""
    source = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\nfrom . import service\n"
              "from ..core import meta\nfrom .. import roles, Graph\nif TYPE_CHECKING:\n    import grpc\n"
              "def f():\n    from google import protobuf\n    importlib.import_module('kazoo.client')\n")
    collector = _Imports("flamestream.fronts.producers", is_package=False)
    collector.visit(ast.parse(source))
    assert [(found.target, found.how) for found in collector.found[2:]] == [
        ("flamestream.fronts.service", ""), ("flamestream.core.meta", ""), ("flamestream.roles", ""),
        ("flamestream", ""), ("grpc", "under TYPE_CHECKING"), ("google.protobuf", "in a function"),
        ("kazoo.client", "in a function, via import_module()")]


def _normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_doc_states_every_rule() -> None:
    """The doc is what maintainers read; it must say exactly what is enforced here."""
    doc = _normalized(DOC.read_text(encoding="utf-8"))
    stated = [(rule.id, rule.text) for rule in RULES] + [CORE_RUNTIME_RULE]
    missing = [f"`{rule_id}`: {text}" for rule_id, text in stated if f"`{rule_id}`: {_normalized(text)}" not in doc]
    assert not missing, "docs/architecture.md does not state:\n" + "\n".join(missing)
    assert len(re.findall(r"^- `[\w-]+`: ", DOC.read_text(encoding="utf-8"), re.MULTILINE)) == len(stated), \
        "docs/architecture.md states a rule the test does not enforce"


def test_doc_names_only_existing_files() -> None:
    """The concept table points maintainers at files; a rename must not leave it pointing at nothing."""
    paths = set(re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|proto|md))`", DOC.read_text(encoding="utf-8")))
    assert paths, "no file paths found in docs/architecture.md"
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []
