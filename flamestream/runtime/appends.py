"""Where a durable append runs: on the event loop while the disk is fast, in a thread while it is slow.

Every record passes two fsynced appends on its way: the front's input log and
the barrier's topic.  Each writes and fsyncs a few hundred bytes, 0.1 ms on
an idle node of this machine.  In a thread (``asyncio.to_thread``) each cost a
record 0.5-1 ms more on a busy node: the hop to the thread, the thread waiting
for the GIL the busy loop holds (up to ``SWITCH_INTERVAL``) to run the
append's own Python, and the hop back.  Measured with timestamps along a word
count's path at 1,000 lines/s, in a thread: input log 0.74-0.98 ms from the
push's admission, topic 1.35 ms from the append's start to the loop's
resumption; on the loop: 0.44 and 0.44 ms.

On the loop an fsync stalls every role of the node while it lasts, which is
fine while it is short and not on a slow disk (a network volume, a spinning
disk, one busy flushing).  So the appends on the loop are timed, and when
their moving average (``WEIGHT``) passes ``INLINE_LIMIT`` the appends that
follow go to a thread; ``RETRY_AFTER`` later one runs on the loop again, and
its time alone decides whether the disk is fast again.  A slow disk costs the
loop one slow append per such period.  Why an average and not each append:
on two busy cores a blocking fsync gives the CPU away, and getting it back
took over 2 ms for 1 % of the appends (17 ms at most) on a fast disk.
Appends of more than ``INLINE_BYTES`` always go to a thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

INLINE_LIMIT: Final = 0.002
"""Seconds an append on the loop may take on average before the following ones go to a thread."""
WEIGHT: Final = 0.1
"""Weight of the newest append in the moving average."""
RETRY_AFTER: Final = 5.0
"""Seconds appends stay in a thread before one runs on the loop again."""
INLINE_BYTES: Final = 256 * 1024
"""Appends of more bytes go to a thread whatever the disk's speed: their writes take long on any disk."""

R = TypeVar("R")


class Appends:
    """Runs one log's appends on the loop or in a thread (see the module docstring)."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self._average = 0.0
        """Moving average of the appends' seconds on the loop."""
        self._threaded_until: float | None = None
        """Until when appends go to a thread (None: they run on the loop)."""
        self._said = False

    async def run(self, append: Callable[[Sequence[bytes]], R], records: Sequence[bytes]) -> R:
        """``append(records)``, on the loop or in a thread; its exceptions propagate either way."""
        return await self._call(functools.partial(append, records), records, timed=True)

    async def write(self, write: Callable[[Sequence[bytes]], R], records: Sequence[bytes]) -> R:
        """``write(records)`` where ``run`` would run their append, but untimed: a write without its fsync says
        nothing about the disk's speed (``publish`` times the fsync that follows)."""
        return await self._call(functools.partial(write, records), records, timed=False)

    async def publish(self, publish: Callable[[], R], records: Sequence[bytes]) -> R:
        """``publish()``, the fsync of the ``records`` that ``write`` wrote, where and timed as ``run`` would run
        their append (the front's input log: ``SegmentedLog.write_many``, then ``publish``)."""
        return await self._call(publish, records, timed=True)

    async def _call(self, call: Callable[[], R], records: Sequence[bytes], *, timed: bool) -> R:
        if not self.on_loop(records):
            return await asyncio.to_thread(call)
        return self._run_timed(call) if timed else call()

    def on_loop(self, records: Sequence[bytes]) -> bool:
        """Whether an append of ``records`` now belongs on the loop."""
        until = self._threaded_until
        return not ((until is not None and time.monotonic() < until) or sum(map(len, records)) > INLINE_BYTES)

    def run_on_loop(self, append: Callable[[Sequence[bytes]], R], records: Sequence[bytes]) -> R:
        """``append(records)`` on the loop, timed (where ``on_loop`` said so)."""
        return self._run_timed(functools.partial(append, records))

    def _run_timed(self, call: Callable[[], R]) -> R:
        start = time.monotonic()
        probe = self._threaded_until is not None
        try:
            return call()
        finally:
            self._timed(time.monotonic() - start, probe=probe)

    def _timed(self, took: float, *, probe: bool) -> None:
        self._average = took if probe else self._average + WEIGHT * (took - self._average)
        if self._average <= INLINE_LIMIT:
            self._threaded_until = None
            return
        self._threaded_until = time.monotonic() + RETRY_AFTER
        # Said once at INFO: a slow disk would say it again every RETRY_AFTER.
        self._logger.log(logging.DEBUG if self._said else logging.INFO,
                         "appends to %s took %.1f ms on the event loop; they run in a thread for the next %g s",
                         self._what, self._average * 1000, RETRY_AFTER)
        self._said = True
