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
from types import FrameType
from typing import Any

from flamestream.core.functions import (
    Allowed,
    FunctionNotAllowed,
    FunctionRefError,
    module_location,
    process_policy,
    reference,
    resolve,
)
from flamestream.core.limits import MAX_OUTPUT_BYTES, MAX_OUTPUTS

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
    module: str | None = None
    """The module that defined the graph (found from the caller when not given; the loader sets the graph file's).
    Shipped with the graph, so the processes that rebuild it trust that module's package (``Allowed.for_graph``)."""
    _faults: list[str] = field(default_factory=list, repr=False)
    max_outputs: int = MAX_OUTPUTS
    """Most outputs one map call may produce for one item; beyond it the item is a dead letter
    (``limits.bounded_outputs``).  Part of the graph so every process cuts the same items."""
    max_output_bytes: int = MAX_OUTPUT_BYTES
    """Most estimated bytes of one map call's outputs for one item (``limits.estimated_size``)."""

    def __post_init__(self) -> None:
        if self.module is None:
            self.module = _defining_module()

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

    def sink(self, name: str | None = None) -> Node:
        """Items reaching a sink go to the barrier and, once valid, to the output.  Unnamed: ``sink``, then
        ``sink1``, ``sink2``... (a second ``sink()`` was ``sink`` again, refused as a name used twice)."""
        if name is None:
            sinks = sum(1 for op in self.operations.values() if op.kind == "sink")
            name = f"sink{sinks}" if sinks else "sink"
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
        for limit in ("max_outputs", "max_output_bytes"):
            value = getattr(self, limit)
            if type(value) is not int or value < 1:
                faults.append(f"{limit} must be an integer >= 1, got {value!r}")
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
            "module": self.module,
            "operations": [op.to_dict() for op in self.operations.values()],
            "edges": [[e.src, e.out, e.dst, e.inp] for e in self.edges],
            # Only when set, so graphs that keep the defaults serialise as before.
            **({"max_outputs": self.max_outputs} if self.max_outputs != MAX_OUTPUTS else {}),
            **({"max_output_bytes": self.max_output_bytes} if self.max_output_bytes != MAX_OUTPUT_BYTES else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def check_functions(self, allowed: Allowed) -> Graph:
        """Raise ``FunctionNotAllowed`` naming every function reference ``allowed`` (plus the graph's own package)
        refuses; return self when there is none.

        Called before a graph leaves its author (deploy, run): refusing there
        gives the author the message instead of a node's log.
        """
        _check_functions(self.name, self.module, list(self.operations.values()), allowed)
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any], allowed: Allowed | None = None) -> Graph:
        """Rebuild and validate a graph shipped as plain data (function paths re-resolved).

        Every reference is checked against ``allowed`` (default: this process's
        policy, ``process_policy``) plus the graph's own package *before*
        anything is imported, so data cannot pick the code that runs; a refusal
        raises ``FunctionNotAllowed`` naming each refused reference.
        """
        try:
            g = cls(name=str(data.get("name", "graph")), sys_path=[str(p) for p in data.get("sys_path", [])])
            module = data.get("module")
            g.module = None if module is None else str(module)  # shipped: never the caller's module
            g.max_outputs = data.get("max_outputs", MAX_OUTPUTS)
            g.max_output_bytes = data.get("max_output_bytes", MAX_OUTPUT_BYTES)
            _extend_sys_path(g.sys_path)
            ops = [Operation(**raw) for raw in data["operations"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphError(f"malformed graph data: {exc}") from exc
        _check_functions(g.name, g.module, ops, process_policy() if allowed is None else allowed)
        try:
            for op in ops:
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


def _check_functions(name: str, module: str | None, ops: list[Operation], allowed: Allowed) -> None:
    """Resolve every string reference of ``ops`` under ``allowed`` plus the package of ``module``; raise
    ``FunctionNotAllowed`` listing all refusals (other resolution faults are left to ``validate``)."""
    policy = allowed.for_graph(module, module_location(module) if module else None)
    refused = []
    for op in ops:
        for fn in (op.fn, op.balance, op.equivalence):
            if isinstance(fn, str):
                try:
                    resolve(fn, policy)
                except FunctionNotAllowed as exc:
                    refused.append(f"{op.kind} {op.name!r}: {exc}")
                except FunctionRefError:
                    pass  # not a policy matter: validate() reports it with the other faults
    if refused:
        raise FunctionNotAllowed(f"graph {name!r} uses functions that are not allowed:\n  - " + "\n  - ".join(refused))


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


def _groupings(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(op["name"]): op for op in data.get("operations", []) if op.get("kind") == "grouping"}


def dropped_groupings(current: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The groupings of graph ``current`` that graph ``new`` lacks (both shipped as plain data,
    ``Graph.to_dict``; nothing is imported): a hand-over would drop their state."""
    return sorted(_groupings(current).keys() - _groupings(new).keys())


def changed_groupings(current: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The groupings both graphs name whose ``keys`` (of ``balance``, ``equivalence``, ``window``) differ, each
    with what changed.  State is matched by grouping name from one tick to the next, and a grouping's buckets are
    keyed by its balancing function's hash and its equivalence function's value and hold ``window - 1`` items:
    handed over across such a change, the state may be read under keys it was not made with.

    Why: the shipped examples both name a grouping ``by_word``, and deploying the inverted index over word count
    handed word count's counts to the index's grouping, whose ``combine`` then failed on every word seen before
    (a dead letter each, and no word at the deploy).  A shipped graph names functions by reference
    (``module:name``), so the same function from a renamed file (``wordcount_v2.py``) differs as well: what a
    changed reference means is the deployer's to judge, a changed window is not."""
    before, after = _groupings(current), _groupings(new)
    changed = []
    for name in sorted(before.keys() & after.keys()):
        diffs = [f"{key} {before[name].get(key)!r} -> {after[name].get(key)!r}" for key in keys
                 if before[name].get(key) != after[name].get(key)]
        if diffs:
            changed.append(f"{name!r} ({', '.join(diffs)})")
    return changed


def _defining_module() -> str | None:
    """The module whose code is constructing a Graph: the first frame outside this module (and dataclasses)."""
    import sys

    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "dataclasses"):
        frame = frame.f_back
    name = frame.f_globals.get("__name__") if frame is not None else None
    return name if isinstance(name, str) else None


def _extend_sys_path(paths: list[str]) -> None:
    import sys

    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)
