"""Meta-information of data items (paper §3.1.1): global time, trace, invalidation.

Meta imposes the total order the whole model relies on: items are ordered by
global time, then by trace.  A trace is the append-only path of local times an
item collected on its way through operations, so it doubles as provenance:
two items with the same global time share a trace prefix up to their common
ancestor.

Representation: a ``Trace`` is a plain tuple of ints, one int per operation the
item left, each encoding ``LocalTime(logical_time, child_id)`` as
``logical_time << 32 | child_id``.  Integer tuples compare lexicographically
exactly like the tuple of pairs would (child ids stay below 2**32), but they are
several times cheaper to build and compare on the hot path.  ``LocalTime`` and
``decode`` give the readable view.
"""

from __future__ import annotations

from typing import Final, NamedTuple

CHILD_BITS: Final = 32
CHILD_MASK: Final = (1 << CHILD_BITS) - 1

Trace = tuple[int, ...]


class GlobalTime(NamedTuple):
    """Time assigned once at the front: (front timestamp in ms, front id).

    Compared by timestamp, then front id; fronts keep it strictly monotonic on
    their own, so no clock synchronisation between nodes is needed.
    """

    ts: int
    front: int


def boundary_name(boundary: GlobalTime) -> str:
    """How a snapshot boundary (a global time) is named in paths and in ZooKeeper: ``<ts>-<front>``."""
    return f"{boundary.ts}-{boundary.front}"


def boundary_of(name: str) -> GlobalTime:
    """The global time a ``boundary_name`` names."""
    ts, _, front = name.partition("-")
    return GlobalTime(int(ts), int(front))


class LocalTime(NamedTuple):
    """One operation's mark on a trace.

    ``logical_time`` is the operation's version counter (only groupings move
    it, so a re-emitted tuple outranks the stale one); ``child_id`` numbers the
    outputs produced from one input (siblings).
    """

    logical_time: int
    child_id: int

    def encode(self) -> int:
        if not 0 <= self.child_id <= CHILD_MASK:
            raise ValueError(f"child id {self.child_id} outside 0..{CHILD_MASK}")
        return (self.logical_time << CHILD_BITS) | self.child_id


def decode(trace: Trace) -> tuple[LocalTime, ...]:
    """Readable view of an encoded trace."""
    return tuple(LocalTime(t >> CHILD_BITS, t & CHILD_MASK) for t in trace)


def encode(local_times: tuple[LocalTime, ...] | list[LocalTime]) -> Trace:
    return tuple(lt.encode() for lt in local_times)


class Meta(NamedTuple):
    """(global time, trace); tuple order is the model's total order."""

    global_time: GlobalTime
    trace: Trace


def invalidates(newer: Meta, older: Meta) -> bool:
    """True iff ``older`` is invalidated by ``newer`` (paper §3.2).

    Same global time, ``older.trace < newer.trace``, and the first difference
    is in logical time.  A first difference in child id means the two are
    siblings (e.g. two broadcast copies): no invalidation.  A prefix means
    ancestry: no invalidation either.
    """
    if older.global_time != newer.global_time:
        return False
    return trace_invalidates(newer.trace, older.trace)


def trace_invalidates(newer: Trace, older: Trace) -> bool:
    """Invalidation on traces of items already known to share a global time."""
    for a, b in zip(older, newer, strict=False):
        if a != b:
            return a < b and (a >> CHILD_BITS) != (b >> CHILD_BITS)
    return False


MIN_TIME: Final = GlobalTime(-(1 << 62), -1)
"""Smaller than any real global time (before any front has reported)."""

MAX_TIME: Final = GlobalTime(1 << 62, 1 << 31)
"""Larger than any real global time (every front has finished)."""
