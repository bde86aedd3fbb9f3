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

A lost batch (packet loss) or a stuck worker shows here too (paper §4.1): its
global time stays non-zero while everything after it completes, so the oldest
in-flight time stops moving.  ``StallDetector`` decides when that has lasted
far longer than the oldest in-flight time usually takes to move on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

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

    def oldest_in_flight(self) -> GlobalTime | None:
        """The smallest global time with a non-zero XOR, if any."""
        heap, table = self._heap, self._xor
        while heap and heap[0] not in table:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def min_time(self) -> GlobalTime:
        oldest = self.oldest_in_flight()
        return oldest if oldest is not None and oldest < self._cap else self._cap

    def worth_publishing(self, published: GlobalTime | None, min_time: GlobalTime) -> bool:
        """Whether watchers that know ``published`` gain anything from ``min_time``: it is newer, and some
        global time at or above ``published`` completed (so it may now be released and trimmed)."""
        if published is None:
            return True
        return min_time > published and self._completed is not None and self._completed >= published

    def in_flight(self) -> int:
        """Global times with a non-zero XOR."""
        return len(self._xor)


@dataclass(frozen=True)
class Stall:
    """A global time that stopped the min time: in flight for ``seconds`` while its usual pace is ``typical``."""

    time: GlobalTime
    seconds: float
    typical: float


class StallDetector:
    """Whether the oldest in-flight global time is stuck (a lost batch or a stuck worker), from periodic looks.

    Work in flight that keeps moving changes the oldest in-flight time all the
    time; a batch that never arrives leaves its global time non-zero forever.
    Each look passes the oldest in-flight time (``AckTable.oldest_in_flight``);
    how long each one stayed oldest is the pace of the stream (smoothed), and
    a time stuck for at least ``timeout`` seconds *and* ``factor`` times that
    pace is a stall.  The pace keeps a slow but moving stream (a backlog, a big
    item) from counting as stuck; the timeout keeps a pause of a few seconds
    (a snapshot load, a hand-over, a recovery) from counting.
    """

    SMOOTHING = 0.2
    """Weight of the newest pace sample."""

    def __init__(self, timeout: float, factor: float = 10.0) -> None:
        if timeout <= 0:
            raise ValueError(f"a stall timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.factor = factor
        self.typical = 0.0
        """Smoothed seconds the oldest in-flight time stays oldest."""
        self._oldest: GlobalTime | None = None
        self._since = 0.0

    def observe(self, now: float, oldest: GlobalTime | None) -> Stall | None:
        """One look at ``now`` (monotonic seconds): the stall, if ``oldest`` has been stuck long enough."""
        if oldest != self._oldest:
            if self._oldest is not None:
                self.typical += self.SMOOTHING * (now - self._since - self.typical)
            self._oldest, self._since = oldest, now
            return None
        if oldest is None:
            return None
        stuck = now - self._since
        if stuck >= self.timeout and stuck >= self.factor * self.typical:
            return Stall(oldest, stuck, self.typical)
        return None
