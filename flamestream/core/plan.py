"""A validated graph compiled for execution: integer indices and resolved callables.

Both the worker core and the oracle walk the same plan, so they agree on what
each operation *is*; they differ only in how items are ordered and delivered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from flamestream.core.functions import resolve
from flamestream.core.graph import Graph
from flamestream.core.hashing import stable_hash
from flamestream.core.limits import MAX_OUTPUT_BYTES, MAX_OUTPUTS

MAP: Final = 0
BROADCAST: Final = 1
MERGE: Final = 2
GROUPING: Final = 3
SINK: Final = 4
"""Operation kinds as small ints, ``Final`` so that the compiled core inlines them: a plain module constant is a
dict lookup in the module's globals wherever compiled code reads it (mypyc), about forty per word in the
worker's loop on word count."""
_KIND_CODES: Final = {"map": MAP, "broadcast": BROADCAST, "merge": MERGE, "grouping": GROUPING, "sink": SINK}


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
    replicated: bool = False
    """Every worker runs the stateless prefix over every input, keeping only its own hash range (see worker)."""
    max_outputs: int = MAX_OUTPUTS
    max_output_bytes: int = MAX_OUTPUT_BYTES
    """The graph's per-item output caps (``limits.bounded_outputs``), the same in every process."""

    @property
    def entry_balance(self) -> Callable[[Any], int]:
        """Fronts must pick a worker, so an unbalanced entry falls back to a stable payload hash."""
        return self.balances[self.entry] or stable_hash


def _stateless_prefix(kinds: list[int], balances: list[Any], routes: list[list[int]], entry: int) -> bool:
    """Whether everything reachable from ``entry`` without a hashed hop is stateless (no unbalanced grouping)."""
    seen: set[int] = set()
    frontier = [entry]
    while frontier:
        op = frontier.pop()
        if op in seen or (op != entry and balances[op] is not None):
            continue
        seen.add(op)
        if kinds[op] == GROUPING:
            return False
        frontier.extend(routes[op])
    return True


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

    kinds = [_KIND_CODES[op.kind] for op in ops]
    balances = [fn(op.balance) for op in ops]
    return Plan(
        names=[op.name for op in ops],
        kinds=kinds,
        fns=[fn(op.fn) for op in ops],
        balances=balances,
        equivalences=[fn(op.equivalence) for op in ops],
        windows=[op.window or 0 for op in ops],
        routes=routes,
        entry=entry,
        # An unbalanced entry has no owner to prefer, and a replicated stateless prefix hands every
        # grouping one front's items in global-time order: no cross-worker race, so no replays.
        replicated=balances[entry] is None and _stateless_prefix(kinds, balances, routes, entry),
        max_outputs=graph.max_outputs,
        max_output_bytes=graph.max_output_bytes,
    )
