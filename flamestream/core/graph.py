"""The user's dataflow graph (paper §2.2, §2.5): build, validate, serialise.

Operations are map, broadcast, merge, grouping and sink, plus one source where
fronts inject items.  Cycles are allowed (reduce = grouping(window 2) + combine
map + loop).  Every business-logic function is an import path (see
``functions``), so a graph is plain data: ``to_dict``/``from_dict`` round-trip
through JSON and another process rebuilds the same graph.

Validation happens when the graph is finished (``validate``), collecting every
fault with the operation name in the message, because a user fixing a graph
wants the whole list at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flamestream.core.functions import FunctionRefError, reference

FnRef = Callable[..., Any] | str

KINDS = ("source", "map", "broadcast", "merge", "grouping", "sink")


class GraphError(ValueError):
    """The graph is malformed; the message lists every fault found."""


@dataclass(frozen=True)
class Operation:
    """One node: its kind, parameters and port counts (plain data only)."""

    name: str
    kind: str
    inputs: int
    outputs: int
    fn: str | None = None
    balance: str | None = None
    window: int | None = None
    equivalence: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Edge:
    src: str
    out: int
    dst: str
    inp: int


@dataclass(frozen=True)
class Port:
    """An operation's numbered input or output, for wiring merges/broadcasts."""

    node: Node
    index: int


@dataclass(frozen=True)
class Node:
    """Handle returned by the builder; ``a.to(b)`` wires a's output 0 to b's input 0."""

    graph: Graph
    name: str

    def out(self, index: int) -> Port:
        return Port(self, index)

    def inp(self, index: int) -> Port:
        return Port(self, index)

    def to(self, dst: Node | Port) -> Node:
        return self.graph.connect(self, dst)


