"""When the barrier appends what a min time releases (``BarrierService._advance``): at once, in the min-time watch
that brought it, while the release task is idle; otherwise, or when the append cannot run on the loop, the task
appends it after whatever it held before, in release order.  The partitions are real topic logs in a temporary
directory; no process, no acker: the test hands min times to the service as its acker link would."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from flamestream.barrier.service import BarrierService, _Partition
from flamestream.core.meta import GlobalTime
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.hosting import LocalAbort, LocalContext
from flamestream.wire import flamestream_pb2 as pb


def record(ts: int) -> bytes:
    return pb.Record(partition=0, time=pb.GlobalTime(ts=ts, front=0), payload=b'"%d"' % ts).SerializeToString()


def barrier(tmp_path: Path, *times: int) -> tuple[BarrierService, _Partition]:
    """A barrier of partition 0 holding one record at each of ``times`` (front 0)."""
    partition = _Partition(0, tmp_path / "topic-0")
    service = BarrierService({0: partition}, LocalEndpoints())
    for ts in times:
        partition.buffer.insert((record(ts), GlobalTime(ts, 0), (0,), False))
    return service, partition


def topic(partition: _Partition) -> list[bytes]:
    found = partition.recent(0, 100)
    assert found is not None
    return [data for _offset, data in found]


def test_a_min_time_releases_at_once_where_the_release_task_is_idle(tmp_path: Path) -> None:
    async def scenario() -> None:
        service, partition = barrier(tmp_path, 1, 2, 3)
        service._advance(GlobalTime(3, 0))
        assert topic(partition) == [record(1), record(2)], "appended before anything else ran"
        assert not service._min_changed.is_set(), "nothing left for the task"

    asyncio.run(scenario())


def test_while_the_task_releases_a_new_min_time_is_left_to_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        service, partition = barrier(tmp_path, 1, 2)
        service._releasing = True
        service._advance(GlobalTime(3, 0))
        assert topic(partition) == [] and service._min_changed.is_set()

    asyncio.run(scenario())


def test_what_fails_at_once_is_appended_by_the_task_before_anything_later(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        service, partition = barrier(tmp_path, 1, 2, 3)
        real = partition.log.append_many
        full = [True]

        def append_many(records: Sequence[bytes]) -> int:
            if full[0]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(records)

        monkeypatch.setattr(partition.log, "append_many", append_many)
        service._advance(GlobalTime(2, 0))
        assert topic(partition) == [] and partition.held == [record(1)] and service._min_changed.is_set()
        service._min_changed.clear()
        full[0] = False
        service._advance(GlobalTime(4, 0))  # later records wait behind the held one, whatever the disk says now
        assert topic(partition) == [] and partition.held == [record(1), record(2), record(3)]
        releasing = asyncio.create_task(service.release_forever())
        async with asyncio.timeout(10):
            while partition.end < 3:
                await asyncio.sleep(0.01)
        assert topic(partition) == [record(1), record(2), record(3)] and partition.held == []
        service._stopping = True
        service._min_changed.set()
        await releasing

    asyncio.run(scenario())


def test_commits_are_stored_until_the_barrier_stops_and_then_refused_as_unavailable(tmp_path: Path) -> None:
    """A commit that reaches a stopping barrier gets UNAVAILABLE, which the SDK retries: its offsets writer is shut
    down by then, and the executor's own error would have reached the consumer as UNKNOWN, never retried."""
    async def scenario() -> None:
        service, partition = barrier(tmp_path, 1, 2)
        service._advance(GlobalTime(3, 0))
        await service.Commit(pb.CommitRequest(group="g", partition=0, offset=2), cast(Any, LocalContext()))
        assert (await service.Committed(pb.CommittedRequest(group="g", partition=0), cast(Any, LocalContext()))
                ).offset == 2
        await service.shutdown()
        with pytest.raises(LocalAbort) as refused:
            await service.Commit(pb.CommitRequest(group="g", partition=0, offset=1), cast(Any, LocalContext()))
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert partition.offsets.get("g") == 2

    asyncio.run(scenario())
