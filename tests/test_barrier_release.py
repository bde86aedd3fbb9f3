"""When the barrier appends what a min time releases (``BarrierService._advance``): at once, in the min-time watch
that brought it, while the release task is idle; otherwise, or when the append cannot run on the loop, the task
appends it after whatever it held before, in release order.  The partitions are real topic logs in a temporary
directory; no process, no acker: the test hands min times to the service as its acker link would."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health

from flamestream.barrier.service import BarrierService, _Partition
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick
from flamestream.runtime.channels import Channels, LocalEndpoints, LocalItems
from flamestream.runtime.hosting import LocalAbort, LocalContext
from flamestream.runtime.supervision import Supervisor
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.transport import ACK, DELIVER


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


class Acker:
    """The acker of the node the barrier runs on: records the receipt acks, publishes the min times it is given."""

    def __init__(self) -> None:
        self.acks: asyncio.Queue[dict[GlobalTime, int]] = asyncio.Queue()
        self.min_times: asyncio.Queue[GlobalTime] = asyncio.Queue()

    async def Ack(self, request_iterator: Any, context: Any) -> pb.Empty:
        async for batch in request_iterator:
            self.acks.put_nowait(codec.acks_of(batch.acks))
        return pb.Empty()

    async def WatchMinTime(self, request: pb.Empty, context: Any) -> AsyncGenerator[pb.GlobalTime, None]:
        while True:
            min_time = await self.min_times.get()
            yield pb.GlobalTime(ts=min_time.ts, front=min_time.front)


@pytest.mark.parametrize("local", [True, False], ids=["local-items", "item-batch"])
def test_a_worker_of_the_barriers_own_node_hands_its_records_over_as_they_are(tmp_path: Path, local: bool) -> None:
    """``LocalItems`` (what a worker of the same node sends, not encoded) and the ``ItemBatch`` a worker of another
    node sends give the barrier the same records and acks, and the topic the same appends."""
    here = "127.0.0.1:1"

    async def scenario() -> list[bytes]:
        endpoints = LocalEndpoints(here)
        acker = Acker()
        endpoints.streams[ACK] = acker.Ack
        endpoints.min_time = acker.WatchMinTime
        partition = _Partition(0, tmp_path / "topic-0")
        service = BarrierService({0: partition}, endpoints)
        endpoints.streams[DELIVER] = service.Deliver
        service.supervisor = Supervisor(health.aio.HealthServicer())
        await service.deploy(Tick(number=3, start=GlobalTime(0, 0), graph={}, layout=Layout.even(1), fronts=(0,),
                                  acker=here, barriers=((0, here),)))
        records = codec.to_records([({"n": ts}, GlobalTime(ts, 0), (0, i), False) for i, ts in enumerate((1, 2, 2, 5))])
        sent = {GlobalTime(1, 0): 11, GlobalTime(2, 0): 22, GlobalTime(5, 0): 55}
        worker = Channels(endpoints)
        assert worker.is_local(here, DELIVER) and not worker.is_local("127.0.0.1:2", DELIVER)
        await worker.write(here, DELIVER, LocalItems(records, sent, 0, 3) if local
                           else codec.encode_batch(records, sent, 0, 3))
        async with asyncio.timeout(10):
            assert await acker.acks.get() == sent  # inserted: its receipt acks go on to the acker
            acker.min_times.put_nowait(GlobalTime(5, 0))
            while partition.end < 3:
                await asyncio.sleep(0.01)
        await worker.close()
        return topic(partition)

    appended = asyncio.run(scenario())
    assert [pb.Record.FromString(data).payload for data in appended] == [b'{"n":1}', b'{"n":2}', b'{"n":2}']
