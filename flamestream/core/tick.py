"""Ticks and hash-range layout (paper §2.3, §4).

Every worker runs the whole graph over its own slice of the signed 32-bit hash
space; the slices never intersect and together cover it.  A tick binds a time
interval to a graph and such a layout, so a new tick can redeploy the graph
with a different layout.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from flamestream.core.hashing import INT32_MAX, INT32_MIN
from flamestream.core.meta import GlobalTime

MIN_WEIGHT = 0.01
MAX_WEIGHT = 100.0
"""A worker's weight (its share of the hash space relative to the others') lies within these: a range of ten
thousand to one keeps every worker's share far above one hash."""


def weight_fault(weight: object) -> str | None:
    """Why ``weight`` cannot be a worker's weight, or None (a number within ``MIN_WEIGHT`` .. ``MAX_WEIGHT``)."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        return f"a worker's weight must be a finite number, not {weight!r:.40}"
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        return f"a worker's weight must be within {MIN_WEIGHT:g} .. {MAX_WEIGHT:g}, not {weight:g}"
    return None


def _check(weights: Sequence[float]) -> None:
    for weight in weights:
        if (fault := weight_fault(weight)) is not None:
            raise ValueError(fault)


@dataclass(frozen=True)
class Layout:
    """Inclusive hash ranges, ``starts[i] .. starts[i+1]-1`` owned by worker ``i``."""

    starts: tuple[int, ...]

    @classmethod
    def even(cls, workers: int) -> Layout:
        if workers < 1:
            raise ValueError(f"need at least one worker, got {workers}")
        span = (INT32_MAX - INT32_MIN + 1) // workers
        return cls(tuple(INT32_MIN + i * span for i in range(workers)))

    @classmethod
    def weighted(cls, weights: Sequence[float]) -> Layout:
        """Ranges in proportion to ``weights``: worker ``i`` gets ``weights[i] / sum(weights)`` of the hash space.
        Equal weights give ``even`` exactly.

        Why weights: a worker whose node also runs a front, the acker or a
        barrier has less of its core for the graph, and under load that node
        fell behind first (see ``SHARED_NODE_WEIGHT`` in ``flamestream.roles``).
        """
        _check(weights)
        if len(set(weights)) <= 1:
            return cls.even(len(weights))
        space, total = INT32_MAX - INT32_MIN + 1, sum(weights)
        starts = [INT32_MIN]
        for below in accumulate(weights[:-1]):
            starts.append(INT32_MIN + int(space * below / total))
        return cls(tuple(starts))

    @classmethod
    def balanced(cls, loads: list[int], workers: int, weights: Sequence[float] | None = None) -> Layout:
        """Ranges giving each worker an equal share of the measured ``loads`` (items per hash bucket, the int32
        space cut into ``len(loads)`` equal buckets), cut at the bucket borders closest to each equal share;
        the even layout when nothing was measured.  With ``weights`` (one per worker) the shares are in their
        proportion instead of equal, and without measured loads the layout is ``weighted``.

        Why load and not hash space: with skewed keys (a few hot words) an even
        cut leaves one worker with most of the work.
        """
        if weights is not None:
            if len(weights) != workers:
                raise ValueError(f"{len(weights)} weights for {workers} workers")
            _check(weights)
        total = sum(loads)
        if workers < 1 or total == 0 or workers > len(loads):
            return cls.even(workers) if weights is None else cls.weighted(weights)
        shares = [1.0] * workers if weights is None else list(weights)
        below = [0.0, *accumulate(shares)]
        width = (INT32_MAX - INT32_MIN + 1) // len(loads)
        before = [0, *accumulate(loads)]
        """before[b]: the load below border b (the start of bucket b)."""
        borders = [0]
        for k in range(1, workers):
            target = total * below[k] / below[-1]
            b = bisect_left(before, target)
            if b > 0 and target - before[b - 1] < before[b] - target:
                b -= 1
            # Strictly after the previous border, and leaving a bucket for each worker still to come.
            borders.append(min(max(b, borders[-1] + 1), len(loads) - (workers - k)))
        return cls(tuple(INT32_MIN + border * width for border in borders))

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != INT32_MIN or list(self.starts) != sorted(set(self.starts)):
            raise ValueError(f"hash ranges must start at {INT32_MIN} and be strictly increasing: {self.starts}")

    @property
    def workers(self) -> int:
        return len(self.starts)

    def owner(self, h: int) -> int:
        """Index of the worker whose range holds hash ``h``."""
        return bisect_right(self.starts, h) - 1

    def range_of(self, worker: int) -> tuple[int, int]:
        hi = self.starts[worker + 1] - 1 if worker + 1 < len(self.starts) else INT32_MAX
        return self.starts[worker], hi


@dataclass(frozen=True)
class Tick:
    """A graph deployment: from global time ``start`` on, ``graph`` runs on this layout and these processes.

    Stored as JSON in ZooKeeper (``ticks/<n>``); every component watches the
    ticks and (re)configures itself when a new one appears.  Worker ``i`` of
    ``workers`` owns hash range ``i`` of ``layout``; barrier partitions are
    front ids.
    """

    number: int
    start: GlobalTime
    graph: dict[str, Any]
    layout: Layout
    workers: tuple[str, ...] = ()
    fronts: tuple[int, ...] = ()
    acker: str = ""
    barriers: tuple[tuple[int, str], ...] = ()
    """(partition = front id, barrier address)."""
    previous: int | None = None
    """The tick whose state this one takes over at ``start`` (its workers' snapshot below ``start``), or None
    for a tick that starts empty: the first one, or a deploy that drops the state."""
    recovery: bool = False
    """Published after a crash, by ``flamestream.runtime.recovery``: ``start`` is in the past (the boundary of the
    last complete snapshot, taken from tick ``previous``), every process is a fresh incarnation, and the fronts
    send their logged events from ``start`` on again, keeping their stamps."""

    def barrier_of(self, front: int) -> str:
        for partition, address in self.barriers:
            if partition == front:
                return address
        raise KeyError(f"no barrier owns partition {front}")

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "start": list(self.start), "graph": self.graph,
                "layout": list(self.layout.starts), "workers": list(self.workers), "fronts": list(self.fronts),
                "acker": self.acker, "barriers": [[p, a] for p, a in self.barriers], "previous": self.previous,
                "recovery": self.recovery}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tick:
        try:
            return cls(number=int(data["number"]), start=GlobalTime(*map(int, data["start"])), graph=data["graph"],
                       layout=Layout(tuple(int(s) for s in data["layout"])),
                       workers=tuple(str(w) for w in data["workers"]), fronts=tuple(int(f) for f in data["fronts"]),
                       acker=str(data["acker"]), barriers=tuple((int(p), str(a)) for p, a in data["barriers"]),
                       previous=None if data.get("previous") is None else int(data["previous"]),
                       recovery=bool(data.get("recovery", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed tick: {exc!r}") from exc
