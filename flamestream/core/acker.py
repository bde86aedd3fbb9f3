"""The ack table (paper §3.3): which global times may still have items in flight.

Every send and every receive of an item is acked with the same random 64-bit
value under the item's global time; XOR-ing both yields zero, so an entry is
zero exactly when nothing with that global time is in flight (a receiver acks
an input only after acking the sends of its outputs, so the entry cannot touch
zero between hops).  Fronts add *reports*: a promise never to stamp a
timestamp below the reported one.

Minimal time = the smallest global time with a non-zero XOR, capped by the
least promise any front has made.  Everything strictly below it is final:
barriers may release it and groupings may forget it.

A new min time is only worth telling barriers and workers when some global
time at or above the one they know has completed since: anything else they
hold is still in flight, so the new bound releases and trims nothing.  Fronts
report every few milliseconds, so telling every advance kept an idle cluster
30% busy on one core (``worth_publishing``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from flamestream.core.meta import GlobalTime


class AckTable:
    def __init__(self, fronts: Iterable[int], start_ts: int = 0) -> None:
        self._xor: dict[GlobalTime, int] = {}
        self._heap: list[GlobalTime] = []
        self._promised: dict[int, int] = dict.fromkeys(fronts, start_ts)
        if not self._promised:
            raise ValueError("an ack table needs at least one front")
        self._cap = self._compute_cap()
        self._completed: GlobalTime | None = None
        """The greatest global time whose entry went back to zero."""

    def ack(self, gt: GlobalTime, xor: int) -> None:
        """XOR ``xor`` into the entry of ``gt`` (a send or a receive, or both combined)."""
        table = self._xor
        old = table.get(gt)
        value = (old or 0) ^ xor
        if value:
            if old is None:
                heapq.heappush(self._heap, gt)
            table[gt] = value
        elif old is not None:
            del table[gt]
            if self._completed is None or gt > self._completed:
                self._completed = gt

    def report(self, front: int, ts: int) -> None:
        """Front ``front`` promises no item with a timestamp below ``ts`` (promises only grow)."""
        if front not in self._promised:
            raise ValueError(f"report from unknown front {front}")
        if ts > self._promised[front]:
            self._promised[front] = ts
            self._cap = self._compute_cap()

    def _compute_cap(self) -> GlobalTime:
        return min(GlobalTime(ts, front) for front, ts in self._promised.items())

    def min_time(self) -> GlobalTime:
        heap, table = self._heap, self._xor
        while heap and heap[0] not in table:
            heapq.heappop(heap)
        if heap and heap[0] < self._cap:
            return heap[0]
        return self._cap

    def worth_publishing(self, published: GlobalTime | None, min_time: GlobalTime) -> bool:
        """Whether watchers that know ``published`` gain anything from ``min_time``: it is newer, and some
        global time at or above ``published`` completed (so it may now be released and trimmed)."""
        if published is None:
            return True
        return min_time > published and self._completed is not None and self._completed >= published

    def in_flight(self) -> int:
        """Global times with a non-zero XOR."""
        return len(self._xor)
