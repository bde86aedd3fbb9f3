"""flamestream: the FlameStream model (Kuralenok et al., EDBT 2018) in Python.

The user API: the graph builder, the local runtime and the oracle from the
pure model (``flamestream.core``), and the SDK.  The layers below and the
rule of what may import what are in docs/architecture.md.

``Client`` and ``AsyncClient`` (the SDK) are exported too, but imported only
when first used: the SDK needs grpc and kazoo, which graph modules, the local
runtime and the workers' user code must not pay for at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flamestream.core.graph import Graph, GraphError, Node, Port
from flamestream.core.local import LocalRuntime, RunResult
from flamestream.core.meta import GlobalTime, LocalTime, Meta
from flamestream.core.oracle import run_oracle

if TYPE_CHECKING:
    from flamestream.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client", "GlobalTime", "Graph", "GraphError", "LocalRuntime", "LocalTime", "Meta", "Node",
           "Port", "RunResult", "run_oracle"]

_LAZY = {"AsyncClient": "flamestream.client", "Client": "flamestream.client"}
"""Exported names imported on first access (PEP 562), by the module defining them."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups find it directly, without coming back here
    return value
