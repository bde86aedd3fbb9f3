"""Worker servicer and its processing loop (see the package docstring for the protocol).

Ticks and state.  A worker runs one *deployment* per tick it takes part in:
the tick's compiled graph (its core), the streams to the tick's members, and
whether its state is there yet.  Normally there is one.  During a hand-over
(a new tick that takes over the previous one's state at its start time T)
there are two: the previous one processes what is below T, the new one what
is at or after T — envelopes go to the deployment whose interval holds their
global time.  Once the acker's min time reaches T nothing below T is left
anywhere, so the previous deployment writes its grouping state below T as a
snapshot file, registers it in ZooKeeper and retires; the new deployment
waits until every worker of the previous tick registered (the snapshot is
complete), loads the files, keeps the keys its hash range owns, and only then
processes the envelopes it held back.  Between hand-overs, every worker writes
a snapshot each time the min time passes a multiple of the snapshot interval
(``--snapshot-interval-ms``): the same file and registration, which recovery
and replay start from; the last ``--snapshot-retention`` complete ones are kept.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from flamestream.cluster import ClusterStore
from flamestream.core.graph import Graph
from flamestream.core.hashing import INT32_MIN
from flamestream.core.item import Envelope, Item, envelope_meta, envelope_time, item_time
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Tick
from flamestream.core.worker import Worker, WorkerState, merge_states
from flamestream.runtime.channels import Channels, LocalEndpoints
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.storage.snapshots import (
    boundary_name,
    boundary_of,
    read_snapshot,
    snapshot_dir,
    snapshot_path,
    write_snapshot,
)
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc

Acks = dict[GlobalTime, int]

LOAD_SHIFT = 24
LOAD_BUCKETS = 1 << (32 - LOAD_SHIFT)
"""Hash buckets of the load statistics (256): the int32 space in equal slices, the grain of a rebalanced layout."""
LOAD_REPORT_EVERY = 2.0
"""Seconds between load reports to ZooKeeper (only when something changed)."""

SNAPSHOT_POLL = 0.05
"""Seconds between looks at ZooKeeper while a new tick waits for its previous tick's snapshot to complete."""
SNAPSHOT_WAIT_WARNING = 10.0
"""Seconds of such waiting between warnings in the log."""


class _Deployment:
    """One tick on this worker: its core, its streams, and the envelopes waiting for its state."""

    def __init__(self, tick: Tick, core: Worker, local: LocalEndpoints) -> None:
        self.tick = tick
        self.core = core
        self.streams = Channels(local)
        self.restored = asyncio.Event()
        """Set once the state it takes over is loaded (at once for a tick that starts empty)."""
        self.waiting: list[tuple[list[Envelope], Acks]] = []
        """Envelopes (with their receipt acks) that arrived before the state did."""
        self.snapshotted = tick.start
        """The newest boundary this deployment wrote a snapshot below (its start: nothing below it is its own)."""
        if tick.previous is None:
            self.restored.set()


