"""Worker servicer and its processing loop (see the package docstring for the protocol)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from collections.abc import Callable
from typing import Any

import grpc

from flamestream import codec, hosting
from flamestream.graph import Graph
from flamestream.item import Envelope, Item, envelope_meta, envelope_time, item_time
from flamestream.meta import GlobalTime
from flamestream.plan import compile_graph
from flamestream.tick import Tick
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.worker import Worker


class Streams:
    """The worker's long-lived outgoing streams, one per (address, method): FIFO per channel, opened on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[tuple[str, str], hosting.ClientStream[Any]] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = hosting.channel(address)
        return self._channels[address]

    async def write(self, address: str, method: str, message: Any) -> None:
        stream = self._streams.get((address, method))
        if stream is None:
            stream = self._streams[(address, method)] = hosting.ClientStream(self.channel(address), method, address)
        await stream.write(message)

    async def close(self) -> None:
        """Half-close every stream and wait (bounded) for its reply, so nothing written is cancelled in flight."""
        for stream in self._streams.values():
            await stream.close()
        for ch in self._channels.values():
            await ch.close()
        self._streams.clear()
        self._channels.clear()


class WorkerService(rpc.WorkerServicer):
    def __init__(self, index: int, batch_items: int = 256, linger_ms: float = 0.0) -> None:
        self.index = index
        self.batch_items = batch_items
        self.linger = linger_ms / 1000
        self.inbox: asyncio.Queue[pb.ItemBatch] = asyncio.Queue()
        self.core: Worker | None = None
        self.tick: Tick | None = None
        self.streams = Streams()
        self.ready = asyncio.Event()
        self.lock = asyncio.Lock()
        """Serialises processing steps and tick changes: a step never writes to streams being closed."""
        self._min_time_task: asyncio.Task[None] | None = None

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        # Batches may arrive before this worker has seen the tick (a front saw it first): they wait in the inbox.
        async for batch in request_iterator:
            self.inbox.put_nowait(batch)
        return pb.Empty()

    async def apply_tick(self, tick: Tick) -> None:
        async with self.lock:
            await self._apply_tick(tick)

    async def _apply_tick(self, tick: Tick) -> None:
        if self.index >= len(tick.workers):
            print(f"worker {self.index}: tick {tick.number} has only {len(tick.workers)} workers; idle",
                  file=sys.stderr, flush=True)
            return
        await self.streams.close()
        if self._min_time_task is not None:
            self._min_time_task.cancel()
        self.tick = tick
        self.core = Worker(compile_graph(Graph.from_dict(tick.graph)), self.index, tick.layout)
        self._min_time_task = asyncio.create_task(self._watch_min_time(tick.acker))
        self.ready.set()

    async def _watch_min_time(self, acker: str) -> None:
        stub = rpc.AckerStub(self.streams.channel(acker))
        async for mt in stub.WatchMinTime(pb.Empty()):
            if self.core is not None:
                self.core.on_min_time(GlobalTime(mt.ts, mt.front))

    async def run(self) -> None:
        while True:
            batches = [await self.inbox.get()]
            if self.linger:
                await asyncio.sleep(self.linger)
            while not self.inbox.empty():
                batches.append(self.inbox.get_nowait())
            await self.ready.wait()
            async with self.lock:
                await self.step(batches)

    async def step(self, batches: list[pb.ItemBatch]) -> None:
        core, tick = self.core, self.tick
        assert core is not None and tick is not None
        acks: dict[GlobalTime, int] = {}
        envelopes: list[Envelope] = []
        for batch in batches:
            entries, received = codec.decode_batch(batch)
            envelopes.extend(entries)
            codec.xor_into(acks, received)
        if len(batches) > 1:
            envelopes.sort(key=envelope_meta)
        # Outputs leave in pieces while the core runs on (see Worker.run); the receipt acks go last, once
        # every output's send ack is folded in, so the acker never sees this step's items as done early.
        for remote, to_barrier in core.run(envelopes, self.batch_items):
            for worker, outs in remote.items():
                await self._send(tick.workers[worker], hosting.EXCHANGE, outs, envelope_time, acks)
            by_barrier: dict[str, list[Item]] = {}
            for item in to_barrier:
                by_barrier.setdefault(tick.barrier_of(item[1].front), []).append(item)
            for address, items in by_barrier.items():
                await self._send(address, hosting.DELIVER, codec.to_records(items), item_time, acks)
        await self.streams.write(tick.acker, hosting.ACK, pb.AckBatch(acks=codec.ack_messages(acks)))

    async def _send(self, address: str, method: str, entries: list[Any], gt_of: Callable[[Any], GlobalTime],
                    acks: dict[GlobalTime, int]) -> None:
        """Ship ``entries`` in messages of at most ``batch_items``, each with fresh send acks folded into ``acks``."""
        for start in range(0, len(entries), self.batch_items):
            chunk = entries[start:start + self.batch_items]
            sent = codec.new_acks({gt_of(e) for e in chunk})
            codec.xor_into(acks, sent)
            await self.streams.write(address, method, codec.encode_batch(chunk, sent, self.index))


async def serve(args: argparse.Namespace) -> None:
    host = hosting.Host("worker", args)
    service = WorkerService(args.index, args.batch_items, args.linger_ms)
    await host.start(lambda server: rpc.add_WorkerServicer_to_server(service, server), {"index": args.index})

    async def follow_ticks() -> None:
        async for tick in host.ticks():
            await service.apply_tick(tick)

    tasks = [asyncio.create_task(service.run()), asyncio.create_task(follow_ticks())]
    stopped = asyncio.create_task(host.wait_stopped())
    await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    for task in [stopped, *tasks]:
        task.cancel()
    # Let the cancellations land first: a step cancelled inside a write cancels that stream's call, and
    # closing must see the call settled, not race it.
    await asyncio.gather(stopped, *tasks, return_exceptions=True)
    await service.streams.close()
    await host.stop()
    if failed:
        # No fault tolerance yet: a worker that cannot go on must die visibly, not sit idle holding the min time.
        error = failed[0].exception()
        traceback.print_exception(error)
        raise SystemExit(f"worker {args.index}: stopped: {error!r}")
