"""The barrier service as a real process.

Most tests stand in for the acker with an in-test servicer that records the
barrier's receipt acks and lets the test dictate min times; the last one runs
the real acker and plays front and worker against both processes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from flamestream.cluster import ClusterStore
from flamestream.core import payload as payloads
from flamestream.core.item import Item
from flamestream.core.meta import GlobalTime
from flamestream.runtime.frames import FrameServer
from flamestream.storage.offsets import OFFSETS_FILE
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as pb_grpc
from flamestream.wire.transport import ACK
from tests.loopback import FramesAt
from tests.test_acker_service import RPC_TIMEOUT, Service, publish_tick, read_until, running

pytestmark = pytest.mark.slow

MARK = 1 << 32
"""Logical time 1 in an encoded trace (see flamestream.meta): a grouping's version mark."""


class FakeAcker(pb_grpc.AckerServicer):
    """Records every AckBatch the barrier sends and streams the min times the test pushes."""

    def __init__(self) -> None:
        self.acks: queue.Queue[dict[GlobalTime, int]] = queue.Queue()
        self.ticks: list[int] = []
        """The tick each batch named, in order."""
        self._lock = threading.Lock()
        self._latest: pb.GlobalTime | None = None
        self._watchers: list[queue.Queue[pb.GlobalTime]] = []

    def push(self, min_time: GlobalTime) -> None:
        with self._lock:
            self._latest = pb.GlobalTime(ts=min_time.ts, front=min_time.front)
            for watcher in self._watchers:
                watcher.put(self._latest)

    def take(self, batch: pb.AckBatch) -> None:
        self.ticks.append(batch.tick)
        self.acks.put(codec.acks_of(batch.acks))

    def Ack(self, request_iterator: Iterator[pb.AckBatch], context: Any) -> pb.Empty:
        with contextlib.suppress(grpc.RpcError):  # the barrier drops its stream on a new tick and on exit
            for batch in request_iterator:
                self.take(batch)
        return pb.Empty()

    async def ack_frames(self, requests: AsyncIterator[pb.AckBatch], context: Any) -> pb.Empty:
        """``Ack`` as a node's barrier calls it: over frames (``flamestream.runtime.frames``)."""
        async for batch in requests:
            self.take(batch)
        return pb.Empty()

    def WatchMinTime(self, request: pb.Empty, context: Any) -> Iterator[pb.GlobalTime]:
        mine: queue.Queue[pb.GlobalTime] = queue.Queue()
        with self._lock:
            self._watchers.append(mine)
            if self._latest is not None:
                mine.put(self._latest)
        try:
            while context.is_active():
                with contextlib.suppress(queue.Empty):
                    yield mine.get(timeout=0.1)
        finally:
            with self._lock:
                self._watchers.remove(mine)


