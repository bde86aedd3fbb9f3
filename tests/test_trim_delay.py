"""When a worker acts on the acker's min times (``workers.service.TRIM_DELAY``).

After a quiet spell it waits ``TRIM_DELAY``, so the barrier's release of the
same min time reaches its subscribers before the trim runs; a run of min
times that come back to back is acted on at once, so a watch whose messages
queue up never falls behind by waiting for each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flamestream.core.meta import GlobalTime
from flamestream.runtime.channels import LocalEndpoints
from flamestream.wire import flamestream_pb2 as pb
from workers import service as worker_service

HERE = "127.0.0.1:7000"
DELAY = 0.2
"""The test's ``TRIM_DELAY``: long enough that a wait is told apart from none on a loaded machine."""


def test_a_min_time_after_a_quiet_spell_waits_and_a_run_of_them_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_service, "TRIM_DELAY", DELAY)

    async def scenario() -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
        loop = asyncio.get_running_loop()
        sent: dict[int, float] = {}
        acted: dict[int, float] = {}
        finished: dict[int, float] = {}

        async def watch(request: pb.Empty, context: Any) -> AsyncIterator[pb.GlobalTime]:
            for ts in range(1, 7):
                if ts == 2:
                    await asyncio.sleep(2 * DELAY)  # a quiet spell after the first
                sent[ts] = loop.time()
                yield pb.GlobalTime(ts=ts, front=0)

        async def on_min_time(min_time: GlobalTime) -> None:
            acted[min_time.ts] = loop.time()
            if min_time.ts == 4:
                await asyncio.sleep(2 * DELAY)  # a long trim: the min time queued behind it must not wait
                finished[4] = loop.time()

        local = LocalEndpoints(HERE)
        local.min_time = watch
        worker = worker_service.WorkerService(0, local)
        monkeypatch.setattr(worker, "_on_min_time", on_min_time)
        await worker._watch_min_time(HERE)
        return sent, acted, finished

    sent, acted, finished = asyncio.run(scenario())
    assert sorted(acted) == [1, 2, 3, 4, 5, 6]
    assert acted[1] - sent[1] >= DELAY  # the first min time waits
    assert acted[2] - sent[2] >= DELAY  # and so does the first after a quiet spell
    assert acted[4] - acted[2] < DELAY  # the rest of the run, right behind it, does not
    assert acted[6] - finished[4] < DELAY  # nor what queued up behind a long trim
