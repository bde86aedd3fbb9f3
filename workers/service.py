"""Worker servicer and its processing loop (see the package docstring for the protocol)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from flamestream.core.graph import Graph
from flamestream.core.item import Envelope, Item, envelope_meta, envelope_time, item_time
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Tick
from flamestream.core.worker import Worker
from flamestream.runtime.channels import Channels, LocalEndpoints
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc


class WorkerService(rpc.WorkerServicer):
    def __init__(self, index: int, local: LocalEndpoints, batch_items: int = 256, linger_ms: float = 0.0) -> None:
        self.index = index
        self.local = local
        self.log = role_logger(f"worker{index}")
        self.batch_items = batch_items
        self.linger = linger_ms / 1000
        self.inbox: asyncio.Queue[pb.ItemBatch] = asyncio.Queue()
        self.core: Worker | None = None
        self.tick: Tick | None = None
        self.streams = Channels(local)
        self.ready = asyncio.Event()
        self.lock = asyncio.Lock()
        """Serialises processing steps and tick changes: a step never writes to streams being closed."""
        self._min_time_task: asyncio.Task[None] | None = None
        self.supervisor: Supervisor | None = None

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
            self.log.warning("tick %d has only %d workers; idle", tick.number, len(tick.workers))
            return
        core = Worker(compile_graph(Graph.from_dict(tick.graph)), self.index, tick.layout)
        await self.streams.close()
        if self._min_time_task is not None:
            self._min_time_task.cancel()
        self.tick, self.core = tick, core
        assert self.supervisor is not None, "start() comes before the first tick"
        self._min_time_task = self.supervisor.spawn(f"worker{self.index}", f"min-time watch of tick {tick.number}",
                                                    self._watch_min_time(tick.acker))
        self.ready.set()

    async def _watch_min_time(self, acker: str) -> None:
        """Trim grouping state as the min time advances; the stream ending is a failure (state would only grow)."""
        async for mt in self.streams.watch_min_time(acker):
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
                await self._send(tick.workers[worker], transport.EXCHANGE, outs, envelope_time, acks)
            by_barrier: dict[str, list[Item]] = {}
            for item in to_barrier:
                by_barrier.setdefault(tick.barrier_of(item[1].front), []).append(item)
            for address, items in by_barrier.items():
                await self._send(address, transport.DELIVER, codec.to_records(items), item_time, acks)
        await self.streams.write(tick.acker, transport.ACK, pb.AckBatch(acks=codec.ack_messages(acks)))

    async def _send(self, address: str, method: str, entries: list[Any], gt_of: Callable[[Any], GlobalTime],
                    acks: dict[GlobalTime, int]) -> None:
        """Ship ``entries`` in messages of at most ``batch_items``, each with fresh send acks folded into ``acks``."""
        for start in range(0, len(entries), self.batch_items):
            chunk = entries[start:start + self.batch_items]
            sent = codec.new_acks({gt_of(e) for e in chunk})
            codec.xor_into(acks, sent)
            await self.streams.write(address, method, codec.encode_batch(chunk, sent, self.index))


class WorkerRole:
    """Worker ``index`` as a role of a node (see ``flamestream.runtime.node``)."""

    kind = "worker"

    def __init__(self, index: int, batch_items: int = 256, linger_ms: float = 0.0) -> None:
        self.index = index
        self.name = f"worker{index}"
        self._options = (batch_items, linger_ms)
        self.service: WorkerService | None = None

    def info(self) -> dict[str, Any]:
        return {"index": self.index}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        self.service = WorkerService(self.index, local, *self._options)
        rpc.add_WorkerServicer_to_server(self.service, server)
        local.streams[transport.EXCHANGE] = self.service.Exchange

    def start(self, supervisor: Supervisor) -> None:
        assert self.service is not None
        self.service.supervisor = supervisor
        # A worker that cannot process cannot go on: it would hold the min time forever.
        supervisor.spawn(self.name, "processing loop", self.service.run(), essential=True)

    async def deploy(self, tick: Tick) -> None:
        assert self.service is not None
        await self.service.apply_tick(tick)

    async def close(self) -> None:
        assert self.service is not None
        await self.service.streams.close()
