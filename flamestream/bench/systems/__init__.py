"""The systems a benchmark compares: flamestream first, then its peers.

Each module defines one class implementing :class:`System`.  ``run`` pushes
what the pacer hands it, feeds every record its consumer receives to the
tracker, and returns once all pushed events are done (or the drain timeout
passed); the runner measures everything else the same way for all.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from flamestream.bench.harness import Pacer, RunSpec, Tracker
from flamestream.bench.workloads import Workload

SYSTEMS = {
    "flamestream": "flamestream.bench.systems.ours:Flamestream",
    "flamestream-separate": "flamestream.bench.systems.ours:FlamestreamSeparate",
    "flamestream-tls": "flamestream.bench.systems.ours:FlamestreamTLS",
    "spark": "flamestream.bench.systems.spark:SparkStructuredStreaming",
    "bytewax": "flamestream.bench.systems.bytewax:Bytewax",
    "python": "flamestream.bench.systems.python_loop:PythonLoop",
}
PEERS = ("spark", "bytewax", "python")


class System(Protocol):
    guarantees: str
    """What the system promises in this configuration, e.g. ``exactly-once`` or ``none``."""
    check_method: str
    """How its output compares to the oracle: ``changelog`` or ``final-state`` (see workloads)."""

    def setup(self, spec: RunSpec, workload: Workload) -> None: ...

    def run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        """Push, consume, wait for completion; returns extra figures (versions, replay overhead, ...)."""

    def close(self) -> None: ...


def load(name: str) -> System:
    try:
        target = SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; expected one of {', '.join(SYSTEMS)}") from None
    module, cls = target.split(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeError(f"{name} is not installed ({exc.name} missing): pip install 'flamestream[peers]'") from exc
    system: System = getattr(loaded, cls)()
    return system
