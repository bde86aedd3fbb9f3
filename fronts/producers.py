"""Idempotent producers: which sequence numbers a front has already admitted, and at what time.

A client that did not get a reply cannot know whether its events were
admitted, so it retries with the same producer id and sequence numbers.  The
front admits an event only if its sequence is above the last one admitted for
that producer, and answers a retry with the original global time so the client
learns the same answer it would have got the first time.  Sequences must
therefore grow per producer; a gap is fine, going back is treated as a retry.

Times are remembered only for the last ``remember`` sequences of each producer:
a retry arrives soon after the attempt it repeats, and an unbounded map would
grow with the whole stream.  Older retries are still refused, just without a
time.  The table holds no state of its own that the input log does not also
hold: the front rebuilds it from the log at start-up.
"""

from __future__ import annotations

from collections import OrderedDict

from flamestream.core.meta import GlobalTime

REMEMBER = 10_000


class ProducerTable:
    def __init__(self, remember: int = REMEMBER) -> None:
        if remember < 1:
            raise ValueError(f"remember must be positive, got {remember}")
        self.remember = remember
        self._last: dict[str, int] = {}
        self._times: dict[str, OrderedDict[int, GlobalTime]] = {}

    def last(self, producer: str) -> int:
        """The highest sequence admitted for ``producer``, -1 if none (sequences are unsigned)."""
        return self._last.get(producer, -1)

    def time_of(self, producer: str, sequence: int) -> GlobalTime | None:
        """The global time ``sequence`` was admitted at, if it is recent enough to be remembered."""
        times = self._times.get(producer)
        return None if times is None else times.get(sequence)

    def lasts(self) -> dict[str, tuple[int, GlobalTime]]:
        """Producer -> (last sequence, its global time): what a restarted front must know of every producer."""
        return {producer: (last, self._times[producer][last]) for producer, last in self._last.items()}

    def admit(self, producer: str, sequence: int, gt: GlobalTime) -> None:
        if sequence <= self.last(producer):
            raise ValueError(f"producer {producer!r}: sequence {sequence} is not above {self.last(producer)}")
        self._last[producer] = sequence
        times = self._times.setdefault(producer, OrderedDict())
        times[sequence] = gt
        if len(times) > self.remember:
            times.popitem(last=False)  # admitted in increasing order, so the first is the oldest
