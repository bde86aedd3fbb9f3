"""Ticks and hash-range layout (paper §2.3, §4).

Every worker runs the whole graph over its own slice of the signed 32-bit hash
space; the slices never intersect and together cover it.  A tick binds a time
interval to a graph and such a layout, so a new tick can redeploy the graph
with a different layout.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from flamestream.hashing import INT32_MAX, INT32_MIN
from flamestream.meta import GlobalTime


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
    """A time interval [start, end) of global time, its graph (plain data) and layout."""

    number: int
    start: GlobalTime
    graph: dict[str, Any]
    layout: Layout