@contextlib.contextmanager
def fake_acker() -> Iterator[tuple[FakeAcker, str]]:
    servicer = FakeAcker()
    loop = asyncio.new_event_loop()  # the frames listener's, on a thread of its own
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    frames = FrameServer({ACK: servicer.ack_frames}.get, None)
    frames_port = asyncio.run_coroutine_threadsafe(frames.start("127.0.0.1"), loop).result()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_AckerServicer_to_server(servicer, server)
    pb_grpc.add_NodeServicer_to_server(FramesAt(frames_port), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0)
        asyncio.run_coroutine_threadsafe(frames.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextlib.contextmanager
def barrier_process(zookeeper: str, cluster: str, data_dir: Path, stderr_path: Path,
                    partitions: str = "0,1") -> Iterator[tuple[Service, pb_grpc.BarrierStub]]:
    args = ["--zookeeper", zookeeper, "--cluster", cluster, "--barrier", partitions, "--data-dir", str(data_dir)]
    with running("barrier", args, stderr_path) as barrier, grpc.insecure_channel(barrier.address) as channel:
        yield barrier, pb_grpc.BarrierStub(channel)


def batch(items: list[Item], acks: dict[GlobalTime, int], tick: int = 0) -> pb.ItemBatch:
    return codec.encode_batch(codec.to_records(items), acks, sender=0, tick=tick)


def deliver(stub: pb_grpc.BarrierStub, item_batch: pb.ItemBatch) -> None:
    """Deliver one batch (the barrier holds it until it has taken up the tick)."""
    stub.Deliver(iter([item_batch]), timeout=RPC_TIMEOUT)


def records(stream: Iterator[pb.Record], count: int) -> list[tuple[int, int, GlobalTime, Any]]:
    """The next ``count`` records as (partition, offset, time, payload)."""
    out = []
    for _ in range(count):
        record = next(stream)
        out.append((record.partition, record.offset, GlobalTime(record.time.ts, record.time.front),
                    payloads.decode_payload(record.payload)))
    return out


class Subscription:
    """A Subscribe stream read record by record (the barrier sends them in batches)."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: collections.deque[pb.Record] = collections.deque()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> pb.Record:
        while not self.pending:
            self.pending.extend(next(self.call).records)
        return self.pending.popleft()

    def cancel(self) -> None:
        self.call.cancel()


def subscribe(stub: pb_grpc.BarrierStub, partition: int, from_offset: int) -> Subscription:
    return Subscription(stub.Subscribe(pb.SubscribeRequest(partition=partition, from_offset=from_offset), timeout=60))


def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    return failure.value.code(), failure.value.details() or ""


G10, G20, G30 = GlobalTime(10, 0), GlobalTime(20, 0), GlobalTime(30, 0)
G3, G11, G12 = GlobalTime(3, 1), GlobalTime(11, 1), GlobalTime(12, 1)
BATCH1: list[Item] = [
    ("stale", G10, (MARK, 0), False),  # invalidated by the next version, which arrives after it
    ("late", G20, (0,), False),
    ("b1", G10, (2 * MARK, 0), False),
    ("x", G11, (0,), False),
]
BATCH2: list[Item] = [
    ("c", G12, (0,), True),  # the tombstone overtakes the item it retracts
    ("b2", G10, (2 * MARK, 1), False),  # b1's sibling: both stay
    ("c", G12, (0,), False),
    ({"early": [1]}, G3, (0,), False),
]
RELEASED_BY_15 = {
    0: [(0, 0, G10, "b1"), (0, 1, G10, "b2")],
    1: [(1, 0, G3, {"early": [1]}), (1, 1, G11, "x")],
}
RELEASED_BY_25 = (0, 2, G20, "late")


def test_release_order_invalidation_offsets_and_commits(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    with (fake_acker() as (acker, acker_address),
          barrier_process(zookeeper, cluster_name, tmp_path / "data", tmp_path / "barrier.err") as (barrier, stub)):
        acks1 = {G10: 0x1111, G20: 0x2222, G11: 0x3333}
        acks2 = {G12: 0x4444, G10: 0x5555, G3: 0x6666}
        # A worker that saw the tick first: its batch waits for the barrier's tick instead of being lost.
        early = threading.Thread(target=stub.Deliver, args=(iter([batch(BATCH1, acks1)]),),
                                 kwargs={"timeout": RPC_TIMEOUT})
        early.start()
        time.sleep(0.3)
        assert acker.acks.empty()
        publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=0, acker=acker_address,
                     barriers=((0, barrier.address), (1, barrier.address)))
        early.join(RPC_TIMEOUT)
        assert acker.acks.get(timeout=RPC_TIMEOUT) == acks1  # exactly the batch's acks, as its receipt
        deliver(stub, batch(BATCH2, acks2))
        assert acker.acks.get(timeout=RPC_TIMEOUT) == acks2

        live0 = subscribe(stub, 0, 0)
        live1 = subscribe(stub, 1, 0)
        acker.push(GlobalTime(15, 0))
        assert records(live0, 2) == RELEASED_BY_15[0]
        assert records(live1, 2) == RELEASED_BY_15[1]
        acker.push(GlobalTime(25, 0))
        assert records(live0, 1) == [RELEASED_BY_25]  # live, on the subscription already open
        assert records(subscribe(stub, 0, 1), 2) == [RELEASED_BY_15[0][1], RELEASED_BY_25]  # from the middle
        live0.cancel()
        live1.cancel()

        committed = pb.CommittedRequest(group="readers", partition=0)
        assert stub.Committed(committed, timeout=RPC_TIMEOUT).offset == 0
        stub.Commit(pb.CommitRequest(group="readers", partition=0, offset=2), timeout=RPC_TIMEOUT)
        assert stub.Committed(committed, timeout=RPC_TIMEOUT).offset == 2
        assert stub.Committed(pb.CommittedRequest(group="readers", partition=1), timeout=RPC_TIMEOUT).offset == 0


def test_bad_requests_get_clear_statuses(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    with (fake_acker() as (acker, acker_address),
          barrier_process(zookeeper, cluster_name, tmp_path / "data", tmp_path / "barrier.err",
                          partitions="0") as (barrier, stub)):
        publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=0, acker=acker_address,
                     barriers=((0, barrier.address),))
        deliver(stub, batch([("kept", G10, (0,), False)], {G10: 1}))
        acker.push(G20)
        assert records(subscribe(stub, 0, 0), 1) == [(0, 0, G10, "kept")]

        def deliver_raw(item_batch: pb.ItemBatch) -> tuple[grpc.StatusCode, str]:
            return status_of(lambda: stub.Deliver(iter([item_batch]), timeout=RPC_TIMEOUT))

        code, details = deliver_raw(batch([("ok", G30, (0,), False), ("foreign", G11, (0,), False)], {G30: 1}))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "partition 1" in details
        assert deliver_raw(pb.ItemBatch(items=b"not a pickle"))[0] == grpc.StatusCode.INVALID_ARGUMENT
        malformed = [[(b"no gt", (30, 0), (0,), False)], [("not a serialized record", G10, (0,), False)]]
        for items in malformed:
            assert deliver_raw(codec.encode_batch(items, {}, sender=0, tick=0))[0] == grpc.StatusCode.INVALID_ARGUMENT
        untold = batch([("no tick", G30, (0,), False)], {G30: 1})
        untold.ClearField("tick")
        code, details = deliver_raw(untold)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "tick" in details

        def first_record(partition: int, from_offset: int) -> tuple[grpc.StatusCode, str]:
            return status_of(lambda: next(subscribe(stub, partition, from_offset)))

        assert first_record(1, 0)[0] == grpc.StatusCode.NOT_FOUND
        assert first_record(0, -1)[0] == grpc.StatusCode.OUT_OF_RANGE
        code, details = first_record(0, 2)
        assert code == grpc.StatusCode.OUT_OF_RANGE and "0..1" in details

        def commit(group: str, partition: int, offset: int) -> tuple[grpc.StatusCode, str]:
            request = pb.CommitRequest(group=group, partition=partition, offset=offset)
            return status_of(lambda: stub.Commit(request, timeout=RPC_TIMEOUT))

        assert commit("a/b", 0, 1)[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert commit("", 0, 1)[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert commit("g", 1, 0)[0] == grpc.StatusCode.NOT_FOUND
        assert commit("g", 0, 5)[0] == grpc.StatusCode.OUT_OF_RANGE
        code, _ = status_of(lambda: stub.Committed(pb.CommittedRequest(group="a/b", partition=0), timeout=RPC_TIMEOUT))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

        # After all that, the rejected batch left nothing behind (the valid item before the foreign one
        # included), and the barrier still delivers, acks and releases.
        deliver(stub, batch([("after", G30, (0,), False)], {G30: 9}))
        assert acker.acks.get(timeout=RPC_TIMEOUT) == {G10: 1}
        assert acker.acks.get(timeout=RPC_TIMEOUT) == {G30: 9}
        acker.push(GlobalTime(40, 0))
        assert records(subscribe(stub, 0, 1), 1) == [(0, 1, G30, "after")]


def test_a_batch_waits_for_its_tick_and_one_of_a_replaced_tick_is_dropped(zookeeper: str, cluster_name: str,
                                                                          tmp_path: Path) -> None:
    """A worker of a fresh tick may deliver before this barrier takes the tick up: inserted at once, its items
    would be dropped with the old tick's buffers (lost, while the acker counts them done).  A late batch of the
    replaced tick is dropped with them, acks included (the acker dropped its global times too)."""
    with (fake_acker() as (acker, acker_address),
          barrier_process(zookeeper, cluster_name, tmp_path / "data", tmp_path / "barrier.err",
                          partitions="0") as (barrier, stub)):
        def fresh_tick(start_ts: int) -> None:
            publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=start_ts, acker=acker_address,
                         barriers=((0, barrier.address),))

        fresh_tick(0)
        deliver(stub, batch([("old", G10, (0,), False)], {G10: 1}, tick=0))
        assert acker.acks.get(timeout=RPC_TIMEOUT) == {G10: 1}
        early = threading.Thread(target=deliver, args=(stub, batch([("new", G30, (0,), False)], {G30: 2}, tick=1)))
        early.start()
        time.sleep(0.3)  # the batch reaches the barrier before tick 1 does
        assert early.is_alive() and acker.acks.empty(), "a batch of a tick not taken up yet must wait for it"
        fresh_tick(20)
        early.join(RPC_TIMEOUT)
        assert acker.acks.get(timeout=RPC_TIMEOUT) == {G30: 2}
        deliver(stub, batch([("late", G20, (0,), False)], {G20: 3}, tick=0))  # tick 0's buffers are gone
        deliver(stub, batch([("newer", GlobalTime(31, 0), (0,), False)], {GlobalTime(31, 0): 4}, tick=1))
        assert acker.acks.get(timeout=RPC_TIMEOUT) == {GlobalTime(31, 0): 4}  # "late" was acked by no one
        acker.push(GlobalTime(40, 0))
        assert [r[3] for r in records(subscribe(stub, 0, 0), 2)] == ["new", "newer"]
        assert acker.ticks == [0, 1, 1]


def test_topic_survives_a_restart(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with fake_acker() as (acker, acker_address):
        with barrier_process(zookeeper, cluster_name, data, tmp_path / "first.err") as (barrier, stub):
            publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=0, acker=acker_address,
                         barriers=((0, barrier.address), (1, barrier.address)))
            deliver(stub, batch(BATCH1, {}))
            acker.push(GlobalTime(25, 0))
            assert [r[3] for r in records(subscribe(stub, 0, 0), 2)] == ["b1", "late"]
            stub.Commit(pb.CommitRequest(group="readers", partition=0, offset=2), timeout=RPC_TIMEOUT)
        # Partition 1 as a cluster from before the offsets moved out of ZooKeeper left it: no offsets file, and a
        # group's offset in ZooKeeper (past the partition's end).  Partition 0's file wins over ZooKeeper.
        (data / "topic" / "1" / OFFSETS_FILE).unlink()
        with ClusterStore(zookeeper, cluster=cluster_name) as store:
            for group, partition, offset in (("old", 1, b"7"), ("readers", 0, b"0")):
                store._zk.create(f"{store.base}/offsets/{group}/output/{partition}", offset, makepath=True)
        with barrier_process(zookeeper, cluster_name, data, tmp_path / "second.err") as (barrier, stub):
            # Readable before any tick reaches the new process, and so are the committed offsets.
            assert records(subscribe(stub, 0, 0), 2) == [(0, 0, G10, "b1"), (0, 1, G20, "late")]
            assert records(subscribe(stub, 1, 0), 1) == [(1, 0, G11, "x")]
            assert [stub.Committed(pb.CommittedRequest(group=group, partition=partition), timeout=RPC_TIMEOUT).offset
                    for group, partition in (("readers", 0), ("old", 1), ("old", 0))] == [2, 1, 0]
            # A restarted process does not take its predecessor's tick over: it waits for a newer one (what a
            # recovery publishes), and so does a delivery of that tick, which the tick cannot empty its buffer of.
            with futures.ThreadPoolExecutor(1) as pool:
                delivered = pool.submit(deliver, stub, batch([("again", G30, (0,), False)], {}, tick=1))
                publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=0, acker=acker_address,
                             barriers=((0, barrier.address), (1, barrier.address)))
                delivered.result()
            acker.push(GlobalTime(35, 0))
            assert records(subscribe(stub, 0, 2), 1) == [(0, 2, G30, "again")]  # appends continue the offsets


def test_with_the_real_acker_items_wait_for_their_receipt_ack(zookeeper: str, cluster_name: str,
                                                             tmp_path: Path) -> None:
    acker_args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with (running("acker", acker_args, tmp_path / "acker.err") as acker,
          grpc.insecure_channel(acker.address) as channel,
          barrier_process(zookeeper, cluster_name, tmp_path / "data", tmp_path / "barrier.err",
                          partitions="0") as (barrier, stub)):
        acker_stub = pb_grpc.AckerStub(channel)
        watch = acker_stub.WatchMinTime(pb.Empty(), timeout=60)
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=0, acker=acker.address,
                     barriers=((0, barrier.address),))
        assert read_until(watch, GlobalTime(0, 0)) == [GlobalTime(0, 0)]
        # As a worker: the send of an item at (10, 0) is acked; as its front: nothing below 50 any more.
        acker_stub.Ack(iter([pb.AckBatch(acks=[pb.Ack(ts=10, front=0, xor=0xBEEF)], report=pb.Report(front=0, ts=50),
                                         tick=0)]),
                       timeout=RPC_TIMEOUT)
        # The item in flight holds the min time at (10, 0); nothing completed, so watchers hear nothing yet.
        deliver(stub, batch([("payload", G10, (0,), False)], {G10: 0xBEEF}))
        # The barrier's receipt ack cancels the send, the min time moves on and releases the item.
        assert read_until(watch, GlobalTime(50, 0)) == [GlobalTime(50, 0)]
        assert records(subscribe(stub, 0, 0), 1) == [(0, 0, G10, "payload")]
        watch.cancel()
