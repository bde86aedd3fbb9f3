"""The worker process on its own: real process, real gRPC; acker and barrier stood in for by the test."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import reduce
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import wordcount
from flamestream.cluster import ClusterStore
from flamestream.core import payload as payloads
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.transport import ACK, DELIVER
from tests.loopback import free_port, start_server, stop_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


class StandIns(rpc.AckerServicer, rpc.BarrierServicer):
    def __init__(self) -> None:
        self.acks: list[dict[GlobalTime, int]] = []
        self.delivered: list[tuple[list[Any], dict[GlobalTime, int]]] = []
        self.min_times: asyncio.Queue[pb.GlobalTime] = asyncio.Queue()
        self.changed = asyncio.Event()

    async def Ack(self, request_iterator: Any, context: Any) -> pb.Empty:
        async for batch in request_iterator:
            self.acks.append(codec.acks_of(batch.acks))
            self.changed.set()
        return pb.Empty()

    async def WatchMinTime(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.GlobalTime]:
        while True:
            yield await self.min_times.get()

    async def Deliver(self, request_iterator: Any, context: Any) -> pb.Empty:
        async for batch in request_iterator:
            self.delivered.append(codec.decode_batch(batch))
            self.changed.set()
        return pb.Empty()


def xor_all(acks: list[dict[GlobalTime, int]], gt: GlobalTime) -> int:
    return reduce(lambda a, b: a ^ b, (a.get(gt, 0) for a in acks), 0)


@contextlib.asynccontextmanager
async def worker_beside(stand_ins: StandIns, zookeeper: str, cluster: str,
                        flags: list[str]) -> AsyncIterator[tuple[str, str]]:
    """A worker process run with ``flags``, and ``stand_ins`` serving as its acker and barrier (over gRPC and
    frames): (the stand-ins' address, the worker's).  It must exit 0 when terminated."""
    def register(server: grpc.aio.Server) -> None:
        rpc.add_AckerServicer_to_server(stand_ins, server)
        rpc.add_BarrierServicer_to_server(stand_ins, server)

    server, here = await start_server(register, {ACK: stand_ins.Ack, DELIVER: stand_ins.Deliver})
    worker = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--zookeeper", zookeeper,
                               "--cluster", cluster, "--name", "node", "--worker", "0", *flags], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        ready = (await asyncio.to_thread(worker.stdout.readline)).split()
        assert ready[:2] == ["ready", "node"], ready
        yield here, ready[2]
    finally:
        worker.terminate()
        assert await asyncio.to_thread(worker.wait, 20) == 0
        await stop_server(server)


async def scenario(zookeeper: str, cluster: str, flags: list[str]) -> list[int]:
    """Run the worker with ``flags``; return the sizes of the batches it delivered to the barrier."""
    stand_ins = StandIns()
    async with worker_beside(stand_ins, zookeeper, cluster, flags) as (here, address):
        graph = wordcount.graph().to_dict()
        with ClusterStore(zookeeper, cluster=cluster) as store:
            store.publish_tick(Tick(0, GlobalTime(0, 0), graph, Layout.even(1), workers=(address,), fronts=(0,),
                                    acker=here, barriers=((0, here),)).to_dict())
        plan = compile_graph(wordcount.graph())
        gt = GlobalTime(5, 0)
        envelopes = [(plan.entry, plan.entry_balance(line), (line, gt, (seq,), False))
                     for seq, line in enumerate(["a dog", "a dog and a cat"])]
        sent = codec.new_acks([gt])
        async with grpc.aio.insecure_channel(address) as channel:
            call = rpc.WorkerStub(channel).Exchange()
            await call.write(codec.encode_batch(envelopes, sent, sender=-1, tick=0))
            for _ in range(100):
                records = [item for items, _ in stand_ins.delivered for item in items]
                receipts = stand_ins.acks + [acks for _, acks in stand_ins.delivered]
                if len(records) == 7 and xor_all(receipts, gt) == sent[gt]:
                    break
                stand_ins.changed.clear()
                await asyncio.wait_for(stand_ins.changed.wait(), 10)
            await call.done_writing()
        released = [payloads.decode_payload(pb.Record.FromString(item[0]).payload) for item in records]
        assert released == [{"word": "a", "count": 1}, {"word": "dog", "count": 1}, {"word": "a", "count": 2},
                            {"word": "dog", "count": 2}, {"word": "and", "count": 1}, {"word": "a", "count": 3},
                            {"word": "cat", "count": 1}]
        assert all(item[1] == gt and not item[3] and pb.Record.FromString(item[0]).time == pb.GlobalTime(ts=5)
                   for item in records)
        # The worker's acks XOR the barrier batches' acks equal what the sender acked: receipt cancels send,
        # and the barrier's own receipt acks (not sent by this stand-in) would cancel the rest.
        assert xor_all(stand_ins.acks + [acks for _, acks in stand_ins.delivered], gt) == sent[gt]
        return [len(items) for items, _ in stand_ins.delivered]


def test_worker_processes_batches_and_acks_per_step(zookeeper: str, cluster_name: str) -> None:
    assert asyncio.run(scenario(zookeeper, cluster_name, ["--linger-ms", "5"])) == [7]  # one step, one message


def test_worker_splits_output_into_batches_of_at_most_batch_items(zookeeper: str, cluster_name: str) -> None:
    assert asyncio.run(scenario(zookeeper, cluster_name, ["--batch-items", "2"])) == [2, 2, 2, 1]


def test_worker_that_cannot_deliver_dies_visibly(zookeeper: str, cluster_name: str) -> None:
    """A worker whose barrier (and acker) is gone must exit non-zero, not idle holding the min time, and say why
    in its log, with the traceback.  Which of its streams it finds broken first — the barrier's, when it delivers
    the batch, or the acker's min-time watch — is a race; so is whether the batch's call still gets its answer
    (under load the node was gone first, and the call ended UNAVAILABLE)."""
    dead = f"127.0.0.1:{free_port()}"  # a port nobody listens on
    worker = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--zookeeper", zookeeper,
                               "--cluster", cluster_name, "--worker", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().split()[2]
        with ClusterStore(zookeeper, cluster=cluster_name) as store:
            store.publish_tick(Tick(0, GlobalTime(0, 0), wordcount.graph().to_dict(), Layout.even(1),
                                    workers=(address,), fronts=(0,), acker=dead, barriers=((0, dead),)).to_dict())
        plan = compile_graph(wordcount.graph())
        gt = GlobalTime(1, 0)
        with grpc.insecure_channel(address) as channel, contextlib.suppress(grpc.RpcError):
            rpc.WorkerStub(channel).Exchange(iter([codec.encode_batch(
                [(plan.entry, plan.entry_balance("a b"), ("a b", gt, (0,), False))], codec.new_acks([gt]), -1, 0)]))
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode not in (0, None)
        assert re.search(r"CRITICAL node-worker0 worker0: .*; worker0 is NOT_SERVING and the node stops", stderr), \
            stderr
        assert "Traceback" in stderr and "StreamBroken" in stderr
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


class Recorder(StandIns):
    """Stand-ins that note, when each stream ends, whether the worker's hand-over snapshot was registered."""

    def __init__(self, registered: Callable[[], bool]) -> None:
        super().__init__()
        self.registered = registered
        self.carried: set[str] = set()
        self.ended: list[tuple[str, bool]] = []
        """(method, the snapshot was registered already) of each stream that carried something and ended."""

    async def _drain(self, method: str, request_iterator: Any) -> pb.Empty:
        carried = False
        async for _batch in request_iterator:
            carried = True
            self.carried.add(method)
        if carried:
            self.ended.append((method, await asyncio.to_thread(self.registered)))
        return pb.Empty()

    async def Ack(self, request_iterator: Any, context: Any) -> pb.Empty:
        return await self._drain("Ack", request_iterator)

    async def Deliver(self, request_iterator: Any, context: Any) -> pb.Empty:
        return await self._drain("Deliver", request_iterator)


