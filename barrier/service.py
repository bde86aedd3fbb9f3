"""Barrier servicer and process lifecycle.

Data path: ``Deliver`` inserts items into the buffer of their partition and
only then acks their receipt to the acker (acking first would let the minimal
time pass an item the barrier has not stored yet, and it would never be
released).  The acker's min-time stream wakes a single release task, which
pops everything below the min time from each buffer and appends it to that
partition's topic log with one fsynced ``append_many``; subscribers are woken
once the append has returned, so they never see a record a crash could take
back.

Ticks: a tick that starts afresh starts with empty buffers and a new
connection to the tick's acker: items buffered under the previous tick are
dropped (and so are those of its batches that arrive later), and the release
bound is reset until the new acker reports, so nothing delivered under the new
tick is released by the old bound.  A batch names its sender's tick, and one
of a tick this barrier has not seen yet waits for it: inserted at once, it
would be dropped with the old tick's buffers.  A
hand-over tick with the same acker keeps both: buffers and releases only
depend on global times.
A lost acker connection is not repaired either (its acks are gone, so the
tick's min time could not be trusted); the next tick reconnects.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn

import grpc

from flamestream.core.barrier import ArrivalBuffer, BarrierBuffer, Released
from flamestream.core.columns import record_batch
from flamestream.core.item import Item
from flamestream.core.limits import RETRY_HINT, group_fault
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Tick
from flamestream.runtime import hosting
from flamestream.runtime.appends import Appends
from flamestream.runtime.channels import Channels, LocalEndpoints, LocalItems
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.runtime.tick_gate import TickGate
from flamestream.storage.log import LogError, SegmentedLog, disk_full
from flamestream.storage.offsets import CommittedOffsets, TooManyGroups
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as pb_grpc

DISK_RETRY = 1.0
"""Seconds between attempts to append to a topic whose disk is full."""

_READ_BATCH = 1000
"""Records a subscriber reads from disk per step: bounds memory and the time a read holds a thread."""

TAIL_RECORDS = 8192
"""Records of the newest appends a partition keeps in memory, so that subscribers who keep up are sent them from
there (see ``_Partition.recent``)."""

Context = grpc.aio.ServicerContext[Any, Any]


class _Partition:
    """One owned partition: its invalidation buffer, its topic log and the wake-up of its subscribers."""

    def __init__(self, number: int, directory: Path, on_arrival: bool = False) -> None:
        self.number = number
        self.directory = directory
        self.logger = role_logger(f"barrier{number}")
        self.closing = False
        """The barrier is stopping: an append waiting for disk space gives up (see ``append``)."""
        self.log = SegmentedLog(directory)
        self._appends = Appends(self.logger, f"topic partition {number}")
        self.end = self.log.end_offset
        """Offset after the last record appended and fsynced, as known on the event loop."""
        self.offsets = CommittedOffsets(directory)
        if self.offsets.damaged is not None:
            self.logger.error("%s; it is moved aside, and its consumer groups resume from offset 0",
                              self.offsets.damaged)
        self._new_buffer: type[BarrierBuffer | ArrivalBuffer] = ArrivalBuffer if on_arrival else BarrierBuffer
        self.buffer = self._new_buffer()
        self.released = 0
        self._retired = (0, 0)
        """(received, retractions) of the buffers earlier ticks dropped."""
        self.appended = asyncio.Event()
        """Set (and replaced by a fresh event) whenever ``end`` grows or the barrier shuts down."""
        self._tail: deque[bytes] = deque(maxlen=TAIL_RECORDS)
        """The last records before ``end``, as appended."""
        self._last, self._at_last = _topic_tail(self.log)
        """The last global time in the topic and its records: what a recovery, which replays the stream from
        its last complete snapshot, must not release again (see ``_new_only``)."""
        self.held: list[bytes] = []
        """Records released at once (``append_now``) but not appended: the release task appends them first."""

    def adopt_offsets(self, legacy: dict[str, int]) -> None:
        """Start from the offsets the cluster kept in ZooKeeper (``ClusterStore.legacy_offsets``), for a partition
        that has no offsets file yet: checked as a commit is, and an offset past the topic's end clamped to it
        (Subscribe refuses those)."""
        found = {group: min(offset, self.end) for group, offset in legacy.items()
                 if group_fault(group) is None and offset >= 0}
        self.offsets.adopt(found)
        if found:
            self.logger.info("adopted the offsets of %d consumer groups from ZooKeeper", len(found))

    def wake(self) -> None:
        # A fresh event per generation: waiters captured the old one before checking ``end``, so
        # none can miss a wake-up, and nobody has to clear an event other waiters still need.
        woken, self.appended = self.appended, asyncio.Event()
        woken.set()

    def reset(self) -> None:
        """A fresh buffer for a new tick; its predecessor's counters stay in the stats."""
        self._retired = self.stats()[::2]
        self.buffer = self._new_buffer()

    def stats(self) -> tuple[int, int, int]:
        """(items received, records released, tombstones received) since the barrier started."""
        return self._retired[0] + self.buffer.received, self.released, self._retired[1] + self.buffer.retractions

    def append_now(self, released: list[Released]) -> bool:
        """Append what is new of ``released`` to the topic at once, on the loop; False if records are left
        ``held`` for the release task: some already were, the disk is slow (``Appends.on_loop``), or the append
        failed (the task's attempt meets the failure again, and takes the path ``append`` takes for it)."""
        records = self._new_only(released)
        if not records:
            return not self.held
        if self.held or not self._appends.on_loop(records):
            self.held.extend(records)
            return False
        try:
            self._appends.run_on_loop(self.log.append_many, records)
        except Exception:  # not logged here: the task's retry meets it again (as the cause of the log's failure)
            self.held = records
            return False
        self._appended(records)
        return True

    async def append(self, released: list[Released]) -> None:
        """Append what is ``held`` and what is new of ``released`` to the topic, waiting while its disk is full.

        A full disk pauses releases instead of stopping the node: the fronts
        refuse new input on the same condition (their input logs fill too, or
        the credit runs out while nothing is released), subscribers keep
        reading the records below ``end``, and once space returns the
        remaining records follow in order.  After a failed append only
        reopening the log tells which records reached it (``SegmentedLog.reopen``).
        """
        records = self.held + self._new_only(released)  # serialized by the workers (codec.to_records)
        self.held = []
        paused = False
        while records:
            try:
                await self._appends.run(self.log.append_many, records)
                self._appended(records)
                records = []
            except Exception as exc:
                if not disk_full(exc):
                    raise
                self.log = await asyncio.to_thread(self.log.reopen)
                written = self.log.end_offset - self.end
                self._appended(records[:written])
                records = records[written:]
                if self.closing:
                    self.logger.error("stopping with %d records of partition %d held back by a full disk",
                                      len(records), self.number)
                    return
                if not paused:
                    self.logger.warning("disk full: partition %d holds %d records back until space returns (%s)",
                                      self.number, len(records), exc)
                paused = True
                await asyncio.sleep(DISK_RETRY)
        if paused:
            self.logger.warning("space returned: partition %d releases again", self.number)

    def _appended(self, records: list[bytes]) -> None:
        """``records`` were appended (and fsynced) after those before ``end``."""
        if records:
            self._tail.extend(records)
            self.end += len(records)
            self.released += len(records)
            self.wake()

    def recent(self, offset: int, count: int) -> list[tuple[int, bytes]] | None:
        """Up to ``count`` records from ``offset`` on, as (offset, record) pairs, if they are still held in
        memory (``TAIL_RECORDS``); None if the first of them is older.

        Why: a subscriber that keeps up asks for what the last append added,
        and reading it back from the log cost a worker thread's turn and the
        read and check of every record: about a millisecond between a release
        and its consumer.
        """
        first = self.end - len(self._tail)
        if offset < first:
            return None
        stop = min(offset + count, self.end)
        newer = self.end - stop
        if offset - first <= newer:
            records = list(islice(self._tail, offset - first, stop - first))
        else:
            # From the newest end: islice walks a deque from its start, and a subscriber that keeps up asks for
            # its last records — a walk past the whole tail (8192 records, 36 us) for every batch it reads.
            records = list(islice(reversed(self._tail), newer, self.end - offset))
            records.reverse()
        return list(zip(range(offset, stop), records, strict=True))

    def _new_only(self, released: list[Released]) -> list[bytes]:
        """The records of ``released`` that the topic does not hold yet.

        The topic is written in global-time order, and whole global times at a
        time, so after a recovery everything below its last global time L is
        out already.  At L itself a crash may have torn the append, so the
        records of L are matched one for one: their bytes are deterministic (a
        replay of the same input from the same state), but their order within
        L need not be — traces carry grouping versions, which depend on arrival
        order.  Once a later global time is released, L is history.
        """
        last = self._last
        if last is None:
            return [record for _gt, _trace, record in released]
        out = []
        for gt, _trace, record in released:
            if gt == last and self._at_last[record] > 0:
                self._at_last[record] -= 1  # out already
            elif gt >= last:
                out.append(record)
        if released and released[-1][0] > last:
            self._last, self._at_last = None, Counter()
        return out


