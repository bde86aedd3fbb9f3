"""User functions are referenced by import path, never pickled.

A graph must travel as plain data to other processes (workers, Spark
executors), so every business-logic function is named ``package.module:attr``
and resolved where it runs.  Resolution errors name the path and the reason so
a bad deployment fails loudly at build/deploy time, not on the first item.

A graph is data, and data must not choose what code runs (issue #12): a tick
naming ``os:system`` as a map would run every payload as a shell command.  So
where a graph arrives from elsewhere (a tick, a deploy, a graph file), its
references resolve under an ``Allowed`` policy: only the graph's own package,
flamestream's helpers for graphs and modules the operator listed
(``--allow-module``).  The policy is checked on the module *name* before
anything is imported, because importing a module already runs its code.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import site
import sys
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import PurePath
from types import ModuleType
from typing import Any


class FunctionRefError(ValueError):
    """A function reference cannot be resolved or cannot be expressed as a path."""


class FunctionNotAllowed(FunctionRefError):
    """A function reference resolves outside the modules the policy allows (``Allowed``)."""


STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | {"builtins", "__main__"}
"""Top-level names that are never trusted implicitly: the standard library can run commands (``os:system``,
``subprocess:run``), evaluate text (``builtins:eval``) or import anything (``importlib:import_module``)."""

FLAMESTREAM_HELPERS = ("flamestream.core.hashing",)
"""The part of flamestream a graph may reference (``stable_hash``).  Not all of ``flamestream``: it holds the CLI
(``flamestream.cli:main`` runs a command line), the graph loader (imports any file by path) and storage, each a way
for a payload to run code or touch files."""

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_INSTALL_DIRS = tuple(
    PurePath(p) for p in {*(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
                          *site.getsitepackages(), site.getusersitepackages()}
)
"""Where the standard library and installed distributions live: a module found there is not a graph's own."""


def check_module_name(name: str) -> str:
    """``name`` if it is a dotted module name (an ``--allow-module`` value), else ``FunctionRefError``."""
    if not _MODULE_NAME.fullmatch(name):
        raise FunctionRefError(f"{name!r} is not a module name such as 'mypackage' or 'mypackage.helpers'")
    return name


def _top(module: str) -> str:
    return module.partition(".")[0]


def _under(module: str, prefix: str) -> bool:
    """Prefix semantics: ``a.b`` covers ``a.b`` and ``a.b.c``, never ``a.bc``."""
    return module == prefix or module.startswith(prefix + ".")


def _installed(location: str | None) -> bool:
    if location is None:
        return False
    path = PurePath(location)
    return any(part in ("site-packages", "dist-packages") for part in path.parts) or \
        any(path.is_relative_to(d) for d in _INSTALL_DIRS)


def module_location(module: str) -> str | None:
    """Where the top-level package of ``module`` would be imported from, without importing (running) it.

    Only the top level: finding ``a.b`` would import ``a``.  None when it
    cannot be found (resolving will then say so).
    """
    top = _top(module)
    loaded = sys.modules.get(top)
    spec = getattr(loaded, "__spec__", None) if loaded is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return str(spec.origin)
    locations = list(spec.submodule_search_locations or [])
    return str(locations[0]) if locations else spec.origin


@dataclass(frozen=True)
class Allowed:
    """Which modules a graph's functions may come from: pure data, so the same policy is checked in every process.

    ``modules`` are the operator's ``--allow-module`` prefixes (``a.b`` allows
    ``a.b`` and ``a.b.c``); a standard-library module is allowed only when
    listed exactly (``--allow-module os`` is ``os``, not ``os.path``), because
    a prefix meant for one helper must not open a whole toolbox.  ``own`` is
    the package of the module that defined the graph (set by ``for_graph``):
    the user's business logic lives next to the graph.
    """

    modules: tuple[str, ...] = ()
    own: str | None = None
    own_refused: str = ""
    """Why the graph's module could not be trusted as its own (shown when one of its functions is refused)."""

    @classmethod
    def of(cls, modules: Iterable[str]) -> Allowed:
        return cls(tuple(check_module_name(m) for m in modules))

    def for_graph(self, module: str | None, location: str | None = None) -> Allowed:
        """This policy plus the package of ``module``, the graph's own (``location``: where ``module_location``
        found it).

        The module name comes with the graph, i.e. from whoever wrote the tick,
        so it may not name the standard library (``os`` as "own" would allow
        ``os:system``) nor an installed distribution (``psutil:Popen`` runs
        commands): those must be listed with ``--allow-module``.
        """
        if module is None or module == "__main__":
            return replace(self, own=None, own_refused="")
        if not _MODULE_NAME.fullmatch(module):
            return replace(self, own=None, own_refused=f"the graph's module {module!r} is not a module name")
        if _top(module) in STANDARD_LIBRARY:
            return replace(self, own=None, own_refused=f"the graph's module {module!r} is in the standard library")
        if _installed(location):
            return replace(self, own=None,
                           own_refused=f"the graph's module {module!r} is an installed package ({location})")
        package = module.rpartition(".")[0] or module
        return replace(self, own=package, own_refused="")

    def permits(self, module: str) -> bool:
        if _top(module) in STANDARD_LIBRARY:
            return module in self.modules
        prefixes = (*self.modules, *FLAMESTREAM_HELPERS, *([self.own] if self.own else []))
        return any(_under(module, prefix) for prefix in prefixes)

    def explain(self) -> str:
        """What this policy allows, for refusal messages."""
        allowed = [*([f"the graph's own package {self.own!r}"] if self.own else []),
                   *(repr(m) for m in FLAMESTREAM_HELPERS), *(repr(m) for m in self.modules)]
        note = f" ({self.own_refused})" if self.own_refused else ""
        return f"allowed: {', '.join(allowed)}{note}"

    def _refuse(self, path: str, why: str, module: str) -> FunctionNotAllowed:
        return FunctionNotAllowed(
            f"function {path!r} is not allowed: {why}; {self.explain()}. To allow it, pass --allow-module {module} "
            "(to deploy or run, and to every node: nodes check with their own list)")


