"""The barrier's invalidation buffer (paper §3.1–§3.3, Algorithm 2).

Items reaching a sink wait here until the acker's minimal time passes their
global time; only then can no invalidator of theirs still be in flight
(Lemma 1).  On insert, items invalidated by the newcomer are dropped, and so
is a newcomer that an item already present invalidates (arrival order between
the two is arbitrary).  Tombstones cancel the exact item they retract, in
either arrival order.

Barriers are partitioned by global time (an item and its invalidator share
it), so one buffer serves any subset of fronts.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

from flamestream.core.item import Item
from flamestream.core.meta import CHILD_MASK, GlobalTime, Trace

Released = tuple[GlobalTime, Trace, Any]


class _Slot:
    """Everything the barrier holds for one global time."""

    __slots__ = ("items", "tombstones", "versions")

    def __init__(self) -> None:
        self.items: dict[Trace, Any] = {}
        self.versions: dict[Trace, list[Any]] = {}
        """Trace prefix before a grouping mark -> [highest mark seen there, the traces of the items carrying it...]:
        one list, not a (mark, [traces]) pair, as an item's is usually the only trace there."""
        self.tombstones: set[Trace] = set()


class BarrierBuffer:
    """Invalidation buffer; O(trace length) per insert.

    Two items with one global time can only be in the invalidation relation
    where their traces first differ at a grouping's mark (stateless operations
    mark logical time 0, so their differences are sibling differences).  Both
    traces then share the prefix before that position, so the buffer indexes
    items by each prefix that precedes a grouping mark and keeps only the
    highest mark seen there: a lower mark is invalidated, whether it arrives
    before or after — even once the higher version was itself retracted,
    because a grouping retracts every version it replaces, so nothing below
    the highest version ever emitted is valid.
    """

    def __init__(self) -> None:
        self._slots: dict[GlobalTime, _Slot] = {}
        self._heap: list[GlobalTime] = []
        self.received = 0
        """Items (not tombstones) that reached the barrier, for the replay overhead."""
        self.retractions = 0

    def insert(self, item: Item) -> None:
        payload, gt, trace, tombstone = item
        slot = self._slots.get(gt)
        if slot is None:
            slot = self._slots[gt] = _Slot()
            heapq.heappush(self._heap, gt)
        items = slot.items
        if tombstone:
            self.retractions += 1
            if items.pop(trace, _ABSENT) is _ABSENT:
                slot.tombstones.add(trace)
            return
        self.received += 1
        tombstones = slot.tombstones
        if tombstones and trace in tombstones:  # a tombstone before its item is rare: no hash of the trace for it
            tombstones.discard(trace)
            return
        if trace in items:
            raise ValueError(f"item {gt} {trace} reached the barrier twice")
        versions = slot.versions
        # Each grouping mark's prefix sliced and looked up once, all of them checked before anything changes (the
        # item may be stale at any; the prefixes differ in length, so updating one cannot change what was seen at
        # another).  The first in locals, the others in a list: one grouping on the path, the usual case, made a
        # list and a tuple per item.  A mark is boxed once (past the small ints, each boxing is a new object).
        first: Trace | None = None
        first_mark: Any = None
        first_seen: list[Any] | None = None
        others: list[tuple[Trace, Any, list[Any] | None]] | None = None
        for i, mark in enumerate(trace):
            if mark > CHILD_MASK:
                boxed: Any = mark
                prefix = trace[:i]
                seen = versions.get(prefix)
                if seen is not None and seen[0] > boxed:
                    return
                if first is None:
                    first, first_mark, first_seen = prefix, boxed, seen
                elif others is None:
                    others = [(prefix, boxed, seen)]
                else:
                    others.append((prefix, boxed, seen))
        if first is not None:
            _note_version(items, versions, first, first_mark, first_seen, trace)
            if others is not None:
                for prefix, boxed, seen in others:
                    _note_version(items, versions, prefix, boxed, seen, trace)
        items[trace] = payload

    def release(self, min_time: GlobalTime | None) -> list[Released]:
        """Pop every item with global time below ``min_time`` (None: no min time known yet), in meta order."""
        out: list[Released] = []
        heap = self._heap
        while heap and min_time is not None and heap[0] < min_time:
            gt = heapq.heappop(heap)
            items = self._slots.pop(gt).items
            out.extend((gt, trace, items[trace]) for trace in sorted(items))
        return out

    def __len__(self) -> int:
        return sum(len(s.items) for s in self._slots.values())


_ABSENT: Final = object()


def _note_version(items: dict[Trace, Any], versions: dict[Trace, list[Any]], prefix: Trace, mark: Any,
                  seen: list[Any] | None, trace: Trace) -> None:
    """Record that ``trace`` carries ``mark`` after ``prefix`` (``seen``: what was there), dropping the items of a
    lower mark there: they are stale."""
    if seen is None:
        versions[prefix] = [mark, trace]
    elif seen[0] < mark:
        for stale in seen[1:]:
            items.pop(stale, None)
        versions[prefix] = [mark, trace]
    else:
        seen.append(trace)


class ArrivalBuffer:
    """Guarantees off: every item is released on arrival, tombstones are dropped.

    For benchmarking against peers that promise nothing: no waiting for the
    acker's min time and no invalidation, so an item a replay invalidates is
    released anyway (output may hold stale versions: at-least-once, not
    deterministic).  Same interface as :class:`BarrierBuffer`.
    """

    def __init__(self) -> None:
        self._items: list[Released] = []
        self.received = 0
        self.retractions = 0

    def insert(self, item: Item) -> None:
        payload, gt, trace, tombstone = item
        if tombstone:
            self.retractions += 1
            return
        self.received += 1
        self._items.append((gt, trace, payload))

    def release(self, min_time: GlobalTime | None) -> list[Released]:
        """Everything that arrived, whatever ``min_time`` says."""
        out, self._items = self._items, []
        return out

    def __len__(self) -> int:
        return len(self._items)
