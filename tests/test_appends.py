"""Where a durable append runs (``flamestream.runtime.appends``): on the event loop while appends are fast, in a
thread once their moving average is slow, back on the loop when a later probe is fast; large ones in a thread.

The module reads a clock that the stand-in disk advances by each append's duration (its own ``time`` is replaced),
so what it measures does not depend on how busy this machine is; the threads are real."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from flamestream.runtime import appends
from flamestream.runtime.appends import INLINE_BYTES, INLINE_LIMIT, RETRY_AFTER, Appends


class Disk:
    """An append that takes ``delay`` seconds of the module's clock and notes the thread it ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.delay = 0.0
        self.threads: list[int] = []
        self.fail: Exception | None = None
        monkeypatch.setattr(appends, "time", SimpleNamespace(monotonic=lambda: self.now))

    def wait(self, seconds: float) -> None:
        self.now += seconds

    def append(self, records: Sequence[bytes]) -> int:
        self.threads.append(threading.get_ident())
        self.now += self.delay
        if self.fail is not None:
            raise self.fail
        return len(records)


def on_loop(disk: Disk) -> list[bool]:
    return [ident == threading.get_ident() for ident in disk.threads]


def test_fast_appends_run_on_the_loop_and_a_slow_average_sends_them_to_a_thread_until_a_probe_is_fast(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    disk = Disk(monkeypatch)
    runner = Appends(logging.getLogger("test"), "the test log")

    async def scenario() -> None:
        for _ in range(5):
            assert await runner.run(disk.append, [b"x"]) == 1
        assert on_loop(disk) == [True] * 5
        disk.delay = INLINE_LIMIT * 20  # one append this slow lifts a 0.1-weighted average past the limit
        await runner.run(disk.append, [b"x"])
        disk.delay = 0.0
        await runner.run(disk.append, [b"x"])
        assert on_loop(disk)[5:] == [True, False], "the slow one ran on the loop, the next in a thread"
        disk.wait(RETRY_AFTER / 2)
        await runner.run(disk.append, [b"x"])
        disk.wait(RETRY_AFTER / 2)  # RETRY_AFTER passed: the next runs on the loop as a probe, and is fast
        await runner.run(disk.append, [b"x"])
        await runner.run(disk.append, [b"x"])
        assert on_loop(disk)[7:] == [False, True, True]

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert "appends to the test log took" in caplog.text


def test_a_slow_probe_keeps_appends_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    disk = Disk(monkeypatch)
    runner = Appends(logging.getLogger("test"), "the test log")

    async def scenario() -> None:
        disk.delay = INLINE_LIMIT * 20
        await runner.run(disk.append, [b"x"])
        disk.wait(RETRY_AFTER)
        disk.delay = INLINE_LIMIT * 2  # the probe's time alone is the new average: above the limit
        await runner.run(disk.append, [b"x"])
        disk.delay = 0.0
        await runner.run(disk.append, [b"x"])
        assert on_loop(disk) == [True, True, False]

    asyncio.run(scenario())


def test_a_large_append_goes_to_a_thread_and_errors_propagate_from_either_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    disk = Disk(monkeypatch)
    runner = Appends(logging.getLogger("test"), "the test log")

    async def scenario() -> None:
        await runner.run(disk.append, [b"x" * (INLINE_BYTES + 1)])
        disk.fail = OSError(28, "No space left on device")
        with pytest.raises(OSError, match="No space left"):
            await runner.run(disk.append, [b"x"])
        with pytest.raises(OSError, match="No space left"):
            await runner.run(disk.append, [b"x" * (INLINE_BYTES + 1)])
        assert on_loop(disk) == [False, True, False]

    asyncio.run(scenario())


def test_a_write_is_untimed_and_its_publication_timed_like_an_append(monkeypatch: pytest.MonkeyPatch) -> None:
    """The front's two steps (``SegmentedLog.write_many``, then ``publish``): a slow write alone says nothing about
    the disk, a slow publication (the fsync) sends what follows to a thread like a slow append; both go where an
    append of their records would."""
    disk = Disk(monkeypatch)
    runner = Appends(logging.getLogger("test"), "the test log")

    def publish() -> int:
        return disk.append([])

    async def scenario() -> None:
        disk.delay = INLINE_LIMIT * 20
        assert await runner.write(disk.append, [b"x", b"y"]) == 2
        disk.delay = 0.0
        await runner.write(disk.append, [b"x"])
        assert on_loop(disk) == [True, True], "the slow write did not count"
        disk.delay = INLINE_LIMIT * 20
        assert await runner.publish(publish, [b"x"]) == 0
        disk.delay = 0.0
        await runner.write(disk.append, [b"x"])
        await runner.publish(publish, [b"x"])
        assert on_loop(disk)[2:] == [True, False, False], "the slow publication sent both steps to a thread"
        disk.wait(RETRY_AFTER)
        await runner.write(disk.append, [b"x" * (INLINE_BYTES + 1)])
        await runner.publish(publish, [b"x" * (INLINE_BYTES + 1)])
        assert on_loop(disk)[5:] == [False, False], "a large batch's steps go to a thread"

    asyncio.run(scenario())