@dataclass
class Graph:
    """Builder and container of operations and edges."""

    name: str = "graph"
    operations: dict[str, Operation] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)
    _faults: list[str] = field(default_factory=list, repr=False)

    # -- building -----------------------------------------------------------------

    def source(self, name: str = "source") -> Node:
        """Where fronts inject items; routed by the next operation's balancing function."""
        return self._add(Operation(name, "source", 0, 1))

    def map(self, fn: FnRef, balance: FnRef | None = None, name: str | None = None) -> Node:
        """``fn(payload)`` returns an iterable of 0..n output payloads."""
        name = self._name(name, "map")
        where = f"map {name!r}"
        return self._add(Operation(name, "map", 1, 1, fn=self._ref(fn, where), balance=self._ref(balance, where)))

    def broadcast(self, n: int, balance: FnRef | None = None, name: str | None = None) -> Node:
        """Replicate every item to ``n`` outputs (copies are siblings)."""
        name = self._name(name, "broadcast")
        return self._add(Operation(name, "broadcast", 1, n, balance=self._ref(balance, f"broadcast {name!r}")))

    def merge(self, n: int = 2, balance: FnRef | None = None, name: str | None = None) -> Node:
        """Forward items from ``n`` inputs to one output (used to close cycles)."""
        name = self._name(name, "merge")
        return self._add(Operation(name, "merge", n, 1, balance=self._ref(balance, f"merge {name!r}")))

    def grouping(self, window: int, balance: FnRef | None = None, equivalence: FnRef | None = None,
                 name: str | None = None) -> Node:
        """The only stateful operation: buckets by ``balance`` (and ``equivalence``), emits windows.

        ``equivalence(payload)`` returns a hashable key that splits items whose
        balancing hashes collide into distinct buckets.
        """
        name = self._name(name, "grouping")
        where = f"grouping {name!r}"
        return self._add(Operation(name, "grouping", 1, 1, balance=self._ref(balance, where), window=window,
                                   equivalence=self._ref(equivalence, where)))

    def sink(self, name: str = "sink") -> Node:
        """Items reaching a sink go to the barrier and, once valid, to the output."""
        return self._add(Operation(name, "sink", 1, 0))

    def connect(self, src: Node | Port, dst: Node | Port) -> Node:
        s = src if isinstance(src, Port) else Port(src, 0)
        d = dst if isinstance(dst, Port) else Port(dst, 0)
        self.edges.append(Edge(s.node.name, s.index, d.node.name, d.index))
        return d.node

    def _add(self, op: Operation) -> Node:
        if op.name in self.operations:
            self._faults.append(f"operation name {op.name!r} is used twice")
        else:
            self.operations[op.name] = op
        return Node(self, op.name)

    def _name(self, name: str | None, kind: str) -> str:
        if name is not None:
            return name
        i = sum(1 for op in self.operations.values() if op.kind == kind)
        return f"{kind}{i}"

    def _ref(self, fn: FnRef | None, where: str) -> str | None:
        if fn is None:
            return None
        try:
            return reference(fn)
        except FunctionRefError as exc:
            self._faults.append(f"{where}: {exc}")
            return None

    # -- validation ---------------------------------------------------------------

    def validate(self) -> Graph:
        """Raise ``GraphError`` listing every fault; return self when the graph is sound."""
        faults = list(self._faults)
        ops = self.operations
        sources = [op.name for op in ops.values() if op.kind == "source"]
        if len(sources) != 1:
            faults.append(f"a graph needs exactly one source, found {len(sources)}")
        if not any(op.kind == "sink" for op in ops.values()):
            faults.append("a graph needs at least one sink")
        for op in ops.values():
            faults.extend(_operation_faults(op))
        # ports of operations with non-integer port counts cannot be checked meaningfully
        ops = {name: op for name, op in ops.items() if type(op.inputs) is int and type(op.outputs) is int}
        outs: dict[tuple[str, int], int] = {}
        ins: dict[tuple[str, int], int] = {}
        for e in self.edges:
            edge = f"edge {e.src}[{e.out}] -> {e.dst}[{e.inp}]"
            for name, port, count, side in ((e.src, e.out, outs, "output"), (e.dst, e.inp, ins, "input")):
                end = ops.get(name)
                if end is None:
                    faults.append(f"{edge}: unknown operation {name!r}")
                elif not 0 <= port < (end.outputs if side == "output" else end.inputs):
                    faults.append(f"{edge}: {end.kind} {name!r} has no {side} {port}")
                else:
                    count[(name, port)] = count.get((name, port), 0) + 1
        for op in ops.values():
            for side, wired, ports, fix in (("output", outs, op.outputs, "use a broadcast"),
                                            ("input", ins, op.inputs, "use a merge")):
                for i in range(ports):
                    n = wired.get((op.name, i), 0)
                    if n == 0:
                        faults.append(f"dangling port: {side} {i} of {op.kind} {op.name!r} is not connected")
                    elif n > 1:
                        faults.append(f"{side} {i} of {op.kind} {op.name!r} is connected {n} times; {fix}")
        if len(sources) == 1:
            reached = self._reachable(sources[0])
            for op in ops.values():
                if op.name not in reached:
                    what = "unreachable sink" if op.kind == "sink" else "unreachable operation"
                    faults.append(f"{what}: {op.kind} {op.name!r} cannot be reached from the source")
        if faults:
            raise GraphError(f"invalid graph {self.name!r}:\n  - " + "\n  - ".join(faults))
        return self

    def _reachable(self, start: str) -> set[str]:
        seen = {start}
        frontier = [start]
        while frontier:
            name = frontier.pop()
            for e in self.edges:
                if e.src == name and e.dst not in seen and e.dst in self.operations:
                    seen.add(e.dst)
                    frontier.append(e.dst)
        return seen

    # -- serialisation ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        self.validate()
        return {
            "name": self.name,
            "sys_path": list(self.sys_path),
            "operations": [op.to_dict() for op in self.operations.values()],
            "edges": [[e.src, e.out, e.dst, e.inp] for e in self.edges],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Graph:
        """Rebuild and validate a graph shipped as plain data (function paths re-resolved)."""
        try:
            g = cls(name=str(data.get("name", "graph")), sys_path=[str(p) for p in data.get("sys_path", [])])
            _extend_sys_path(g.sys_path)
            for raw in data["operations"]:
                op = Operation(**raw)
                for fn in (op.fn, op.balance, op.equivalence):
                    g._ref(fn, f"{op.kind} {op.name!r}")
                g._add(op)
            g.edges = [Edge(str(s), int(o), str(d), int(i)) for s, o, d, i in data["edges"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphError(f"malformed graph data: {exc}") from exc
        return g.validate()

    @classmethod
    def from_json(cls, text: str) -> Graph:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraphError(f"graph is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise GraphError("graph JSON must be an object")
        return cls.from_dict(data)


_PORTS = {"source": (0, 1), "map": (1, 1), "grouping": (1, 1), "sink": (1, 0)}


def _operation_faults(op: Operation) -> list[str]:
    """Faults of one operation on its own: kind, port counts, required parameters."""
    where = f"{op.kind} {op.name!r}"
    if op.kind not in KINDS:
        return [f"operation {op.name!r}: unknown kind {op.kind!r}"]
    if not all(type(n) is int for n in (op.inputs, op.outputs)):
        return [f"{where}: port counts must be integers, got inputs={op.inputs!r} outputs={op.outputs!r}"]
    faults = []
    fixed = _PORTS.get(op.kind)
    if fixed is not None and (op.inputs, op.outputs) != fixed:
        faults.append(f"{where}: must have {fixed[0]} input(s) and {fixed[1]} output(s)")
    if op.kind == "broadcast":
        if op.inputs != 1:
            faults.append(f"{where}: needs exactly 1 input, got {op.inputs}")
        if op.outputs < 1:
            faults.append(f"{where}: needs at least 1 output, got {op.outputs}")
    if op.kind == "merge":
        if op.inputs < 1:
            faults.append(f"{where}: needs at least 1 input, got {op.inputs}")
        if op.outputs != 1:
            faults.append(f"{where}: needs exactly 1 output, got {op.outputs}")
    if op.kind == "map" and op.fn is None:
        faults.append(f"{where}: missing function")
    if op.kind == "grouping":
        if type(op.window) is not int or op.window < 1:
            faults.append(f"{where}: window must be an integer >= 1, got {op.window!r}")
        if op.balance is None:
            faults.append(f"{where}: missing hash (a grouping needs a balancing function)")
    return faults


def grouping_names(data: dict[str, Any]) -> set[str]:
    """The grouping names of a graph shipped as plain data (``Graph.to_dict``), without resolving (importing) its
    functions: what state is matched by from one tick to the next."""
    return {str(op["name"]) for op in data.get("operations", []) if op.get("kind") == "grouping"}


def _extend_sys_path(paths: list[str]) -> None:
    import sys

    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)
