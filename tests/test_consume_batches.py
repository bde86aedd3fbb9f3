"""What a consumer makes of the batches its subscription sends (``AsyncClient._follow``, ``client._read_records``).

A barrier stands in on a real gRPC server, registered in a real ZooKeeper,
and sends exactly the bytes each test gives it: records arrive as they were
written; a record whose payload is not JSON ends the consumption with a
``ClientError`` after the records before it; bytes that are no record batch at
all end it with a ``ClientError`` naming the fault (gRPC's own parsing ended the
partition's follower silently, and the consumer waited for records that never came).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flamestream.client import AsyncClient, ClientError, Record
from flamestream.cluster import BARRIER, ClusterStore
from flamestream.core import columns
from flamestream.core.meta import GlobalTime
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from tests.loopback import start_server, stop_server


class Sending(rpc.BarrierServicer):
    """A barrier whose subscription to partition 0 sends ``batches`` as they are, then nothing more."""

    def __init__(self, batches: list[bytes]) -> None:
        self.batches = batches

    async def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> AsyncIterator[bytes]:
        for batch in self.batches:
            yield batch
        await asyncio.Event().wait()


def stored(ts: int, payload: bytes) -> bytes:
    """A record as the barrier stores it: its time and payload (``record_batch`` adds partition and offset)."""
    return pb.Record(time=pb.GlobalTime(ts=ts, front=0), payload=payload).SerializeToString()


def consumed(zookeeper: str, cluster: str, batches: list[bytes]) -> tuple[list[Record], ClientError | None]:
    """The records a consumer got from a barrier sending ``batches``, and the error that ended it (None if it
    ran out of time, 5 s after the last record)."""
    async def scenario() -> tuple[list[Record], ClientError | None]:
        server, address = await start_server(
            lambda s: codec.add_servicer(s, Sending(batches), pb.DESCRIPTOR.services_by_name["Barrier"]))
        got: list[Record] = []
        try:
            with ClusterStore(zookeeper, cluster=cluster) as store:
                store.register(BARRIER, "barrier0", {"address": address, "partitions": [0]})
                async with AsyncClient(zookeeper, cluster, retries=0) as client:
                    try:
                        async for batch in client.consume_batches("g", from_committed=False, timeout=5):
                            got.extend(batch)
                    except ClientError as exc:
                        return got, exc
        finally:
            await stop_server(server)
        return got, None

    return asyncio.run(scenario())


def test_records_arrive_as_the_barrier_wrote_them(zookeeper: str, cluster_name: str) -> None:
    word = '{"word": "мяч"}'.encode()
    batches = [columns.record_batch(0, [(0, stored(5, word)), (1, stored(5, b"[1, 2.5]"))]),
               columns.record_batch(0, [(2, stored(9, b"null")), (3, stored(0, b'"zero"')), (4, stored(9, b"4"))])]
    got, error = consumed(zookeeper, cluster_name, batches)
    assert error is None
    assert [(r.partition, r.offset, r.time, r.payload, r.group) for r in got] == [
        (0, 0, GlobalTime(5, 0), {"word": "мяч"}, "g"), (0, 1, GlobalTime(5, 0), [1, 2.5], "g"),
        (0, 2, GlobalTime(9, 0), None, "g"), (0, 3, GlobalTime(0, 0), "zero", "g"), (0, 4, GlobalTime(9, 0), 4, "g")]


def test_a_payload_that_is_not_json_ends_consumption_after_the_records_before_it(zookeeper: str,
                                                                                 cluster_name: str) -> None:
    batches = [columns.record_batch(0, [(0, stored(5, b"1")), (1, stored(5, b"{not json")), (2, stored(5, b"3"))])]
    got, error = consumed(zookeeper, cluster_name, batches)
    assert [r.payload for r in got] == [1]
    assert error is not None and "partition 0" in str(error)


@pytest.mark.parametrize("garbage", [b"\x0a\x10\x08", b"\x0f", b"\x0b" * 200 + b"\x0c" * 200])
def test_bytes_that_are_no_record_batch_end_consumption_with_a_clear_error(zookeeper: str, cluster_name: str,
                                                                           garbage: bytes) -> None:
    got, error = consumed(zookeeper, cluster_name, [columns.record_batch(0, [(0, stored(5, b"1"))]), garbage])
    assert [r.payload for r in got] == [1]
    assert error is not None and "partition 0: the barrier sent a malformed record batch" in str(error)
