"""Front: stamps global time on items entering the stream (paper §2.1, §3.1.1).

Global time is (front timestamp in ms, front id).  Many items can enter within
one millisecond, so the front also starts each item's trace with one local
time whose child id is the item's sequence number within that millisecond:
the items become siblings (ordered, never invalidating each other) and the
acker tracks one entry per front-millisecond instead of one per item.
Timestamps never go backwards, even if the wall clock does.
"""

from __future__ import annotations

from flamestream.core.meta import GlobalTime, Trace


class FrontClock:
    def __init__(self, front_id: int) -> None:
        self.front_id = front_id
        self._ts = -1
        self._seq = 0
        self._promised = 0

    def next_ts(self, now_ms: int) -> int:
        """The timestamp an event stamped at ``now_ms`` gets (never below an earlier stamp or promise)."""
        return max(now_ms, self._promised, self._ts)

    def stamp(self, now_ms: int) -> tuple[GlobalTime, Trace]:
        ts = max(now_ms, self._promised)
        if ts > self._ts:
            self._ts, self._seq = ts, 0
        else:
            self._seq += 1
        return GlobalTime(self._ts, self.front_id), (self._seq,)

    def covered(self) -> bool:
        """Whether the last promise is above everything stamped: a new report would release nothing of ours."""
        return self._promised > self._ts

    def report(self, now_ms: int) -> int:
        """The timestamp this front can promise now: nothing will be stamped below it."""
        self._promised = max(self._promised, now_ms, self._ts)
        return self._promised

    def report_past_stamps(self, now_ms: int, bound: int) -> int | None:
        """A promise past every stamp so far, made at once (None if it cannot be).

        ``report`` promises the clock's time, which passes a stamp only once
        its millisecond is over; this one promises the millisecond after the
        last stamp, so a stamp made now is covered without waiting for the
        next one.  Later stamps of this millisecond then take the next: it
        adds at most one millisecond of lead over ``now_ms`` (None where the
        clock is already further ahead), and never promises past ``bound``,
        the highest time the front may promise.
        """
        ts = max(self._promised, now_ms, self._ts + 1)
        if ts > now_ms + 1 or ts > bound:
            return None
        self._promised = ts
        return ts


Stamped = tuple[int, GlobalTime, Trace, object]
"""(front id, global time, initial trace, payload)."""


def stamp_inputs(payloads: list[object], fronts: int = 1, per_ms: int = 1) -> list[Stamped]:
    """Deterministically spread inputs over simulated fronts and milliseconds.

    Item ``i`` enters front ``i % fronts`` at simulated millisecond
    ``i // (fronts * per_ms)``; the oracle and the local runtime share this so
    their outputs are comparable as (global time, payload) multisets.
    """
    if fronts < 1 or per_ms < 1:
        raise ValueError("fronts and per_ms must be >= 1")
    clocks = [FrontClock(f) for f in range(fronts)]
    out: list[Stamped] = []
    for i, payload in enumerate(payloads):
        f = i % fronts
        gt, trace = clocks[f].stamp(i // (fronts * per_ms))
        out.append((f, gt, trace, payload))
    return out
