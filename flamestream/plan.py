"""A validated graph compiled for execution: integer indices and resolved callables.

Both the worker core and the oracle walk the same plan, so they agree on what
each operation *is*; they differ only in how items are ordered and delivered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flamestream.functions import resolve
from flamestream.graph import Graph
from flamestream.hashing import stable_hash

MAP, BROADCAST, MERGE, GROUPING, SINK = range(5)
_KIND_CODES = {"map": MAP, "broadcast": BROADCAST, "merge": MERGE, "grouping": GROUPING, "sink": SINK}


@dataclass
class Plan:
    names: list[str]
    kinds: list[int]
    fns: list[Callable[[Any], Any] | None]
    balances: list[Callable[[Any], int] | None]
    """Per operation input: payload -> int32 hash, or None to stay on the current worker."""
    equivalences: list[Callable[[Any], Any] | None]
    windows: list[int]
    routes: list[list[int]]
    """routes[op][output port] = index of the downstream operation."""
    entry: int
    """The operation the source feeds; fronts route by its balancing function."""

    @property
    def entry_balance(self) -> Callable[[Any], int]:
        """Fronts must pick a worker, so an unbalanced entry falls back to a stable payload hash."""
        return self.balances[self.entry] or stable_hash


def compile_graph(graph: Graph) -> Plan:
    graph.validate()
    ops = [op for op in graph.operations.values() if op.kind != "source"]
    index = {op.name: i for i, op in enumerate(ops)}
    routes: list[list[int]] = [[-1] * op.outputs for op in ops]
    entry = -1
    for e in graph.edges:
        if graph.operations[e.src].kind == "source":
            entry = index[e.dst]
        else:
            routes[index[e.src]][e.out] = index[e.dst]

    def fn(path: str | None) -> Callable[[Any], Any] | None:
        return None if path is None else resolve(path)

    return Plan(
        names=[op.name for op in ops],
        kinds=[_KIND_CODES[op.kind] for op in ops],
        fns=[fn(op.fn) for op in ops],
        balances=[fn(op.balance) for op in ops],
        equivalences=[fn(op.equivalence) for op in ops],
        windows=[op.window or 0 for op in ops],
        routes=routes,
        entry=entry,
    )