def _topic_tail(log: SegmentedLog) -> tuple[GlobalTime | None, Counter[bytes]]:
    """The topic's last global time and the multiset of its records (None for an empty topic)."""
    last: GlobalTime | None = None
    records: Counter[bytes] = Counter()
    for _offset, data in log.scan_backwards(chunk=256):
        time = pb.Record.FromString(data).time
        gt = GlobalTime(time.ts, time.front)
        if last is None:
            last = gt
        if gt != last:
            break
        records[data] += 1
    return last, records


class _AckerLink:
    """The connection to one tick's acker: receipt acks out, min times in.

    Receipt acks go through a queue drained by one task that owns the
    long-lived ``Ack`` stream.  gRPC allows one pending write per call, and a
    write cancelled midway cancels the whole call, so ``Deliver`` handlers
    (which a client may cancel at any moment) must never write to it directly.
    Both tasks run under the node's supervisor: if either stops, nothing more
    is released until the next tick, and the barrier turns NOT_SERVING.
    """

    def __init__(self, address: str, on_min_time: Callable[[GlobalTime], None], local: LocalEndpoints,
                 supervisor: Supervisor, role: str) -> None:
        self.address = address
        self.error: str | None = None
        """Why the ack stream broke, once it has."""
        self._channels = Channels(local, functools.partial(self._broke, supervisor, role))
        self._stream = self._channels.stream(address, transport.ACK, f"acker at {address}")
        self._outbox: asyncio.Queue[pb.AckBatch] = asyncio.Queue()
        self._tasks = (supervisor.spawn(role, f"ack stream to acker {address}", self._send()),
                       supervisor.spawn(role, f"min-time watch on acker {address}", self._watch(on_min_time)))

    def send(self, batch: pb.AckBatch) -> None:
        """Queue receipt acks; never blocks, so a cancelled ``Deliver`` cannot lose or split them."""
        self._outbox.put_nowait(batch)

    def warm(self) -> None:
        self._channels.warm()

    async def _send(self) -> None:
        try:
            while True:
                await self._stream.write(await self._outbox.get())
        except hosting.StreamBroken as exc:
            self.error = str(exc)
            raise

    def _broke(self, supervisor: Supervisor, role: str, exc: hosting.StreamBroken) -> None:
        """The ack stream ended while the link was open: receipt acks may be lost, so nothing more is taken."""
        self.error = str(exc)
        supervisor.stream_broke(role, f"ack stream to acker {self.address}", exc)

    async def _watch(self, on_min_time: Callable[[GlobalTime], None]) -> None:
        async for min_time in self._channels.watch_min_time(self.address):
            on_min_time(GlobalTime(min_time.ts, min_time.front))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channels.close()


