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
import contextlib
import functools
import operator
import shutil
import time
from collections.abc import Callable
from itertools import compress, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn

import grpc
import psutil

from flamestream.cluster import ClusterStore, complete_boundaries
from flamestream.core.dead_letter import dead_letter
from flamestream.core.graph import Graph
from flamestream.core.hashing import INT32_MIN
from flamestream.core.item import Envelope, Item, envelope_meta, envelope_time, item_time
from flamestream.core.limits import over_memory_budget
from flamestream.core.meta import GlobalTime, boundary_name, boundary_of
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.core.worker import Worker, WorkerState, front_envelopes, merge_states
from flamestream.runtime.channels import Channels, LocalEndpoints, LocalItems
from flamestream.runtime.heap import loading_state
from flamestream.runtime.hosting import StreamBroken
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.runtime.tick_gate import TICK_WAIT
from flamestream.storage.input_log import read_input_range
from flamestream.storage.log import LogError
from flamestream.storage.snapshots import (
    Frozen,
    SnapshotError,
    SnapshotImage,
    SnapshotInfo,
    base_path,
    read_snapshot,
    read_snapshot_frozen,
    read_snapshot_header,
    snapshot_dir,
    snapshot_path,
    write_snapshot,
)
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.workers import pacing

Acks = dict[GlobalTime, int]

LOAD_SHIFT = 24
LOAD_BUCKETS = 1 << (32 - LOAD_SHIFT)
"""Hash buckets of the load statistics (256): the int32 space in equal slices, the grain of a rebalanced layout."""
LOAD_REPORT_EVERY = 2.0
"""Seconds between load reports to ZooKeeper (only when something changed)."""
MEMORY_CHECK_EVERY = 1.0
"""Seconds between looks at the process's memory against ``--memory-budget-mb``."""

SNAPSHOT_CPU_SHARE = 0.1
"""Default ``--snapshot-cpu-share``: the share of CPU periodic snapshots may take (see ``snapshot_stride``)."""
MAX_SNAPSHOT_STRIDE = 2
"""Default ``--snapshot-max-stride``: at most every this many boundaries a periodic snapshot is taken, whatever it
costs (a power of two, so the strides of workers meet).  Why a cap at all: a recovery replays the
input since the last complete one, and the records pushed meanwhile wait behind that backlog.  In 10-minute chaos
runs of the inverted index (README "Chaos") a cap of 8 left records away from faults 3.7 times slower at p99 than
without faults, a cap of 4 1.1 times.  Once snapshots cost less to write (format 4), a cap of 2 halved the
backlogs (median 3.1 -> 1.5 s of input) and the recovery p50 went from 2.1 to 1.8 s, the max from 4.7 to 2.7 s, for
about twice the snapshot CPU late in the run (0.22-0.24 s every 2 s against 0.2-0.34 s every 4 s), and the
fault-free twins' p50 / p99 were 117.5 / 813 ms against 98.4 / 695 ms: 4 is the cheaper choice for a cluster
that values steady latency over recovery time."""

TRIM_DELAY = 0.001
"""Seconds a worker waits before acting on a min time (trimming, snapshots, a hand-over) that comes after a quiet
spell at least this long.

Why: on a node that also hosts the barrier, the min time that lets the
barrier release records also wakes this worker, and the task of the
subscription that sends those records to their consumer was woken behind it:
the trim ran first, and held every release 0.18 ms (median; inverted index at 2
pages/s, traced per page).  Nothing waits for a trim, and a millisecond later
the subscription has gone.  Only after a quiet spell: min times that come
closer together are acted on at once, so a watch whose messages queue up
(a remote acker's stream under load) never falls behind by waiting."""

SNAPSHOT_POLL = 0.05
"""Seconds between looks at ZooKeeper while a new tick waits for its previous tick's snapshot to complete."""
SNAPSHOT_WAIT_WARNING = 10.0
"""Seconds of such waiting between warnings in the log."""

TICK_POLL = 0.05
"""Seconds between looks for that newer tick."""


CATCH_UP_CHUNK = 256
"""Events a fallback hand-over re-processes at once; the grouping state is trimmed between chunks."""


def _catch_up(graph: dict[str, Any], state: WorkerState, start: GlobalTime, stop: GlobalTime,
              data_dir: Path) -> tuple[WorkerState, int]:
    """The state below ``stop`` from the state below ``start`` and the logged events in [start, stop); and how
    many events that took.

    One worker core over the whole hash space, fed in (global time, trace)
    order: depth-first in meta order is the sequential oracle's order, so it
    replays nothing and ends with the state the tick's workers had.  Every
    output is dropped (the old tick released it).  Events the entry balancing
    function refuses were refused at the front too, and never logged.
    """
    plan = compile_graph(Graph.from_dict(graph))
    whole = Layout.even(1)
    core = Worker(plan, 0, whole)
    core.restore(state)
    events = read_input_range(data_dir, start, stop)
    for first in range(0, len(events), CATCH_UP_CHUNK):
        inputs = []
        for _front, gt, trace, payload in events[first:first + CATCH_UP_CHUNK]:
            try:
                h = plan.entry_balance(payload)
            except Exception:  # business logic: the front refused the same event
                continue
            inputs.append((h, (payload, gt, trace, False)))
        for envelopes in front_envelopes(plan, whole, inputs).values():
            for _outbox in core.run(envelopes):
                pass
        if first + CATCH_UP_CHUNK < len(events):
            core.on_min_time(events[first + CATCH_UP_CHUNK][1])  # everything before it is done
    return core.snapshot(stop), len(events)


