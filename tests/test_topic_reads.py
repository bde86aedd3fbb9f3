"""A subscriber reads only what the barrier counts as appended: the log publishes an append's records (their index
entries) before ``append_many`` returns to the event loop, and a consumer that read them then committed an offset
that ``Commit`` refused as out of range (seen once in a 10-minute chaos run: the consumer stopped)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from flamestream.barrier import service as barrier_service
from flamestream.barrier.service import BarrierService, _Partition
from flamestream.core.meta import GlobalTime
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.hosting import LocalContext
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb


def record(ts: int) -> bytes:
    return pb.Record(time=pb.GlobalTime(ts=ts, front=0), payload=b'"x"').SerializeToString()


def test_a_subscriber_stops_at_the_appended_end_while_an_append_is_returning(tmp_path: Path) -> None:
    async def run() -> None:
        partition = _Partition(0, tmp_path / "topic" / "0")
        barrier = BarrierService({0: partition}, LocalEndpoints())
        partition.log.append_many([record(1), record(2), record(3)])  # the append, as its worker thread runs it
        partition._appended([record(1)])  # the event loop has learnt of one record; the other two are on their way
        stream = barrier.Subscribe(pb.SubscribeRequest(partition=0, from_offset=0), cast(Any, LocalContext()))
        first = pb.RecordBatch.FromString(await anext(stream))  # the barrier sends batches it serialized itself
        assert [r.offset for r in first.records] == [0]
        partition._appended([record(2), record(3)])  # the append returned
        assert [r.offset for r in pb.RecordBatch.FromString(await anext(stream)).records] == [1, 2]
        await stream.aclose()
        partition.log.close()

    asyncio.run(run())


def test_a_subscriber_that_keeps_up_is_sent_the_newest_records_from_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest ``TAIL_RECORDS`` appended records are kept in memory: a subscription from within them is
    served without reading the log, one from before them reads it, and both see the same records."""
    monkeypatch.setattr(barrier_service, "TAIL_RECORDS", 4)
    reads: list[int] = []
    read = SegmentedLog.read

    def counted(log: SegmentedLog, from_offset: int, max_records: int = 1000) -> list[tuple[int, bytes]]:
        reads.append(from_offset)
        return read(log, from_offset, max_records)

    monkeypatch.setattr(SegmentedLog, "read", counted)

    async def subscribe(barrier: BarrierService, offset: int) -> list[tuple[int, bytes]]:
        stream = barrier.Subscribe(pb.SubscribeRequest(partition=0, from_offset=offset), cast(Any, LocalContext()))
        batch = pb.RecordBatch.FromString(await anext(stream))
        await stream.aclose()
        return [(r.offset, r.SerializeToString()) for r in batch.records]

    async def run() -> None:
        partition = _Partition(0, tmp_path / "topic" / "0")
        barrier = BarrierService({0: partition}, LocalEndpoints())
        for first in (1, 6):
            await partition.append([(GlobalTime(ts, 0), (), record(ts)) for ts in range(first, first + 5)])
        assert partition.recent(6, 10) == [(6, record(7)), (7, record(8)), (8, record(9)), (9, record(10))]
        assert partition.recent(5, 10) is None
        assert partition.recent(10, 10) == []
        # Either end of the tail: the read is taken from the nearer one.
        assert partition.recent(6, 2) == [(6, record(7)), (7, record(8))]
        assert partition.recent(8, 1) == [(8, record(9))]
        assert partition.recent(7, 3) == [(7, record(8)), (8, record(9)), (9, record(10))]
        from_memory = await subscribe(barrier, 7)
        assert reads == []
        from_disk = await subscribe(barrier, 0)
        assert reads == [0]
        assert [offset for offset, _ in from_disk] == list(range(10)) and from_disk[7:] == from_memory
        partition.log.close()

    asyncio.run(run())
