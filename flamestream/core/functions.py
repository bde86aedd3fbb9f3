"""User functions are referenced by import path, never pickled.

A graph must travel as plain data to other processes (workers, Spark
executors), so every business-logic function is named ``package.module:attr``
and resolved where it runs.  Resolution errors name the path and the reason so
a bad deployment fails loudly at build/deploy time, not on the first item.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class FunctionRefError(ValueError):
    """A function reference cannot be resolved or cannot be expressed as a path."""


def resolve(path: str) -> Callable[..., Any]:
    """Import ``package.module:qualname`` and return the callable."""
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise FunctionRefError(f"function reference {path!r} must look like 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionRefError(f"cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise FunctionRefError(f"module {module_name!r} has no attribute {qualname!r} (from {path!r})") from None
    if not callable(target):
        raise FunctionRefError(f"{path!r} is not callable")
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
