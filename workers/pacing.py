"""Pacing a periodic snapshot: its work in slices of CPU, with pauses between them.

Why: the writer's thread shares the interpreter lock with the event loop,
and a busy loop (word count's node0 runs at about three quarters of a core)
falls behind by whatever CPU the writer takes meanwhile, then needs several
times that long to catch up.  The cost grows faster than the CPU: a thread
burning 15 ms after each boundary, in place of the snapshot, raised the p50 of
the lines due in the tenth of a second after it from 4.5 to 5-6 ms, one
burning 30 ms to 20-27 ms (word count, 1,000 lines/s).  The same 30 ms as two
slices 300 ms apart left p99 at 31-35 ms, against 50-55 in one piece.  A
snapshot below a boundary is the state taken on the loop at the boundary;
when its file is encoded, written and registered only decides how old the
newest complete snapshot is at a crash, so the writer spreads that work over
the first half of the interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from flamestream.core.worker import WorkerState
from flamestream.storage.snapshots import SnapshotImage

SLICE_CPU = 0.004
"""Seconds of the writer thread's CPU between pauses: a slice this long delays a busy loop's items by a few ms."""
SLICE_BUCKETS = 64
"""Buckets encoded between looks at the thread's CPU time."""
PAUSE_FACTOR = 10.0
"""A pause lasts this many times the CPU of the slice before it: the loop catches up on what it fell behind by
(at three quarters busy it needs about four times the delay) before the next slice."""


def slices(changes: WorkerState, size: int = SLICE_BUCKETS) -> Iterator[WorkerState]:
    """``changes`` in parts of at most ``size`` buckets, which ``SnapshotImage.update`` may take one after another
    to the same effect as all at once.  The first part names every grouping, so that one the report names without
    buckets exists in the image as it would."""
    yield {name: [] for name in changes}
    for name, buckets in changes.items():
        for at in range(0, len(buckets), size):
            yield {name: buckets[at:at + size]}


def encode_slices(image: SnapshotImage, parts: Iterator[WorkerState], cpu: float = SLICE_CPU) -> tuple[bool, float]:
    """Apply ``parts`` to ``image`` until this thread has spent ``cpu`` seconds; (whether every part is applied, the
    CPU seconds spent).  Run in the writer's thread."""
    started = time.thread_time()
    for part in parts:
        image.update(part)
        if time.thread_time() - started >= cpu:
            return False, time.thread_time() - started
    return True, time.thread_time() - started


def pause(cpu: float, now: float, deadline: float, factor: float = PAUSE_FACTOR) -> float:
    """Seconds to pause after a slice that took ``cpu`` seconds: ``factor`` times that, but never past ``deadline``
    (the work then goes on without pauses, as unpaced)."""
    return max(0.0, min(factor * cpu, deadline - now))


class Pacing:
    """The pauses of one periodic snapshot, which spreads its work until ``budget`` seconds from now."""

    def __init__(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget

    async def pause(self, cpu: float = SLICE_CPU) -> None:
        """Pause after a step that took ``cpu`` seconds of CPU (by default a slice's worth: registering and
        retention, whose CPU is spread over kazoo's threads, are short steps)."""
        await asyncio.sleep(pause(cpu, time.monotonic(), self.deadline))
