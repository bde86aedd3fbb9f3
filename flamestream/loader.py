"""Load a user's graph file (``examples/wordcount.py``) into a Graph.

The file is imported under a real module name so its functions get import
paths another process can resolve: if it sits in a package (``examples/`` has
an ``__init__.py``) the name is dotted from the first directory that is not a
package, and that directory is recorded in the graph's ``sys_path``.  The
module's name is recorded as the graph's ``module``: its package is where the
graph's business logic may come from (``flamestream.core.functions.Allowed``),
checked here before the graph runs or is deployed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from flamestream.core.functions import Allowed
from flamestream.core.graph import Graph, GraphError


def import_graph_module(path: str) -> tuple[ModuleType, str]:
    file = Path(path).resolve()
    if not file.is_file() or file.suffix != ".py":
        raise GraphError(f"graph file {path!r} is not an existing .py file")
    parts = [file.stem]
    root = file.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = ".".join(parts)
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        raise GraphError(f"cannot import graph file {path!r}: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, "__file__", None)
    if found is None or Path(found).resolve() != file:
        # The nodes import the graph by its module name too, so they would get the other module as well.
        raise GraphError(f"graph file {path!r} is importable only as module {name!r}, and that name is taken by "
                         f"{found or 'a built-in module'}: rename the file")
    return module, str(root)


def load_graph(path: str, allowed: Allowed | None = None) -> tuple[Graph, ModuleType]:
    """The module's ``graph()`` result, validated, with the module for its optional ``read_input``.

    Its functions must come from the graph file's package or ``allowed``
    (default: none besides flamestream's helpers), else ``FunctionNotAllowed``:
    the same check the nodes make, so the author hears of it first.
    """
    module, root = import_graph_module(path)
    build = getattr(module, "graph", None)
    if not callable(build):
        raise GraphError(f"graph file {path!r} must define a function graph() returning a flamestream.Graph")
    graph = build()
    if not isinstance(graph, Graph):
        raise GraphError(f"graph() in {path!r} returned {type(graph).__name__}, not a flamestream.Graph")
    graph.sys_path = [root]
    graph.module = module.__name__  # the graph file, even when graph() had a helper elsewhere build the Graph
    return graph.validate().check_functions(allowed or Allowed()), module


def read_inputs(module: ModuleType, path: str) -> Iterator[Any]:
    """Events from ``path`` (``-``: standard input): the module's ``read_input(path)`` if it has one, else one
    event per line.  A reader gets standard input as ``/dev/stdin``, a path like any other (it was skipped for
    ``-``, so a page corpus piped in became one event per line, each refused).  What the reader raises is the
    input's fault, told as a ``GraphError`` naming it, not a traceback."""
    reader = getattr(module, "read_input", None)
    if callable(reader):
        try:
            yield from reader("/dev/stdin" if path == "-" else path)
        except Exception as exc:
            raise GraphError(f"read_input({path!r}) of {module.__name__} failed: {type(exc).__name__}: {exc}") \
                from None
        return
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    with stream:
        for line in stream:
            yield line.rstrip("\n")