class BarrierService(pb_grpc.BarrierServicer):
    def __init__(self, partitions: dict[int, _Partition], local: LocalEndpoints,
                 on_arrival: bool = False, name: str = "barrier") -> None:
        self._local = local
        self._offsets_writer = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-offsets")
        """Commits wait for an fsync, one at a time: in a thread of their own, so that consumers committing at once
        do not take every thread of the loop's default pool, which the node's front needs for its promise file."""
        self.name = name
        self.supervisor: Supervisor | None = None
        self._on_arrival = on_arrival
        """Guarantees off: release on arrival, without the min time (see ArrivalBuffer)."""
        self._partitions = partitions
        self._link: _AckerLink | None = None
        self._min_time: GlobalTime | None = None
        """The current tick's newest min time; None until its acker reports one."""
        self._min_changed = asyncio.Event()
        self._releasing = False
        """The release task is at work: a min time that arrives meanwhile is left to it (``_advance``)."""
        self._closing = False
        self._stopping = False
        self._gate = TickGate()
        """Batches wait for their tick, and those of a tick older than the buffers are dropped (``Deliver``)."""

    # -- lifecycle ---------------------------------------------------------------

    async def deploy(self, tick: Tick) -> None:
        if not tick.acker:
            role_logger(self.name).error("ignoring tick %d: it names no acker", tick.number)
            return
        assert self.supervisor is not None, "start() comes before the first tick"
        if tick.previous is not None and self._link is not None and self._link.address == tick.acker and \
                self._link.error is None:
            # A hand-over: items of both ticks are ordered by global time alone, and released by the one acker's
            # min time, so the buffers and the acker link carry on.
            self._gate.deploy(tick.number, fresh=False)
            return
        # Everything up to the swap happens without yielding, so no Deliver sees a half-applied tick.
        for partition in self._partitions.values():
            partition.reset()
        self._min_time = None
        previous, self._link = self._link, _AckerLink(tick.acker, self._advance, self._local, self.supervisor,
                                                      self.name)
        self._gate.deploy(tick.number, fresh=True)
        if previous is not None:
            await previous.close()

    def warm(self) -> None:
        """Connect the receipt-ack stream to the current tick's acker (``Channels.warm``)."""
        if self._link is not None:
            self._link.warm()

    def close(self) -> None:
        """End every subscription (with UNAVAILABLE, so consumers know to reconnect)."""
        self._closing = True
        for partition in self._partitions.values():
            partition.closing = True
            partition.wake()

    async def shutdown(self) -> None:
        """Drop the acker link and end the release loop (the node waited for a running append to finish)."""
        self._stopping = True
        self._min_changed.set()
        if self._link is not None:
            await self._link.close()
        self._offsets_writer.shutdown(wait=False)  # a commit under way finishes; its client hears nothing

    def _advance(self, min_time: GlobalTime) -> None:
        """A new min time: release below it at once, in the watch that brought it, where the release task is idle.

        Why not always in the task: on a node whose event loop also runs a
        worker, the task woke a median 2.3 ms after the min time arrived
        (behind the worker's steps of an inverted-index page), and a page's
        records waited for that.  Releasing here takes no await, so nothing can
        interrupt an append midway (the watch is cancelled when its tick
        ends); what cannot be appended at once is left to the task, in order.
        """
        self._min_time = min_time
        if self._releasing or self._stopping or self._on_arrival:
            self._min_changed.set()
            return
        left = False
        for partition in self._partitions.values():
            if not partition.append_now(partition.buffer.release(min_time)):
                left = True
        if left:
            self._min_changed.set()

    async def release_forever(self) -> None:
        """Release below the newest min time, partition by partition.

        This task appends what ``_advance`` could not append at once, and every
        release while it works (``_releasing``), so a log never has two writers
        at once and records land in release order; it is never cancelled,
        because an append running in a worker thread could not be interrupted
        anyway.  The bound is re-read for every partition: a tick arriving
        during an append resets it, and the old bound must not release what the
        new tick delivers.
        """
        while True:
            await self._min_changed.wait()
            self._min_changed.clear()
            if self._stopping:
                for partition in self._partitions.values():
                    if partition.held:  # released, not in the topic: a recovery replays them
                        partition.logger.warning("stopping with %d released records of partition %d not appended",
                                                 len(partition.held), partition.number)
                return
            self._releasing = True
            try:
                for partition in self._partitions.values():
                    released = partition.buffer.release(self._min_time)
                    if released or partition.held:
                        await partition.append(released)
            finally:
                self._releasing = False

    # -- RPCs --------------------------------------------------------------------

    async def Deliver(self, request_iterator: AsyncIterator[pb.ItemBatch | LocalItems], context: Context) -> pb.Empty:
        async for batch in request_iterator:
            if isinstance(batch, LocalItems):  # from this node's own worker: its records as they are
                items, acks = batch.items, batch.acks
            else:
                # Decoding builds plain values only and refuses anything else (codec), so neither a crafted batch
                # nor garbage can do more than end its own call; checked before the tick is needed, so garbage is
                # refused at once.
                try:
                    items, acks = codec.decode_items(batch)
                except codec.BatchError as exc:
                    await self._refuse(context, batch, str(exc))
            problem = self._check_items(items)
            if problem is not None:
                await self._refuse(context, batch, problem)
            # Items may come from a worker that saw the tick first; rejecting would lose the batch already
            # written (the sender only learns on its next write), so they wait for the tick instead.  Inserted
            # earlier, they would be dropped with the old tick's buffers, and their acks go to the old table.
            if not await self._gate.admitted(batch.tick, context):
                # A fresh tick dropped its tick's buffers, and the acker its global times.
                role_logger(self.name).info("dropped %d items of tick %d, whose buffers a fresh tick replaced",
                                            len(items), batch.tick)
                continue
            link = self._link
            assert link is not None, "a deployed tick has an acker link"
            if link.error is not None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, link.error)
            try:
                for item in items:
                    self._partitions[item[1].front].buffer.insert(item)
            except ValueError as exc:  # a duplicate: a sender bug, so its acks are withheld too
                await self._refuse(context, batch, str(exc))
            messages = codec.ack_messages(acks)
            if messages:
                link.send(pb.AckBatch(acks=messages, tick=batch.tick))
            if self._on_arrival:
                self._min_changed.set()
        return pb.Empty()

    def _check_items(self, items: list[Item]) -> str | None:
        """Why the batch cannot be inserted, checked for every item before any is (a batch is all or nothing).

        The codec checked each item's shape and types; what is left needs this barrier: owning the partition.
        """
        foreign = set(map(itemgetter(1), map(itemgetter(1), items))) - self._partitions.keys()  # item[1].front
        if foreign:
            gt = next(item[1] for item in items if item[1].front in foreign)
            return (f"item at {gt} belongs to partition {gt.front}, which this barrier does not own "
                    f"(it owns {sorted(self._partitions)})")
        return None

    async def _refuse(self, context: Context, batch: pb.ItemBatch | LocalItems, problem: str) -> NoReturn:
        """End the call with INVALID_ARGUMENT, and say so in the log: the sender is a buggy or hostile member."""
        peer = getattr(context, "peer", None)  # an in-process stream's LocalContext has none
        unit = "items" if isinstance(batch, LocalItems) else "bytes"
        role_logger(self.name).warning("refused a batch of %d %s from %s (sender %d): %s", len(batch.items), unit,
                                       str(peer()) if peer is not None else "this node", batch.sender, problem)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name} refused the batch: {problem}")

    async def _owned(self, number: int, context: Context) -> _Partition:
        partition = self._partitions.get(number)
        if partition is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"partition {number} is not owned by this barrier (it owns {sorted(self._partitions)})")
        return partition

    async def _check_offset(self, partition: _Partition, offset: int, context: Context) -> None:
        if not 0 <= offset <= partition.end:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"offset {offset} is outside partition {partition.number}: valid offsets are "
                                f"0..{partition.end}")

    async def Subscribe(self, request: pb.SubscribeRequest, context: Context) -> AsyncIterator[bytes]:
        """Stream the partition's records from the requested offset on, as serialized ``RecordBatch`` messages
        (``columns.record_batch``: built from the stored records' bytes, not as messages)."""
        partition = await self._owned(request.partition, context)
        offset = request.from_offset
        await self._check_offset(partition, offset, context)
        # A private read-only view: the writer instance belongs to the release task's threads.
        reader = SegmentedLog(partition.directory, readonly=True)
        try:
            while not self._closing:
                appended = partition.appended  # captured before checking ``end``: see _Partition.wake
                if offset < partition.end:
                    # Not past ``end``: the log publishes an append's records before ``append`` returns to the loop,
                    # and a consumer that read them would commit an offset Commit still refuses as out of range.
                    count = min(_READ_BATCH, partition.end - offset)
                    read = partition.recent(offset, count)
                    if read is None:
                        read = await asyncio.to_thread(reader.read, offset, count)
                    if read:
                        offset = read[-1][0] + 1
                    yield record_batch(partition.number, read)
                else:
                    await appended.wait()
        finally:
            reader.close()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "barrier is shutting down")

    async def Commit(self, request: pb.CommitRequest, context: Context) -> pb.Empty:
        # Checked names only: every commit rewrites the partition's offsets file (and a 2 MB name, when offsets
        # were ZooKeeper nodes, made a packet ZooKeeper dropped the session over).
        if (fault := group_fault(request.group)) is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, fault)
        partition = await self._owned(request.partition, context)
        await self._check_offset(partition, request.offset, context)
        try:
            await asyncio.get_running_loop().run_in_executor(self._offsets_writer, partition.offsets.commit,
                                                             request.group, request.offset)
        except TooManyGroups as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except RuntimeError:  # the writer is shut down: the barrier is stopping (the SDK retries UNAVAILABLE)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "barrier is shutting down")
        except OSError as exc:  # the old offsets file is intact (see write_durably)
            partition.logger.warning("committing offset %d of group %r failed: %s", request.offset, request.group,
                                     exc)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED if disk_full(exc) else grpc.StatusCode.UNAVAILABLE,
                                f"the barrier could not store the offset ({exc.strerror or exc}) {RETRY_HINT}")
        return pb.Empty()

    async def Committed(self, request: pb.CommittedRequest, context: Context) -> pb.Offset:
        if (fault := group_fault(request.group)) is not None:  # as in Commit
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, fault)
        partition = await self._owned(request.partition, context)
        return pb.Offset(offset=partition.offsets.get(request.group) or 0)

    async def Stats(self, request: pb.Empty, context: Context) -> pb.BarrierStats:
        per_partition = [p.stats() for p in self._partitions.values()]
        received, released, retractions = (sum(column) for column in zip(*per_partition, strict=True))
        return pb.BarrierStats(received=received, released=released, retractions=retractions)