class WorkerService(rpc.WorkerServicer):
    def __init__(self, index: int, local: LocalEndpoints, store: ClusterStore | None = None,
                 data_dir: Path | None = None, batch_items: int = 256, linger_ms: float = 0.0,
                 snapshot_interval_ms: int = 1000, snapshot_retention: int = 2) -> None:
        self.index = index
        self.name = f"worker{index}"
        self.local = local
        self.store = store
        self.data_dir = data_dir
        self.log = role_logger(self.name)
        self.batch_items = batch_items
        self.linger = linger_ms / 1000
        self.snapshot_interval = snapshot_interval_ms if data_dir is not None and store is not None else 0
        self.snapshot_retention = snapshot_retention
        self.inbox: asyncio.Queue[pb.ItemBatch] = asyncio.Queue()
        self.load = [0] * LOAD_BUCKETS
        """Items processed per hash bucket (envelopes with a hash), for ``deploy --rebalance``."""
        self.current: _Deployment | None = None
        self.previous: _Deployment | None = None
        """The tick handing its state over to ``current``, until its snapshot below ``handover_at`` is written."""
        self.handover_at: GlobalTime | None = None
        """The start of the tick ``previous`` hands over to (``current``'s, unless this worker left that tick)."""
        self.ready = asyncio.Event()
        self.lock = asyncio.Lock()
        """Serialises processing steps and tick changes: a step never writes to streams being closed."""
        self._acker = ""
        self._watch = Channels(local)
        self._min_time_task: asyncio.Task[None] | None = None
        self._writing: asyncio.Task[None] | None = None
        self.supervisor: Supervisor | None = None

    async def close(self) -> None:
        """End every stream of every deployment (bounded waits), so nothing written is cancelled in flight."""
        for deployment in (self.previous, self.current):
            if deployment is not None:
                await deployment.streams.close()
        await self._watch.close()

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        # Batches may arrive before this worker has seen the tick (a front saw it first): they wait in the inbox.
        async for batch in request_iterator:
            self.inbox.put_nowait(batch)
        return pb.Empty()

    # -- ticks -------------------------------------------------------------------------------------------------

    async def apply_tick(self, tick: Tick) -> None:
        async with self.lock:
            await self._apply_tick(tick)

    async def _apply_tick(self, tick: Tick) -> None:
        assert self.supervisor is not None, "start() comes before the first tick"
        member = self.index < len(tick.workers)
        core = Worker(compile_graph(Graph.from_dict(tick.graph)), self.index, tick.layout) if member else None
        handover = tick.previous is not None and self.current is not None and \
            self.current.tick.number == tick.previous
        if handover:
            if self.previous is not None:
                raise RuntimeError(f"tick {tick.number} takes over tick {tick.previous} while tick "
                                   f"{self.previous.tick.number} is still handing over")
            if self.data_dir is None or self.store is None:
                raise RuntimeError(f"tick {tick.number} hands state over, but this worker has no --data-dir")
            self.previous, self.handover_at = self.current, tick.start
        else:  # a fresh start: what the old tick held is dropped (deploy said so)
            for old in (self.previous, self.current):
                if old is not None:
                    await old.streams.close()
            self.previous = self.handover_at = None
        self.current = _Deployment(tick, core, self.local) if core is not None else None
        if self.current is None:
            self.log.info("not part of tick %d (%d workers)%s", tick.number, len(tick.workers),
                          "; finishing the previous tick first" if handover else "")
        elif tick.previous is not None:
            self.supervisor.spawn(self.name, f"state of tick {tick.number}", self._restore(self.current), finite=True)
        if tick.acker != self._acker:
            if self._min_time_task is not None:
                self._min_time_task.cancel()
            await self._watch.close()
            self._watch, self._acker = Channels(self.local), tick.acker
            self._min_time_task = self.supervisor.spawn(self.name, f"min-time watch of tick {tick.number}",
                                                        self._watch_min_time(tick.acker))
        self.ready.set()

    async def _restore(self, deployment: _Deployment) -> None:
        """Load the previous tick's complete snapshot below this tick's start, then run what waited for it."""
        assert self.store is not None and deployment.tick.previous is not None
        tick, previous = deployment.tick, deployment.tick.previous
        data = await asyncio.to_thread(self.store.tick, previous)
        if data is None:
            raise RuntimeError(f"tick {tick.number} takes over tick {previous}, which does not exist")
        workers = len(data["workers"])
        boundary = boundary_name(tick.start)
        started = time.monotonic()
        warn_at = started + SNAPSHOT_WAIT_WARNING
        while True:
            registered = (await asyncio.to_thread(self.store.snapshots, previous)).get(boundary, {})
            if len(registered) >= workers:
                break
            await asyncio.sleep(SNAPSHOT_POLL)
            if time.monotonic() >= warn_at:
                warn_at += SNAPSHOT_WAIT_WARNING
                self.log.warning("tick %d still waits for the snapshot of tick %d below %s: %d of %d workers",
                                 tick.number, previous, boundary, len(registered), workers)
        waited = time.monotonic() - started
        paths = [Path(str(info["path"])) for info in registered.values()]
        states = await asyncio.to_thread(lambda: [read_snapshot(path)[1] for path in paths])
        async with self.lock:
            deployment.core.restore(merge_states(states))
            deployment.restored.set()
            self.log.info("tick %d took over the state of tick %d below %s (%d files, waited %.2fs)",
                          tick.number, previous, boundary, len(paths), waited)
            waiting, deployment.waiting = deployment.waiting, []
            for envelopes, acks in waiting:
                await self._process(deployment, envelopes, acks)

    # -- min time: trimming, snapshots, hand-over --------------------------------------------------------------

    async def _watch_min_time(self, acker: str) -> None:
        """Trim grouping state as the min time advances; the stream ending is a failure (state would only grow)."""
        async for mt in self._watch.watch_min_time(acker):
            await self._on_min_time(GlobalTime(mt.ts, mt.front))

    async def _on_min_time(self, min_time: GlobalTime) -> None:
        previous, current, end = self.previous, self.current, self.handover_at
        if previous is not None and end is not None:
            if min_time >= end:
                # Nothing below the boundary is left anywhere: hand the state below it over, then retire.
                self.previous = self.handover_at = None
                state = previous.core.snapshot(end)
                await self._write(previous, end, state)
                await previous.streams.close()
            else:
                previous.core.on_min_time(min_time)
        if current is not None and current.restored.is_set():
            boundary = self._boundary(min_time)
            if boundary is not None and boundary > current.snapshotted and (
                    self._writing is None or self._writing.done()):
                current.snapshotted = boundary
                state = current.core.snapshot(boundary)
                assert self.supervisor is not None
                self._writing = self.supervisor.spawn(self.name, f"snapshot below {boundary_name(boundary)}",
                                                      self._write(current, boundary, state), finite=True)
            current.core.on_min_time(min_time)

    def _boundary(self, min_time: GlobalTime) -> GlobalTime | None:
        """The newest periodic snapshot boundary the min time reached (boundaries are (k * interval, 0))."""
        if not self.snapshot_interval:
            return None
        return GlobalTime(min_time.ts // self.snapshot_interval * self.snapshot_interval, 0)

    async def _write(self, deployment: _Deployment, boundary: GlobalTime, state: WorkerState) -> None:
        """Write and register this worker's snapshot of ``deployment`` below ``boundary``; then retention."""
        assert self.store is not None and self.data_dir is not None
        tick = deployment.tick.number
        path = snapshot_path(self.data_dir, boundary, self.index)
        info = await asyncio.to_thread(write_snapshot, path, state, boundary=boundary, worker=self.index, tick=tick)
        await asyncio.to_thread(self.store.register_snapshot, tick, boundary_name(boundary), self.index,
                                {"path": str(path.resolve()), "sha256": info.sha256, "keys": info.keys,
                                 "items": info.items, "bytes": info.body_bytes})
        self.log.debug("snapshot of tick %d below %s: %d keys, %d items, %d bytes", tick, boundary_name(boundary),
                       info.keys, info.items, info.body_bytes)
        await asyncio.to_thread(self._retain, deployment.tick)

    def _retain(self, tick: Tick) -> None:
        """Keep the newest ``snapshot_retention`` complete snapshots of ``tick``; drop what is older, and once
        ``tick`` has that many, every snapshot of the tick it took over (which it no longer needs)."""
        assert self.store is not None and self.data_dir is not None
        snapshots = self.store.snapshots(tick.number)
        complete = sorted((boundary_of(b) for b, workers in snapshots.items() if len(workers) >= len(tick.workers)))
        if len(complete) < self.snapshot_retention:
            return
        oldest_kept = complete[-self.snapshot_retention]
        doomed = [(tick.number, b) for b in snapshots if boundary_of(b) < oldest_kept]
        if tick.previous is not None:
            doomed += [(tick.previous, b) for b in self.store.snapshots(tick.previous)]
        for number, boundary in doomed:
            shutil.rmtree(snapshot_dir(self.data_dir, boundary_of(boundary)), ignore_errors=True)
            self.store.forget_snapshot(number, boundary)

    # -- processing --------------------------------------------------------------------------------------------

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
        acks: Acks = {}
        envelopes: list[Envelope] = []
        for batch in batches:
            entries, received = codec.decode_batch(batch)
            envelopes.extend(entries)
            codec.xor_into(acks, received)
        if len(batches) > 1:
            envelopes.sort(key=envelope_meta)
        previous, current = self.previous, self.current
        if previous is None or current is None:
            deployment = current or previous
            assert deployment is not None, "a step runs only after the first tick"
            await self._take(deployment, envelopes, acks)
            return
        # A hand-over is under way: what is below the new tick's start is the previous tick's.
        start = current.tick.start
        await self._take(previous, [e for e in envelopes if e[2][1] < start],
                         {gt: v for gt, v in acks.items() if gt < start})
        await self._take(current, [e for e in envelopes if e[2][1] >= start],
                         {gt: v for gt, v in acks.items() if gt >= start})

    async def _take(self, deployment: _Deployment, envelopes: list[Envelope], acks: Acks) -> None:
        if not envelopes and not acks:
            return
        if deployment.restored.is_set():
            await self._process(deployment, envelopes, acks)
        else:
            deployment.waiting.append((envelopes, acks))

    async def report_load(self) -> None:
        """Publish the load statistics every few seconds, when they changed."""
        assert self.store is not None
        reported: list[int] = []
        while True:
            await asyncio.sleep(LOAD_REPORT_EVERY)
            if self.load != reported:
                reported = list(self.load)
                await asyncio.to_thread(self.store.report_load, self.index, reported)

    async def _process(self, deployment: _Deployment, envelopes: list[Envelope], acks: Acks) -> None:
        tick = deployment.tick
        load = self.load
        for _op, h, _item in envelopes:
            if h is not None:
                load[(h - INT32_MIN) >> LOAD_SHIFT] += 1
        # Outputs leave in pieces while the core runs on (see Worker.run); the receipt acks go last, once
        # every output's send ack is folded in, so the acker never sees this step's items as done early.
        for remote, to_barrier in deployment.core.run(envelopes, self.batch_items):
            for worker, outs in remote.items():
                await self._send(deployment, tick.workers[worker], transport.EXCHANGE, outs, envelope_time, acks)
            by_barrier: dict[str, list[Item]] = {}
            for item in to_barrier:
                by_barrier.setdefault(tick.barrier_of(item[1].front), []).append(item)
            for address, items in by_barrier.items():
                await self._send(deployment, address, transport.DELIVER, codec.to_records(items), item_time, acks)
        await deployment.streams.write(tick.acker, transport.ACK, pb.AckBatch(acks=codec.ack_messages(acks)))

    async def _send(self, deployment: _Deployment, address: str, method: str, entries: list[Any],
                    gt_of: Callable[[Any], GlobalTime], acks: Acks) -> None:
        """Ship ``entries`` in messages of at most ``batch_items``, each with fresh send acks folded into ``acks``."""
        for start in range(0, len(entries), self.batch_items):
            chunk = entries[start:start + self.batch_items]
            sent = codec.new_acks({gt_of(e) for e in chunk})
            codec.xor_into(acks, sent)
            await deployment.streams.write(address, method, codec.encode_batch(chunk, sent, self.index))


class WorkerRole:
    """Worker ``index`` as a role of a node (see ``flamestream.runtime.node``)."""

    kind = "worker"

    def __init__(self, index: int, store: ClusterStore | None = None, data_dir: Path | None = None, *,
                 batch_items: int = 256, linger_ms: float = 0.0, snapshot_interval_ms: int = 1000,
                 snapshot_retention: int = 2) -> None:
        self.index = index
        self.name = f"worker{index}"
        self._store, self._data_dir = store, data_dir
        self._options = (batch_items, linger_ms, snapshot_interval_ms, snapshot_retention)
        self.service: WorkerService | None = None

    def info(self) -> dict[str, Any]:
        return {"index": self.index}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        self.service = WorkerService(self.index, local, self._store, self._data_dir, *self._options)
        rpc.add_WorkerServicer_to_server(self.service, server)
        local.streams[transport.EXCHANGE] = self.service.Exchange

    def start(self, supervisor: Supervisor) -> None:
        assert self.service is not None
        self.service.supervisor = supervisor
        # A worker that cannot process cannot go on: it would hold the min time forever.
        supervisor.spawn(self.name, "processing loop", self.service.run(), essential=True)
        if self._store is not None:
            supervisor.spawn(self.name, "load reports", self.service.report_load())

    async def deploy(self, tick: Tick) -> None:
        assert self.service is not None
        await self.service.apply_tick(tick)

    async def close(self) -> None:
        assert self.service is not None
        await self.service.close()