async def handover(zookeeper: str, cluster: str, data_dir: Path) -> list[tuple[str, bool]]:
    """Tick 0 opens the worker's Ack and Deliver streams, tick 1 takes its state over: ``Recorder.ended``."""
    start = GlobalTime(10, 0)
    with ClusterStore(zookeeper, cluster=cluster) as store:
        recorder = Recorder(lambda: boundary_name(start) in store.complete_snapshots(0, 1))

        async with worker_beside(recorder, zookeeper, cluster, ["--data-dir", str(data_dir)]) as (here, address):
            tick = Tick(0, GlobalTime(0, 0), wordcount.graph().to_dict(), Layout.even(1), workers=(address,),
                        fronts=(0,), acker=here, barriers=((0, here),))
            store.publish_tick(tick.to_dict())
            plan = compile_graph(wordcount.graph())
            gt = GlobalTime(5, 0)
            batch = codec.encode_batch([(plan.entry, plan.entry_balance("a dog"), ("a dog", gt, (0,), False))],
                                       codec.new_acks([gt]), sender=-1, tick=0)
            async with grpc.aio.insecure_channel(address) as channel:
                call = rpc.WorkerStub(channel).Exchange()
                await call.write(batch)
                deadline = asyncio.get_running_loop().time() + 30
                while recorder.carried != {"Ack", "Deliver"}:  # tick 0's streams are open
                    assert asyncio.get_running_loop().time() < deadline, recorder.carried
                    await asyncio.sleep(0.05)
                store.publish_tick(replace(tick, number=1, start=start, previous=0).to_dict())
                # The min time passes tick 1's start until the snapshot is there: the worker may apply tick 1 after
                # the first one came.
                while not await asyncio.to_thread(recorder.registered):
                    assert asyncio.get_running_loop().time() < deadline + 30, "no hand-over snapshot"
                    await recorder.min_times.put(pb.GlobalTime(ts=start.ts + 1))
                    await asyncio.sleep(0.1)
                await call.done_writing()
        return recorder.ended


def test_a_handed_over_tick_closes_its_streams_before_it_registers_its_snapshot(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """`scale` stops the nodes that leave once every worker registered its hand-over snapshot: a stream of the old
    tick still open to one of them then broke, and the supervisor's probe (the peer refuses) restarted this node —
    and with it, for the recovery, the whole cluster."""
    ended = asyncio.run(handover(zookeeper, cluster_name, tmp_path))
    assert sorted(method for method, _ in ended) == ["Ack", "Deliver"], ended
    assert all(not registered for _, registered in ended), ended
