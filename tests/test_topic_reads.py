"""A subscriber reads only what the barrier counts as appended: the log publishes an append's records (their index
entries) before ``append_many`` returns to the event loop, and a consumer that read them then committed an offset
that ``Commit`` refused as out of range (seen once in a 10-minute chaos run: the consumer stopped)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from flamestream.barrier.service import BarrierService, _Partition
from flamestream.runtime.channels import LocalContext, LocalEndpoints
from flamestream.wire import flamestream_pb2 as pb


def record(ts: int) -> bytes:
    return pb.Record(time=pb.GlobalTime(ts=ts, front=0), payload=b'"x"').SerializeToString()


def test_a_subscriber_stops_at_the_appended_end_while_an_append_is_returning(tmp_path: Path) -> None:
    async def run() -> None:
        partition = _Partition(0, tmp_path / "topic" / "0")
        barrier = BarrierService(cast(Any, None), {0: partition}, LocalEndpoints())
        partition.log.append_many([record(1), record(2), record(3)])  # the append, as its worker thread runs it
        partition._appended(1)  # the event loop has learnt of one record; the other two are on their way
        stream = barrier.Subscribe(pb.SubscribeRequest(partition=0, from_offset=0), cast(Any, LocalContext()))
        first = await anext(stream)
        assert [r.offset for r in first.records] == [0]
        partition._appended(2)  # the append returned
        assert [r.offset for r in (await anext(stream)).records] == [1, 2]
        await stream.aclose()
        partition.log.close()

    asyncio.run(run())
