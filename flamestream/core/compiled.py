"""Which build of the core runs: the modules mypyc compiled (setup.py), or their pure-Python sources.

A compiled module sits next to its source (``grouping.cpython-311-x86_64-linux-gnu.so`` beside
``grouping.py``) and Python's import system prefers it.  The sources run instead when:

* ``FLAMESTREAM_PURE=1`` is set: the switch the fallback tests and ``bench/local.py --builds`` use to run the
  very same sources the interpreter runs on a machine without a compiler, in the same checkout;
* a source changed after its module was compiled in a source tree (an edit in an editable install: setup.py
  beside the package): the compiled one would silently run the old code, so the sources run and a warning says
  to rebuild (``pip install -e .``).  Only there: an installed wheel writes its files in any order, so their
  times say nothing, and nobody edits them.

All or nothing: compiled modules call each other's classes in C, so a compiled worker would keep using the
compiled grouping whatever the import system found for ``flamestream.core.grouping``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

PACKAGE = "flamestream.core"
_HERE = Path(__file__).parent

COMPILED = ("meta", "item", "hashing", "limits", "dead_letter", "payload", "grouping", "worker", "barrier", "acker",
            "front", "local", "columns", "splice")
"""The core modules setup.py compiles: what a record's processing runs through (issue 13's profiles, README
"Performance"), the local runtime's loop included, and the loop over a large bucket's parts that snapshots run
(``splice``).  Not the oracle (the definition to compare with, not a hot path), nor what runs once per deploy
(graph, plan, functions, tick)."""


def pure_requested() -> bool:
    """Whether ``FLAMESTREAM_PURE`` asks for the pure build: at install time, compile nothing (setup.py); at run
    time, load the sources."""
    return os.environ.get("FLAMESTREAM_PURE", "") not in ("", "0")


def compiled_modules() -> dict[str, Path]:
    """Module name -> source of every core module that has a compiled build next to its source."""
    found: dict[str, Path] = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for binary in _HERE.glob(f"*{suffix}"):
            source = _HERE / f"{binary.name[: -len(suffix)]}.py"
            if source.exists():
                found[f"{PACKAGE}.{source.stem}"] = source
    return dict(sorted(found.items()))


def _stale(modules: dict[str, Path]) -> list[str]:
    """Sources modified after their compiled module was built, in a source tree.

    Built when its module file or the group's shared library (``*__mypyc``
    beside the package, which holds every module's code) was last written:
    a rebuild after an edit that left a module's generated C as it was (a
    docstring) relinks the library but does not rewrite the module's small
    file, and that file's old time alone called a fresh build stale.
    """
    root = _HERE.parents[1]
    if not (root / "setup.py").is_file():
        return []
    group = [p.stat().st_mtime for s in importlib.machinery.EXTENSION_SUFFIXES for p in root.glob(f"*__mypyc{s}")]
    stale = []
    for name, source in modules.items():
        built = max([min(p.stat().st_mtime for s in importlib.machinery.EXTENSION_SUFFIXES
                         for p in _HERE.glob(f"{source.stem}{s}")), *group])
        if source.stat().st_mtime > built:
            stale.append(name)
    return stale


class _SourceFirst:
    """Meta path finder that loads the given core modules from their ``.py`` sources."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def choose() -> str:
    """Install the source loader if the pure build must run; returns which build runs: "compiled" or "pure"."""
    modules = compiled_modules()
    if not modules:
        return "pure"
    pure = pure_requested()
    stale = [] if pure else _stale(modules)
    if stale:
        warnings.warn(f"{', '.join(stale)} changed after being compiled: running the pure-Python core; rebuild "
                      "with `pip install -e .` (or install with FLAMESTREAM_PURE=1 to compile nothing)",
                      RuntimeWarning, stacklevel=2)
    if not (pure or stale):
        return "compiled"
    sys.meta_path.insert(0, _SourceFirst(modules))
    return "pure"