_POLICY = Allowed()


def process_policy() -> Allowed:
    """The policy of this process, used where a graph is rebuilt from data without an explicit one.

    A process-wide setting because the services that rebuild graphs from
    ticks (workers, fronts, Spark replay) take no policy themselves: the node
    sets it once from its command line (``set_process_policy``) before any tick
    arrives.  The default allows only the graph's own package and flamestream's
    helpers.
    """
    return _POLICY


def set_process_policy(policy: Allowed) -> None:
    """Install the policy ``process_policy`` returns (a node's ``--allow-module``)."""
    global _POLICY
    _POLICY = policy


def resolve(path: str, allowed: Allowed | None = None) -> Callable[..., Any]:
    """Import ``package.module:qualname`` and return the callable.

    With ``allowed`` the reference must stay inside allowed modules: the
    module is checked before it is imported, no part of the attribute path
    may be a dunder (``mod:__builtins__.eval``), the walk may not pass
    through another module (``mod:os.system`` after ``import os``), and the
    callable must be defined in an allowed module (``mod:system`` after
    ``from os import system``).  Without it (the user's own process building
    a graph from its own code) anything importable resolves.
    """
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise FunctionRefError(f"function reference {path!r} must look like 'package.module:function'")
    if allowed is not None:
        if not allowed.permits(module_name):
            raise allowed._refuse(path, f"module {module_name!r} is not an allowed module", module_name)
        dunder = next((part for part in qualname.split(".") if part.startswith("__")), None)
        if dunder is not None:
            raise FunctionNotAllowed(f"function {path!r} is not allowed: its attribute path goes through {dunder!r} "
                                     "(dunder attributes reach interpreter internals such as __builtins__)")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionRefError(f"cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise FunctionRefError(f"module {module_name!r} has no attribute {qualname!r} (from {path!r})") from None
        if allowed is not None and isinstance(target, ModuleType):
            raise FunctionNotAllowed(
                f"function {path!r} is not allowed: its attribute path leaves module {module_name!r} for module "
                f"{target.__name__!r}; reference that module directly (and allow it with --allow-module "
                f"{target.__name__})")
    if not callable(target):
        raise FunctionRefError(f"{path!r} is not callable")
    if allowed is not None:
        owner = getattr(target, "__module__", None)
        if not isinstance(owner, str) or not allowed.permits(owner):
            raise allowed._refuse(path, f"it is defined in module {owner!r}, not in an allowed module",
                                  owner if isinstance(owner, str) else module_name)
    return target  # type: ignore[no-any-return]


def reference(fn: Callable[..., Any] | str) -> str:
    """The import path of ``fn``; checks it resolves back to the same object.

    Lambdas, closures and methods of instances have no stable path, so they are
    rejected with a message telling the user what to write instead.
    """
    if isinstance(fn, str):
        resolve(fn)
        return fn
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise FunctionRefError(
            f"{fn!r} has no import path; define it as a module-level function "
            "(lambdas and nested functions cannot be shipped to workers)"
        )
    path = f"{module}:{qualname}"
    if module == "__main__":
        raise FunctionRefError(f"{path!r} lives in __main__; put it in an importable module")
    if resolve(path) is not fn:
        raise FunctionRefError(f"{path!r} does not resolve back to {fn!r}")
    return path