def _open_partitions(data_dir: Path, numbers: tuple[int, ...], on_arrival: bool) -> dict[int, _Partition]:
    partitions: dict[int, _Partition] = {}
    try:
        for number in numbers:
            partitions[number] = _Partition(number, data_dir / "topic" / str(number), on_arrival)
    except (LogError, OSError) as exc:
        for partition in partitions.values():
            partition.log.close()
        raise SystemExit(f"barrier: cannot open the output topic: {exc}") from exc
    return partitions


class BarrierRole:
    """A barrier owning ``partitions`` as a role of a node (see ``flamestream.runtime.node``)."""

    kind = "barrier"

    def __init__(self, data_dir: Path, partitions: tuple[int, ...], on_arrival: bool = False,
                 legacy_offsets: Callable[[int], dict[str, int]] | None = None) -> None:
        """``legacy_offsets(partition)``: the offsets a partition without an offsets file adopts (see
        ``ClusterStore.legacy_offsets``)."""
        self.name = f"barrier{partitions[0]}"
        self._partitions = _open_partitions(data_dir, partitions, on_arrival)
        self._legacy_offsets = legacy_offsets
        self._on_arrival = on_arrival
        self.service: BarrierService | None = None
        self._releasing: asyncio.Task[None] | None = None

    def info(self) -> dict[str, Any]:
        return {"partitions": sorted(self._partitions)}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        # Before the server answers a Committed: the node's ZooKeeper session is up by now.
        if self._legacy_offsets is not None:
            for partition in self._partitions.values():
                if not partition.offsets.stored:
                    partition.adopt_offsets(self._legacy_offsets(partition.number))
        self.service = BarrierService(self._partitions, local, self._on_arrival, self.name)
        codec.add_servicer(server, self.service, pb.DESCRIPTOR.services_by_name["Barrier"])
        local.streams[transport.DELIVER] = self.service.Deliver

    def start(self, supervisor: Supervisor) -> None:
        assert self.service is not None
        self.service.supervisor = supervisor
        # Supervised through a shield: stopping the node must not cancel an append running in a thread (``close``
        # lets it finish); a topic that cannot be written is fatal.
        releasing = self._releasing = asyncio.create_task(self.service.release_forever())

        async def release_loop() -> None:
            await asyncio.shield(releasing)

        supervisor.spawn(self.name, "release loop", release_loop(), essential=True)

    async def deploy(self, tick: Tick) -> None:
        assert self.service is not None
        await self.service.deploy(tick)

    def warm(self) -> None:
        assert self.service is not None
        self.service.warm()

    def skip_through(self, tick: int) -> None:
        """Ticks reach this role only through ``deploy``, which the node filters."""

    async def close(self) -> None:
        try:
            if self.service is not None:
                self.service.close()
                await self.service.shutdown()
            if self._releasing is not None:
                await asyncio.gather(self._releasing, return_exceptions=True)
        finally:
            for partition in self._partitions.values():
                partition.log.close()
