"""flamestream: the FlameStream model (Kuralenok et al., EDBT 2018) in Python.

The pure model lives here — meta, graph builder, operators, grouping, ack
table, barrier buffer, oracle — together with the user API; the service
packages (fronts, workers, acker, barrier, coordinator) are thin shells
around it.
"""

from flamestream.graph import Graph, GraphError, Node, Port
from flamestream.local import LocalRuntime, RunResult
from flamestream.meta import GlobalTime, LocalTime, Meta
from flamestream.oracle import run_oracle

__all__ = ["GlobalTime", "Graph", "GraphError", "LocalRuntime", "LocalTime", "Meta", "Node", "Port", "RunResult",
           "run_oracle"]