def _needed(data_dir: Path, kept: list[GlobalTime]) -> set[Path]:
    """The files of the ``kept`` snapshots in ``data_dir`` (every worker's there, on a shared disk) and every file
    they build on: their chains of bases (``SnapshotInfo.base``), read from the headers.  SnapshotError if a header
    on the way does not read: damaged for good or only for a moment (a file descriptor short), what it builds on is
    not known, and nothing may go this round."""
    needed: set[Path] = set()
    for boundary in kept:
        for path in snapshot_dir(data_dir, boundary).glob("worker-*.snap"):
            while path not in needed:
                needed.add(path)
                try:
                    base = read_snapshot_header(path).base
                except SnapshotError as exc:
                    if isinstance(exc.__cause__, FileNotFoundError):
                        break  # gone for good (an older round took it): nothing is left to keep for it
                    raise
                if base is None:
                    break
                path = base_path(path, base)
    return needed


def _prune(directory: Path, needed: set[Path]) -> None:
    """Remove the snapshot directory ``directory``, or, if a ``needed`` file is in it, everything else in it."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return
    if not any(entry in needed for entry in entries):
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in entries:
        if entry not in needed:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _write_image(image: SnapshotImage, spent: list[float], path: Path, *, boundary: GlobalTime, worker: int,
                 tick: int) -> SnapshotInfo:
    """Write ``image`` in the writer's thread; the thread's CPU seconds for it are appended to ``spent``."""
    started = time.thread_time()
    info = image.write(path, boundary=boundary, worker=worker, tick=tick)
    spent.append(time.thread_time() - started)
    return info


def snapshot_stride(cpu: float, interval: float, share: float, current: int, cap: int = MAX_SNAPSHOT_STRIDE) -> int:
    """Every how many snapshot boundaries (``interval`` seconds apart) to take a periodic snapshot, now that the
    last one, taken at stride ``current``, cost ``cpu`` seconds: the smallest power of two that keeps snapshots
    within ``share`` of the CPU, at most ``cap``.  Lowered only as far as twice the cost would
    still fit: a snapshot's cost hardly shrinks with the stride (the same keys change, and every few snapshots the
    file is whole again), and without that margin the stride flipped between 4 and 8 (then the cap) at every
    snapshot.

    Why: every few snapshots a file is the whole state (``SnapshotImage.write``), and what changed in a second
    is encoded again whole per key: an inverted index's posting lists grow
    with its input, and seven minutes into a run at 20 pages/s snapshots
    every second took 43 % of a worker's node, holding the interpreter
    lock while they pickled, so every record waited.  A power of two, because
    a snapshot is complete only where every worker took one: workers that
    chose different strides still meet at the multiples of the largest.
    """
    def fitting(cost: float) -> int:
        stride = 1
        while stride < cap and cost > share * interval * stride:
            stride *= 2
        return stride

    stride = fitting(cpu)
    return stride if stride >= current else min(current, fitting(2 * cpu))


def _meets(layout: Layout, member: str, lo: int, hi: int) -> bool:
    """Whether the hash range of ``member`` (``worker<i>``) in ``layout`` meets ``lo .. hi``."""
    first, last = layout.range_of(int(member.removeprefix("worker")))
    return first <= hi and lo <= last


class _Deployment:
    """One tick on this worker: its core, its streams, and the envelopes waiting for its state."""

    def __init__(self, tick: Tick, core: Worker, local: LocalEndpoints,
                 on_broken: Callable[[StreamBroken], None]) -> None:
        self.tick = tick
        self.core = core
        self.streams = Channels(local, on_broken)
        self.restored = asyncio.Event()
        """Set once the state it takes over is loaded (at once for a tick that starts empty)."""
        self.waiting: list[tuple[list[Envelope], Acks]] = []
        """Envelopes (with their receipt acks) that arrived before the state did."""
        self.snapshotted = tick.start
        """The newest boundary this deployment wrote a snapshot below (its start: nothing below it is its own)."""
        self.trimmed = tick.start
        """The min time its state was last trimmed at: a snapshot below an older boundary could miss items."""
        self.image: SnapshotImage | None = SnapshotImage()
        """Its state at its last periodic snapshot, encoded (only changed buckets are encoded again); None after
        a write failed."""
        if tick.previous is None:
            self.restored.set()

    def warm(self) -> None:
        """Connect every stream the tick may write to (``Channels.warm``): its acker, the barriers' addresses and
        the other workers.  Declared here, on the event loop, rather than when the tick is deployed: a restart
        replays every tick, and only the latest is warmed."""
        self.streams.stream(self.tick.acker, transport.ACK)
        for _partition, address in self.tick.barriers:  # a barrier owning several partitions: one stream
            self.streams.stream(address, transport.DELIVER)
        for address in self.tick.workers:
            self.streams.stream(address, transport.EXCHANGE)
        self.streams.warm()


class WorkerService(rpc.WorkerServicer):
    def __init__(self, index: int, local: LocalEndpoints, store: ClusterStore | None = None,
                 data_dir: Path | None = None, batch_items: int = 256, linger_ms: float = 0.0,
                 snapshot_interval_ms: int = 1000, snapshot_retention: int = 2, memory_budget_mb: int = 0,
                 snapshot_cpu_share: float = SNAPSHOT_CPU_SHARE,
                 snapshot_max_stride: int = MAX_SNAPSHOT_STRIDE) -> None:
        self.index = index
        self.name = f"worker{index}"
        self.local = local
        self.memory_budget = memory_budget_mb << 20
        self.store = store
        self.data_dir = data_dir
        self.log = role_logger(self.name)
        self.batch_items = batch_items
        self.linger = linger_ms / 1000
        self.snapshot_interval = snapshot_interval_ms if data_dir is not None and store is not None else 0
        self.snapshot_retention = snapshot_retention
        self.snapshot_cpu_share = snapshot_cpu_share
        self.snapshot_max_stride = snapshot_max_stride
        self.snapshot_stride = 1
        """Periodic snapshots are taken below boundaries ``k * snapshot_interval`` with ``k`` a multiple of this
        (a power of two, see ``snapshot_stride``)."""
        self.inbox: asyncio.Queue[_Inbound] = asyncio.Queue()
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
        self._swept_ticks = 0
        """Ticks below this number have had their snapshots deleted by ``_retain`` (none are written any more)."""
        self._complete_seen: tuple[int, dict[str, dict[str, None]]] = (-1, {})
        """The tick and its complete snapshots (boundary -> registrants) ``_retain`` saw last, which it need not
        list again: a complete snapshot's registrations do not change until it is forgotten."""
        self.supervisor: Supervisor | None = None

    async def close(self) -> None:
        """End every stream of every deployment (bounded waits), so nothing written is cancelled in flight."""
        for deployment in (self.previous, self.current):
            if deployment is not None:
                await deployment.streams.close()
        await self._watch.close()

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        """Decode and check every batch here, where its stream can still be told: a batch that failed later, in
        the processing loop, would stop the node (and its call would have returned long before).  A refused
        batch ends its own call with INVALID_ARGUMENT; nothing of it is taken, other streams go on."""
        async for batch in request_iterator:
            try:
                envelopes, acks = codec.decode_envelopes(batch)
            except codec.BatchError as exc:
                await self._refuse(context, batch, str(exc))
            # Checking against the graph needs a tick: a batch may arrive before this worker has seen it (a front
            # saw it first), and then its stream waits here.
            problem = await self._refusal(envelopes)
            if problem is not None:
                await self._refuse(context, batch, problem)
            self.inbox.put_nowait((envelopes, acks, (self.previous, self.current)))
        return pb.Empty()

    async def _refusal(self, envelopes: list[Envelope]) -> str | None:
        """Why ``envelopes`` cannot be processed by the deployments they belong to (see ``step``), or None.

        Envelopes that fit none of the ticks this worker knows but are not below
        its newest tick's start may belong to a tick it has not taken up yet (a
        front saw it first, and stamps for it): those wait up to ``TICK_WAIT``
        for a newer tick before they are refused.
        """
        await self.ready.wait()
        deadline: float | None = None
        while True:
            problem = _misfit(self._placed(envelopes))
            current = self.current
            if problem is None or (current is not None and all(e[2][1] < current.tick.start for e in envelopes)):
                return problem
            now = time.monotonic()
            if deadline is None:
                deadline = now + TICK_WAIT
            elif now >= deadline:
                return f"{problem} (no newer tick came within {TICK_WAIT:g}s)"
            known = (self.previous, current)
            while (self.previous, self.current) == known and time.monotonic() < deadline:
                await asyncio.sleep(TICK_POLL)

    def _placed(self, envelopes: list[Envelope]) -> list[tuple[_Deployment | None, list[Envelope]]]:
        """``envelopes`` split by the deployment that takes them, as ``step`` splits them."""
        previous, current = self.previous, self.current
        if previous is None or current is None:
            return [(current or previous, envelopes)]
        start = current.tick.start
        return [(previous, [e for e in envelopes if e[2][1] < start]),
                (current, [e for e in envelopes if e[2][1] >= start])]

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], batch: pb.ItemBatch,
                      problem: str) -> NoReturn:
        self.log.warning("refused a batch of %d bytes from %s (sender %d): %s", len(batch.items),
                         _caller(context), batch.sender, problem)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name} refused the batch: {problem}")

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
        self.current = _Deployment(tick, core, self.local, functools.partial(
            self.supervisor.stream_broke, self.name, f"a stream of tick {tick.number}")) if core is not None else None
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

    def warm(self) -> None:
        """Connect the current tick's streams (``Channels.warm``)."""
        if self.current is not None:
            self.current.warm()

    async def _restore(self, deployment: _Deployment) -> None:
        """Load the previous tick's complete snapshot below this tick's start, then run what waited for it.

        If a file of that snapshot is damaged (``read_snapshot`` names it and
        why), the hand-over falls back to the previous tick's next older
        complete snapshot below T' and rebuilds the state below T from it (see
        ``_handed_over``); only if no retained snapshot works does it fail —
        loudly, and without ever processing anything on a state it does not
        know to be right (the tick's envelopes keep waiting).
        """
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
            complete = await asyncio.to_thread(self.store.complete_snapshots, previous, workers)
            if boundary in complete:
                break
            await asyncio.sleep(SNAPSHOT_POLL)
            if time.monotonic() >= warn_at:
                warn_at += SNAPSHOT_WAIT_WARNING
                registered = (await asyncio.to_thread(self.store.snapshots, previous)).get(boundary, {})
                self.log.warning("tick %d still waits for the snapshot of tick %d below %s: %d of %d workers",
                                 tick.number, previous, boundary, len(registered), workers)
        waited = time.monotonic() - started
        files, source = await asyncio.to_thread(self._take_over, deployment, previous, data, complete)
        async with self.lock:
            deployment.restored.set()
            self.log.info("tick %d took over the state of tick %d below %s (%d files%s, waited %.2fs, loaded in "
                          "%.2fs)", tick.number, previous, boundary, files, source, waited,
                          time.monotonic() - started - waited)
            waiting, deployment.waiting = deployment.waiting, []
            for envelopes, acks in waiting:
                await self._process(deployment, envelopes, acks)

    def _take_over(self, deployment: _Deployment, previous: int, data: dict[str, Any],
                   complete: list[str]) -> tuple[int, str]:
        """Load ``deployment``'s state (``_handed_over``) into its core and its snapshot image; (files read, how
        the state was obtained).  In a thread, so the event loop runs on (a hand-over's previous tick, health
        checks); nothing else touches the deployment's core before it is restored.

        Straight from a snapshot, the core takes its buckets over lazily and
        the image holds them as read: neither decodes nor encodes them until
        they change.  Rebuilt state is restored whole, and the image starts
        as all of it.
        """
        image = deployment.image
        assert image is not None
        with loading_state():
            state, frozen, files, source = self._handed_over(deployment.tick, previous, data, complete)
            deployment.core.restore(state)
            for name, buckets in frozen.items():
                for bucket in buckets:
                    if deployment.core.restore_lazily(name, bucket.h, bucket.key, bucket.entries):
                        image.adopt(name, bucket)
            image.update(deployment.core.snapshot_changes(deployment.tick.start))
        return files, source

    def _handed_over(self, tick: Tick, previous: int, data: dict[str, Any],
                     complete: list[str]) -> tuple[WorkerState, Frozen, int, str]:
        """The state of tick ``previous`` below ``tick.start`` T that this worker needs: (state, the buckets of
        the files it came straight from, files read, how it was obtained); one of the first two is empty.

        The snapshot below T itself, if all its files are intact: its buckets
        as the files hold them, for ``Grouping.restore_lazily``.  Otherwise
        the newest older complete snapshot T' < T of ``previous`` whose files
        are, plus the events of [T', T) re-processed from the fronts' input
        logs with ``previous``'s graph (``_catch_up``): the model is
        deterministic, so that is exactly the state the old workers had below
        T.  Their outputs were released by the old tick already and are
        dropped.  The input retention keeps every event from the oldest
        retained complete snapshot on, so retention >= 2 leaves one fallback.

        Straight from the snapshot below T it reads only the files of the old
        workers whose hash ranges meet its own (a recovery keeps the layout: one
        file, where every worker once decoded every file — 88 MB, 2 s, on an
        inverted index of 6,000 pages); rebuilding from an older one re-runs the
        whole graph, whose items cross ranges, so that reads them all.
        """
        assert self.store is not None
        registered = self.store.snapshots(previous)
        old, (lo, hi) = Layout(tuple(int(s) for s in data["layout"])), tick.layout.range_of(self.index)
        failures: list[str] = []
        candidates = [name for name in reversed(complete) if boundary_of(name) <= tick.start]
        for name in candidates:
            infos = registered.get(name)
            if infos is None:
                failures.append(f"{name}: no longer registered (retention)")
                continue
            at = boundary_of(name)
            files = sorted(infos.items())
            try:
                if at == tick.start:
                    mine = [info for member, info in files if _meets(old, member, lo, hi)]
                    frozen: Frozen = {}
                    for info in mine:
                        for grouping, buckets in read_snapshot_frozen(Path(str(info["path"])))[1].items():
                            frozen.setdefault(grouping, []).extend(buckets)
                    return {}, frozen, len(mine), ""
                states = [read_snapshot(Path(str(info["path"])))[1] for _member, info in files]
            except SnapshotError as exc:
                self.log.warning("cannot take over the state of tick %d from its snapshot below %s: %s", previous,
                                 name, exc)
                failures.append(str(exc))
                continue
            try:
                state, events = _catch_up(data["graph"], merge_states(states), at, tick.start,
                                          self._data_dir_or_fail())
            except LogError as exc:
                self.log.warning("cannot rebuild the state of tick %d below %s from its snapshot below %s: %s",
                                 previous, boundary_name(tick.start), name, exc)
                failures.append(f"{name}: {exc}")
                continue
            self.log.warning("tick %d takes over the state of tick %d below %s from its older snapshot below %s and "
                             "%d events re-processed from the input log", tick.number, previous,
                             boundary_name(tick.start), name, events)
            return state, {}, len(states), f" via the older snapshot below {name} + {events} events"
        raise RuntimeError(
            f"tick {tick.number} cannot take over the state of tick {previous} below {boundary_name(tick.start)}: "
            f"no retained complete snapshot is intact and usable ({'; '.join(failures) or 'none'}); it processes "
            "nothing rather than start from a wrong state (redeploy with --drop-state to start empty)")

    def _data_dir_or_fail(self) -> Path:
        if self.data_dir is None:
            raise RuntimeError("a hand-over needs --data-dir")
        return self.data_dir

    # -- min time: trimming, snapshots, hand-over --------------------------------------------------------------

    async def _watch_min_time(self, acker: str) -> None:
        """Trim grouping state as the min time advances; the stream ending is a failure (state would only grow).
        The first min time is logged: from then on the stream is up, and its break is this node's exit."""
        first = True
        loop = asyncio.get_running_loop()
        acted = -TRIM_DELAY
        async for mt in self._watch.watch_min_time(acker):
            if first:
                first = False
                self.log.info("min times from the acker at %s: the first is %d.%d", acker, mt.ts, mt.front)
            if loop.time() - acted >= TRIM_DELAY:
                await asyncio.sleep(TRIM_DELAY)  # after a quiet spell: the releases of this min time go first
            await self._on_min_time(GlobalTime(mt.ts, mt.front))
            acted = loop.time()  # the spell is quiet from here: a min time that came meanwhile is acted on at once

    async def _on_min_time(self, min_time: GlobalTime) -> None:
        previous, current, end = self.previous, self.current, self.handover_at
        if previous is not None and end is not None:
            if min_time >= end:
                # Nothing below the boundary is left anywhere: retire, then hand the state below it over.  The
                # streams close first: the registered snapshot tells `scale` it may stop the nodes that leave,
                # and a stream still open to one would break, and the peer's probe restart this node.
                self.previous = self.handover_at = None
                state = previous.core.snapshot(end)
                await previous.streams.close()
                await self._write(previous, end, functools.partial(write_snapshot, state=state))
            else:
                previous.core.on_min_time(min_time)
        if current is not None and current.restored.is_set():
            boundary = self._boundary(min_time)
            # Only when the min time first passes a boundary (no trim passed it yet), on the stride, and not while
            # the previous snapshot is being written (that boundary is skipped; the changes wait for the next one).
            if boundary is not None and current.trimmed <= boundary and boundary > current.snapshotted and (
                    boundary.ts // self.snapshot_interval % self.snapshot_stride == 0) and (
                    self._writing is None or self._writing.done()):
                current.snapshotted = boundary
                started = time.thread_time()
                if current.image is None:  # the last write failed, perhaps halfway: rebuild from the whole state
                    current.image = SnapshotImage()
                    current.core.snapshot_changes(boundary)  # what it reports is in the whole state too
                    changes = current.core.snapshot(boundary)
                else:
                    changes = current.core.snapshot_changes(boundary)
                assert self.supervisor is not None
                self._writing = self.supervisor.spawn(
                    self.name, f"snapshot below {boundary_name(boundary)}",
                    self._periodic(current, boundary, changes, time.thread_time() - started), finite=True)
            current.core.on_min_time(min_time)
            current.trimmed = max(current.trimmed, min_time)

    def _boundary(self, min_time: GlobalTime) -> GlobalTime | None:
        """The newest periodic snapshot boundary the min time reached (boundaries are (k * interval, 0))."""
        if not self.snapshot_interval:
            return None
        return GlobalTime(min_time.ts // self.snapshot_interval * self.snapshot_interval, 0)

    async def _periodic(self, deployment: _Deployment, boundary: GlobalTime, changes: WorkerState,
                        cpu: float) -> None:
        """A periodic snapshot from the ``changes`` since the previous one (``cpu``: the seconds taking them
        cost the event loop).  If it fails (a full disk), the next one rebuilds the image from the whole state,
        and the worker is SERVING again once one succeeds.

        Paced (``pacing``): the changes are encoded into the image in slices
        of CPU, with pauses after each slice and each later step, over the
        first half of the time until the next snapshot at this stride.
        """
        image = deployment.image
        assert image is not None and self.supervisor is not None
        spent: list[float] = []
        paced = pacing.Pacing(self.snapshot_interval * self.snapshot_stride / 1000 / 2)
        try:
            parts = pacing.slices(changes)
            while True:
                done, used = await asyncio.to_thread(pacing.encode_slices, image, parts)
                spent.append(used)
                await paced.pause(used)
                if done:
                    break
            await self._write(deployment, boundary, functools.partial(_write_image, image, spent), paced)
        except Exception:
            deployment.image = None
            raise
        cost = cpu + sum(spent)
        stride = snapshot_stride(cost, self.snapshot_interval / 1000, self.snapshot_cpu_share, self.snapshot_stride,
                                 self.snapshot_max_stride)
        if stride != self.snapshot_stride:
            self.log.info("a snapshot cost %.3f s of CPU: snapshots every %d interval(s) from now on", cost, stride)
            self.snapshot_stride = stride
        await self.supervisor.recovered(self.name, "snapshot below")

    async def _write(self, deployment: _Deployment, boundary: GlobalTime, write: Callable[..., SnapshotInfo],
                     paced: pacing.Pacing | None = None) -> None:
        """Write (with ``write``, off the event loop) and register this worker's snapshot of ``deployment`` below
        ``boundary``; then retention.  With ``paced``, a pause after each step (a hand-over's snapshot, which the
        new tick waits for, goes without)."""
        assert self.store is not None and self.data_dir is not None
        tick = deployment.tick.number
        path = snapshot_path(self.data_dir, boundary, self.index)
        info = await asyncio.to_thread(write, path, boundary=boundary, worker=self.index, tick=tick)
        if paced is not None:
            await paced.pause()
        await asyncio.to_thread(self.store.register_snapshot, tick, boundary_name(boundary), self.index,
                                {"path": str(path.resolve()), "sha256": info.sha256, "keys": info.keys,
                                 "items": info.items, "bytes": info.body_bytes})
        self.log.debug("snapshot of tick %d below %s: %d keys, %d items, %d bytes", tick, boundary_name(boundary),
                       info.keys, info.items, info.body_bytes)
        if paced is not None:
            await paced.pause()
        await asyncio.to_thread(self._retain, deployment.tick)

    def _retain(self, tick: Tick) -> None:
        """Keep the newest ``snapshot_retention`` complete snapshots of ``tick``; drop what is older, and once
        ``tick`` has that many, every snapshot of the ticks before it (which it no longer needs).

        Every earlier tick, not just the one handed over: after two quick
        hand-overs in a row, or a deploy that starts fresh, nothing else
        would ever delete the older ticks' snapshots — and the fronts keep
        their input logs from the oldest complete snapshot registered.  Then
        directories below the oldest kept boundary that no registration names
        (a worker that stopped between writing and registering) go too.

        A kept snapshot may be a delta (``SnapshotImage.write``): its files
        build on older ones, back to their roots.  So the registrations go,
        but the files a kept one builds on stay (``_needed``), each alone in
        its directory.  Only directories below the oldest kept boundary are
        pruned, an older tick's too: above it, this tick's workers may have
        written a file they have not registered yet (a recovery tick writes
        into the directories of boundaries its crashed predecessor reached),
        and the next deltas build on it.
        """
        assert self.store is not None and self.data_dir is not None
        seen_tick, seen = self._complete_seen
        own = self.store.registered_snapshots(tick.number, seen if seen_tick == tick.number else None)
        complete_now = complete_boundaries(own, len(tick.workers))
        self._complete_seen = (tick.number, complete_now)
        complete = [boundary_of(b) for b in complete_now]
        if len(complete) < self.snapshot_retention:
            return
        oldest_kept = complete[-self.snapshot_retention]
        doomed = [(tick.number, b, own[b]) for b in own if boundary_of(b) < oldest_kept]
        for number in range(self._swept_ticks, tick.number):
            doomed += [(number, b, r) for b, r in self.store.registered_snapshots(number).items()]
        for number, boundary, registrants in doomed:
            self.store.forget_snapshot(number, boundary, registrants)
        self._swept_ticks = max(self._swept_ticks, tick.number)
        try:
            needed = _needed(self.data_dir, complete[-self.snapshot_retention:])
        except SnapshotError as exc:
            self.log.warning("retention deletes no snapshot file this time: %s", exc)
            return
        with contextlib.suppress(FileNotFoundError):
            for directory in (self.data_dir / "snapshots").iterdir():
                try:
                    below = boundary_of(directory.name) < oldest_kept
                except ValueError:
                    continue
                if below:
                    _prune(directory, needed)

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

    async def step(self, batches: list[_Inbound]) -> None:
        acks: Acks = {}
        envelopes: list[Envelope] = []
        for entries, received, checked in batches:
            if checked != (self.previous, self.current):
                entries = self._fitting(entries)
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

    def _fitting(self, envelopes: list[Envelope]) -> list[Envelope]:
        """``envelopes`` without those that do not fit the deployment taking them.

        ``Exchange`` checked them against the deployments of its time; a tick
        taken up since (a deploy that starts afresh hands what was in flight to
        the new graph) may not fit them any more.  Their stream is gone by now,
        so what does not fit is dropped, with a warning, rather than stop the
        node; their acks still go, as for an item processed without output.
        """
        problem = _misfit(self._placed(envelopes))
        if problem is None:
            return envelopes
        kept = [e for e in envelopes if _misfit(self._placed([e])) is None]
        self.log.warning("dropped %d of %d envelopes checked before the current tick came: %s",
                         len(envelopes) - len(kept), len(envelopes), problem)
        return kept

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
                current = list(self.load)
                try:
                    await asyncio.to_thread(self.store.report_load, self.index, current)
                except Exception:  # ZooKeeper away: statistics can wait for the next round, the stream cannot
                    self.log.warning("cannot report the load statistics", exc_info=True)
                    continue
                reported = current

    async def report_pressure(self) -> None:
        """Tell the fronts (through ZooKeeper) while this process is over its memory budget, so they stop
        admitting until it is back under: a worker that runs out of memory loses more than a refused push.

        The process's resident size, measured every second: what the
        operating system's out-of-memory killer judges.  What pushes it up is
        in-flight items (in queues, groupings and the barrier) and grouping
        state; the first drains once admission stops, the second stays, and
        then the fronts keep refusing with the worker's reason until a rescale
        spreads the state over more workers.
        """
        assert self.store is not None
        process = psutil.Process()
        over = False
        while True:
            rss = process.memory_info().rss
            now = over_memory_budget(rss, self.memory_budget, over)
            if now or over:  # over: said again each time (an expired session drops it); back under: said once
                reason = (f"{self.name} is over its memory budget ({rss >> 20} MB resident, "
                          f"--memory-budget-mb {self.memory_budget >> 20})") if now else None
                try:
                    await asyncio.to_thread(self.store.report_pressure, self.index, reason)
                except Exception:  # ZooKeeper away: the next measurement says it again
                    self.log.warning("cannot report memory pressure", exc_info=True)
                else:
                    if now != over:
                        self.log.warning("%s", reason or f"{self.name} is back under its memory budget "
                                         f"({rss >> 20} MB resident)")
                    over = now
            await asyncio.sleep(MEMORY_CHECK_EVERY)

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
            await self._to_barriers(deployment, to_barrier, acks)
            # A piece's sends may all be in-process and never suspend: let the node's other roles and its health
            # check run between pieces, or a big step (a recovery's backlog) looks like a hung node.
            await asyncio.sleep(0)
        await deployment.streams.write(tick.acker, transport.ACK, pb.AckBatch(acks=codec.ack_messages(acks),
                                                                                  tick=tick.number))

    async def _send(self, deployment: _Deployment, address: str, method: str, entries: list[Any],
                    gt_of: Callable[[Any], GlobalTime], acks: Acks) -> None:
        """Ship ``entries`` in messages of at most ``batch_items``, each with fresh send acks folded into ``acks``.

        An envelope whose payload cannot be encoded (business logic returned
        something other than a plain value, say a namedtuple) goes to the
        barrier as its item's dead letter instead: a batch that cannot be
        written must not stop the worker, and its items' acks must still flow.

        Records for this node's own barrier go as ``LocalItems``, not encoded; in the same chunks, so that the
        barrier's handler inserts no more at once than a batch from another node holds.
        """
        local = method == transport.DELIVER and deployment.streams.is_local(address, method)
        for start in range(0, len(entries), self.batch_items):
            chunk = entries[start:start + self.batch_items]
            sent = codec.new_acks({gt_of(e) for e in chunk})
            batch: pb.ItemBatch | LocalItems
            if local:
                batch = LocalItems(chunk, sent, self.index, deployment.tick.number)
            else:
                try:
                    batch = codec.encode_batch(chunk, sent, self.index, deployment.tick.number)
                except codec.BatchError:
                    if method != transport.EXCHANGE:  # records are bytes already: a sender's bug, not an item's
                        raise
                    chunk, dead = self._encodable(deployment, chunk)
                    await self._to_barriers(deployment, dead, acks)
                    if not chunk:
                        continue
                    sent = codec.new_acks({gt_of(e) for e in chunk})
                    batch = codec.encode_batch(chunk, sent, self.index, deployment.tick.number)
            codec.xor_into(acks, sent)
            await deployment.streams.write(address, method, batch)

    def _encodable(self, deployment: _Deployment, envelopes: list[Envelope]) -> tuple[list[Envelope], list[Item]]:
        """The envelopes that encode one by one, and the dead letters of those that do not."""
        kept: list[Envelope] = []
        dead: list[Item] = []
        for envelope in envelopes:
            try:
                codec.encode_batch([envelope], {}, self.index, deployment.tick.number)
            except codec.BatchError as exc:
                op, _h, (payload, gt, trace, tomb) = envelope
                dead.append((dead_letter(deployment.core.plan.names[op], exc, payload), gt, trace, tomb))
            else:
                kept.append(envelope)
        return kept, dead

    async def _to_barriers(self, deployment: _Deployment, items: list[Item], acks: Acks) -> None:
        by_barrier: dict[str, list[Item]] = {}
        for item in items:
            by_barrier.setdefault(deployment.tick.barrier_of(item[1].front), []).append(item)
        for address, mine in by_barrier.items():
            await self._send(deployment, address, transport.DELIVER, codec.to_records(mine), item_time, acks)


_Inbound = tuple[list[Envelope], Acks, tuple[_Deployment | None, _Deployment | None]]
"""A decoded batch in the inbox: envelopes, receipt acks, and the (previous, current) deployments they were checked
against."""


def _misfit(placed: list[tuple[_Deployment | None, list[Envelope]]]) -> str | None:
    """Why envelopes cannot run on the deployment taking them, or None: the codec checked their types and
    ranges, this is what needs the graph and the tick — an operation index is one of the graph's operations,
    an operation with a balancing function has the hash it routed by (a grouping keys its state by it), and the
    global time's front has a barrier (its sink items go there)."""
    for deployment, envelopes in placed:
        if not envelopes:
            continue
        if deployment is None:
            return f"{len(envelopes)} envelopes for a tick this worker takes no part in (yet)"
        plan, tick = deployment.core.plan, deployment.tick
        ops = set(map(itemgetter(0), envelopes))
        if max(ops) >= len(plan.kinds):
            return (f"operation {max(ops)} is not one of the {len(plan.kinds)} operations of tick "
                    f"{tick.number}'s graph")
        balanced = {op for op in ops if plan.balances[op] is not None}
        if balanced:
            unhashed = balanced.intersection(compress(map(itemgetter(0), envelopes),
                                                      map(operator.is_, map(itemgetter(1), envelopes), repeat(None))))
            if unhashed:
                op = min(unhashed)
                return f"an envelope for operation {op} ({plan.names[op]}) has no hash, but the operation balances"
        fronts = set(map(itemgetter(1), map(itemgetter(1), map(itemgetter(2), envelopes))))
        foreign = fronts - {partition for partition, _address in tick.barriers}
        if foreign:
            return f"front {min(foreign)} has no barrier in tick {tick.number}"
    return None


def _caller(context: Any) -> str:
    """Who called: the gRPC peer, or the node itself for an in-process stream (``LocalContext`` has no peer)."""
    peer = getattr(context, "peer", None)
    return str(peer()) if peer is not None else "this node"


class WorkerRole:
    """Worker ``index`` as a role of a node (see ``flamestream.runtime.node``)."""

    kind = "worker"

    def __init__(self, index: int, store: ClusterStore | None = None, data_dir: Path | None = None, *,
                 weight: float = 1.0, batch_items: int = 256, linger_ms: float = 0.0, snapshot_interval_ms: int = 1000,
                 snapshot_retention: int = 2, memory_budget_mb: int = 0,
                 snapshot_cpu_share: float = SNAPSHOT_CPU_SHARE,
                 snapshot_max_stride: int = MAX_SNAPSHOT_STRIDE) -> None:
        self.index = index
        self.name = f"worker{index}"
        self.weight = weight
        """Its share of the hash space relative to the other workers' (registered; ``deploy`` cuts by it)."""
        self._store, self._data_dir = store, data_dir
        self._options = (batch_items, linger_ms, snapshot_interval_ms, snapshot_retention, memory_budget_mb,
                         snapshot_cpu_share, snapshot_max_stride)
        self.service: WorkerService | None = None

    def info(self) -> dict[str, Any]:
        return {"index": self.index, "weight": self.weight}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        self.service = WorkerService(self.index, local, self._store, self._data_dir, *self._options)
        codec.add_servicer(server, self.service, pb.DESCRIPTOR.services_by_name["Worker"])
        local.streams[transport.EXCHANGE] = self.service.Exchange

    def start(self, supervisor: Supervisor) -> None:
        assert self.service is not None
        self.service.supervisor = supervisor
        # A worker that cannot process cannot go on: it would hold the min time forever.
        supervisor.spawn(self.name, "processing loop", self.service.run(), essential=True)
        if self._store is not None:
            supervisor.spawn(self.name, "load reports", self.service.report_load())
            if self.service.memory_budget:
                supervisor.spawn(self.name, "memory budget", self.service.report_pressure())

    async def deploy(self, tick: Tick) -> None:
        assert self.service is not None
        await self.service.apply_tick(tick)

    def warm(self) -> None:
        assert self.service is not None
        self.service.warm()

    def skip_through(self, tick: int) -> None:
        """Ticks reach this role only through ``deploy``, which the node filters."""

    async def close(self) -> None:
        assert self.service is not None
        await self.service.close()
