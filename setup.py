"""Build: the hot path of the core compiled to C with mypyc, or pure Python where that cannot be done.

Why mypyc: the core is already mypy-strict, so the same sources compile
without a second language (Cython would need its own declarations to be
faster), and the pure-Python fallback is those very sources.  Which modules:
the ones a record passes through on every hop (issue 13's measurements,
README "Performance"); the rest stay interpreted.

Pure Python instead, with a message saying why: ``FLAMESTREAM_PURE=1`` at build
time, or a machine where mypyc or a C compiler is missing or fails.  Everything
else (package data, dependencies) is in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

GROUP = "flamestream_core"
"""mypyc's group name: its shared library (``flamestream_core__mypyc``) holds the code of every compiled module,
so calls between them are C calls."""


def _load_compiled() -> Any:
    """``flamestream.core.compiled`` (which modules to compile, the FLAMESTREAM_PURE switch), loaded without
    importing the package: its dependencies may not be installed in the build environment."""
    path = Path(__file__).parent / "flamestream" / "core" / "compiled.py"
    spec = importlib.util.spec_from_file_location("_flamestream_compiled", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_COMPILED_MODULE = _load_compiled()
COMPILED = [f"flamestream/core/{name}.py" for name in _COMPILED_MODULE.COMPILED]


def _say(message: str) -> None:
    print(f"flamestream: {message}", file=sys.stderr)


def _remove_compiled() -> None:
    """Delete compiled modules an earlier in-place (editable) build left next to the sources: Python would import
    them instead of the sources, so a pure install would silently stay compiled, and stale."""
    here = Path(__file__).parent
    stale = [*here.glob(f"{GROUP}__mypyc.*.so")]
    for source in COMPILED:
        module = here / source
        stale += module.parent.glob(f"{module.stem}.*.so")
    for path in stale:
        path.unlink()


class _OptionalBuildExt(build_ext):
    """Builds the compiled modules, or leaves the package pure Python if the compiler is missing or fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler (DistutilsPlatformError), a failing one (CompileError): fall back
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        _say(f"compiling the hot path failed ({type(exc).__name__}: {str(exc)[:300]}); installing pure Python "
             "(slower, same behaviour). Install a C compiler (gcc) and reinstall to compile it.")
        self.extensions = []
        _remove_compiled()


def _extensions() -> list[Any]:
    if _COMPILED_MODULE.pure_requested():
        _say("FLAMESTREAM_PURE is set: installing pure Python, nothing compiled")
        _remove_compiled()
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _say(f"mypyc is not available ({exc}); installing pure Python (install mypy to compile the hot path)")
        _remove_compiled()
        return []
    # Imports outside the compiled modules are followed without reporting their errors: the build environment has
    # mypy, not the stubs of grpc and the rest that the package's __init__ reaches (the `mypy` run checks those).
    return list(mypycify([*COMPILED, "--follow-imports=silent"], opt_level="3", group_name=GROUP))


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
