"""The front's servicer: validation, admission, routing to workers, acks and reports (see ``fronts``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from flamestream.cluster import ClusterStore, SnapshotsSeen
from flamestream.core import payload as payloads
from flamestream.core.dead_letter import writable
from flamestream.core.front import FrontClock
from flamestream.core.graph import Graph
from flamestream.core.hashing import BalanceError, as_hash
from flamestream.core.limits import RETRY_HINT, producer_fault, sequence_fault
from flamestream.core.meta import GlobalTime, Trace, boundary_of
from flamestream.core.plan import Plan, compile_graph
from flamestream.core.tick import Tick
from flamestream.core.worker import front_envelopes
from flamestream.fronts.lease import StampingLease
from flamestream.fronts.producers import ProducerTable
from flamestream.runtime import hosting
from flamestream.runtime.appends import Appends
from flamestream.runtime.channels import Channels, LocalEndpoints, Stream
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.storage.input_log import (
    Truncation,
    decode_record,
    encode_record,
    front_log_dir,
    plan_truncation,
    read_checkpoint,
    write_checkpoint,
)
from flamestream.storage.log import LogError, SegmentedLog, disk_full, write_durably
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc

ROLE = "front"
SEGMENT_BYTES = 64 * 1024 * 1024
"""Input-log segment size (``--log-segment-bytes``): retention deletes whole segments, so smaller ones follow
the oldest retained snapshot more closely (and cost a file pair each)."""
NO_GRAPH = (grpc.StatusCode.FAILED_PRECONDITION, "no graph deployed; run `flamestream deploy`")
MAX_PUSH_BYTES = 8 * 1024 * 1024
"""Largest Push request (``--max-push-bytes``): one request is decoded, validated and logged as a whole."""
MAX_IN_FLIGHT_EVENTS = 100_000
"""Admitted events whose global time is not complete yet (``--max-in-flight-events``): the front's credit."""
CREDIT_WAIT = 2.0
"""Seconds a push over the credit waits for the minimal time to move before RESOURCE_EXHAUSTED."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Route:
    """What one tick deploys for this front: the compiled graph and the streams to its workers and acker."""

    def __init__(self, tick: Tick, plan: Plan, local: LocalEndpoints,
                 on_broken: Callable[[_Route, hosting.StreamBroken], None]) -> None:
        self.tick = tick
        self.plan = plan
        self.balance = plan.entry_balance
        self.broken: str | None = None
        """Why pushes are refused until the next tick, once a stream has broken."""
        self._channels = Channels(local, functools.partial(on_broken, self))
        self.workers: list[Stream[pb.ItemBatch]] = [
            self._channels.stream(address, transport.EXCHANGE, f"worker {i} at {address}")
            for i, address in enumerate(tick.workers)]
        self.acker: Stream[pb.AckBatch] = self._channels.stream(tick.acker, transport.ACK, f"acker at {tick.acker}")
        self.watch: asyncio.Task[None] | None = None
        """Follows the acker's min time for the front's credit (``FrontService._watch_min_time``)."""
        self.min_time = GlobalTime(-1, -1)
        """The acker's latest min time."""
        self.pacer: asyncio.Task[None] | None = None
        """While sends are paced (``FrontService._paced``: a recovery's re-send, or pushes beyond the window), the
        task sending them."""
        self.floor: int | None = None
        """While sends are paced, the stamp of the next event not sent yet: no report passes it."""
        self.resend_end = 0
        """The input log's end offset when this recovery route was installed: the re-send reads the log below it,
        since every event logged from then on is in ``deferred``."""
        self.deferred: list[_Fresh] | None = None
        """While sends are paced, the events pushed meanwhile: logged and acknowledged, but sent by the pacer, after
        what it is sending; None while pushes are sent at once."""
        self.deferred_bytes = 0
        """The size of ``deferred``'s log records: what the pacer cuts its chunks by."""
        self.sent: deque[tuple[GlobalTime, int]] = deque()
        """(last global time, bytes) of each send the min time has not passed yet: the window
        (``SEND_WINDOW_BYTES``)."""
        self.sent_bytes = 0
        self.reported = -1
        """The highest timestamp reported on this route's acker stream (-1: none yet)."""

    def watch_min_time(self) -> Any:
        """The acker's min-time stream (an async iterator of ``pb.GlobalTime``)."""
        return self._channels.watch_min_time(self.tick.acker)

    def warm(self) -> None:
        self._channels.warm()

    async def close(self) -> None:
        tasks = [task for task in (self.watch, self.pacer) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._channels.close()


class _Fresh(NamedTuple):
    """An event being admitted now (not a retry)."""

    gt: GlobalTime
    trace: Trace
    payload: Any
    h: int
    producer: str
    sequence: int


class _Rejected(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _open_input_log(directory: Path, segment_bytes: int = SEGMENT_BYTES) -> tuple[SegmentedLog, ProducerTable, int]:
    """Open the log for writing and replay it: the producers' admitted sequences and the last timestamp used.

    After retention, the replay starts where the log does, from what the truncation marker remembers of the
    deleted records: without it, a retry of an event whose record is gone would be admitted a second time.
    With a checkpoint (``checkpoint_producers``), it starts at the checkpoint's offset instead.
    """
    log = SegmentedLog(directory, segment_bytes)
    try:
        producers = ProducerTable()
        known = Truncation.of(log.start_offset, log.start_meta)
        checkpoint = read_checkpoint(directory)
        if checkpoint is not None and log.start_offset <= checkpoint.start <= log.end_offset:
            known = checkpoint  # taken from the live table, which held the marker's producers too
        elif checkpoint is not None:
            role_logger(directory.name.replace("-", "")).warning(
                "%s: ignoring a checkpoint at offset %d outside the log (%d..%d); reading it all", directory,
                checkpoint.start, log.start_offset, log.end_offset)
        for producer, (sequence, gt) in known.producers.items():
            producers.admit(producer, sequence, gt)
        last_ts = known.last_ts
        for offset, data in log.scan(known.start):
            try:
                record = decode_record(data)
                last_ts = max(last_ts, record["ts"])
                if record["producer"]:  # "" = an anonymous event
                    producers.admit(record["producer"], record["sequence"], GlobalTime(record["ts"], record["front"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise LogError(f"{directory}: record {offset} is not a front record: {exc!r}") from exc
    except BaseException:
        log.close()
        raise
    return log, producers, last_ts


CHECKPOINT_EVERY = 1.0
"""Seconds between checkpoints of the producer table (``checkpoint_producers``)."""

RETENTION_EVERY = 1.0
"""Seconds between looks at ZooKeeper for the oldest retained complete snapshot (input-log retention)."""

LEASE_WAIT = 5.0
"""Seconds a push waits for the stamping lease to be renewed (ZooKeeper slow or away) before UNAVAILABLE."""

IDLE_REPORT_DELAY = 0.001
"""Seconds an idle lone front waits after its next stamp before reporting: into the next millisecond, so the report
passes the stamp (``_report_forever``)."""

PROMISE_STEP_MS = 1000
"""How far ahead a front persists its report promise: one small fsync per second of reports."""


CHUNK_EVENTS = 1000
"""Events per chunk when the front paces its sends (a recovery's re-send, or pushes beyond the window), at
most ..."""
CHUNK_BYTES = 32 * 1024
"""... and about this many bytes of logged records per chunk; also the most one millisecond's stamps hold
(``FrontService._spread``).  Why this small: the items of a chunk reach the groupings from every worker in any
order, and each out-of-order item replays the newer ones of its key.  Closed-loop inverted index (2 workers,
2,000 pages pushed ahead): 256 KiB chunks did 27.9 pages/s with 1.85x the work replayed, 64 KiB 38.8
pages/s (1.27x), 32 KiB 42.5 (1.13x), 16 KiB 36.2 (1.04x, more chunks' overhead).  Once, one chunk of a
thousand pages kept a worker's step (and its node's event loop) busy for over 10 s under load."""

SEND_WINDOW_BYTES = 2 * CHUNK_BYTES
"""A send (a push sent at once, or a paced chunk) goes while fewer bytes of log records than this are in flight
(sent, and not passed by the min time yet); once as many are, pushes are logged and acknowledged but wait for the
min time to pass the oldest sends (``FrontService._paced``).  Why bytes, not sends: a window of two sends
doubled word count's median latency at 1,000 lines/s (15.8 -> 33.5 ms), where some fifteen one-line pushes are
in flight and nothing replays; a page of the inverted index is a hundred lines' worth."""


def _logged_since(log: SegmentedLog, start: GlobalTime,
                  end: int) -> tuple[list[tuple[GlobalTime, Trace, Any]], int]:
    """The events logged below offset ``end`` and stamped at or after ``start``, in log (= stamp) order, and
    their records' bytes: read from the end backwards, since a recovery starts at a recent snapshot."""
    found: list[tuple[GlobalTime, Trace, Any]] = []
    size = 0
    for _offset, data in log.scan_backwards(chunk=CHUNK_EVENTS, end=end):
        record = decode_record(data)
        gt = GlobalTime(record["ts"], record["front"])
        if gt < start:
            break
        found.append((gt, (record["seq"],), record["payload"]))
        size += len(data)
    return found[::-1], size


def _whole_milliseconds(events: list[_Fresh], size: int) -> list[list[_Fresh]]:
    """``events`` (in stamp order) cut into chunks of about ``size`` that end where a millisecond does: a report
    at the next chunk's first stamp then passes every event of the chunk, so the min time can pass it."""
    chunks: list[list[_Fresh]] = []
    for event in events:
        if not chunks or (len(chunks[-1]) >= size and event.gt.ts > chunks[-1][-1].gt.ts):
            chunks.append([])
        chunks[-1].append(event)
    return chunks


def _chunking(events: int, size: int) -> tuple[int, float]:
    """Events per paced chunk, and bytes per event, when ``events`` take ``size`` bytes of log records."""
    return max(1, min(CHUNK_EVENTS, CHUNK_BYTES * events // max(size, 1))), size / max(events, 1)


def _read_promise(path: Path) -> int:
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return 0


class FrontService(rpc.FrontServicer):
    def __init__(self, front_id: int, log: SegmentedLog, producers: ProducerTable, last_ts: int,
                 max_event_bytes: int, promise_file: Path, local: LocalEndpoints,
                 store: ClusterStore | None = None, max_push_bytes: int = MAX_PUSH_BYTES,
                 max_in_flight: int = MAX_IN_FLIGHT_EVENTS, pace_pushes: bool = True) -> None:
        self.front_id = front_id
        self.pace_pushes = pace_pushes
        """Pushes beyond the send window wait for the pacer (``_paced``); off, every push is sent at once."""
        self.max_push_bytes = max_push_bytes
        self.max_in_flight = max_in_flight
        self._in_flight: deque[tuple[GlobalTime, int]] = deque()
        """(last global time, events) of each admission not known complete: what the credit counts."""
        self._in_flight_events = 0
        self._progress = asyncio.Event()
        """Set whenever the min time moves or the pressure changes: wakes pushes waiting for credit."""
        self._pressure: dict[str, str] = {}
        """Workers over their memory budget (name -> why): nothing is admitted while any is."""
        self.local = local
        self.logger = role_logger(f"front{front_id}")
        self.max_event_bytes = max_event_bytes
        self.failed = asyncio.Event()
        """Set when the front can no longer keep its promises (the input log cannot be reopened)."""
        self.failure = ""
        self._log = log
        self._appends = Appends(self.logger, "the input log")
        self._producers = producers
        self._logged_ts = last_ts
        """The highest timestamp in the log (what a checkpoint records)."""
        self._clock = FrontClock(front_id)
        self._ms_ts = self._ms_bytes = 0
        """The millisecond stamped last, and the bytes of events stamped in it (``_spread``)."""
        if last_ts >= 0:
            # A restarted front must not reuse a (ts, seq) it already logged, even if the wall clock went back.
            self._clock.report(last_ts + 1)
        self._promise_file = promise_file
        self._promised = _read_promise(promise_file)
        """Reports never exceed this persisted bound, so a restarted front never stamps below a promise it made."""
        self._clock.report(self._promised)
        self._route: _Route | None = None
        self._next: _Route | None = None
        """A hand-over tick announced but not started: events stamped at or after its start go there."""
        self._behind: _Route | None = None
        """The tick the stamps left while its recovery still caught up: it sends the rest, then closes."""
        self._known = -1
        """The newest tick number taken (ticks arrive from the node and from the lease's reads)."""
        self._lock = asyncio.Lock()
        """Orders pushes and reports: a report is written after the acks of everything stamped before it."""
        self.lease = (StampingLease(store, front_id, lambda: self._clock.next_ts(_now_ms()), lambda: self._known,
                                    self.deploy, self._lock) if store is not None else None)
        self._refusal = NO_GRAPH
        """What a push hears while there is no route: its status code and why."""
        self._reports: asyncio.Task[None] | None = None
        self._supervisor: Supervisor | None = None
        self._report_owed = False
        """A report was held back at the persisted promise (the promise file could not be written)."""
        self._unacked: int | None = None
        """The first stamp of a push whose events may be at the workers while their send acks are not at the acker
        (``_admit``): no report promises past it, and no checkpoint is taken.  A failure between the log's write and
        the acker message (a failed fsync, a log that cannot be reopened, the acker's stream, anything unexpected)
        leaves it set and stops the front (``_admit``), so the min time cannot pass events that may not be durable, or
        whose acks the acker never got, while the node stops; the recovery replays them from the log."""
        self._reportable = asyncio.Event()
        """Set when a report may be due again (an event stamped, a tick taken, a report held back): what an idle
        lone front's report loop waits for instead of its interval."""

    @classmethod
    async def open(cls, front_id: int, data_dir: Path, max_event_bytes: int, local: LocalEndpoints,
                   store: ClusterStore | None = None, segment_bytes: int = SEGMENT_BYTES,
                   max_push_bytes: int = MAX_PUSH_BYTES, max_in_flight: int = MAX_IN_FLIGHT_EVENTS,
                   pace_pushes: bool = True) -> FrontService:
        directory = front_log_dir(data_dir, front_id)
        log, producers, last_ts = await asyncio.to_thread(_open_input_log, directory, segment_bytes)
        return cls(front_id, log, producers, last_ts, max_event_bytes, directory.parent / f"promise-{front_id}",
                   local, store, max_push_bytes, max_in_flight, pace_pushes)

    # -- deployment ---------------------------------------------------------------

    def warm(self) -> None:
        """Connect the streams of the current route and of the hand-over's next one, which takes over at its start
        (``Channels.warm``)."""
        for route in (self._route, self._next):
            if route is not None:
                route.warm()

    def skip_through(self, tick: int) -> None:
        """Take no tick up to ``tick`` (a restarted front must not route under its predecessor's tick)."""
        self._known = max(self._known, tick)
        # Not "no graph deployed": the graph is there, and this front takes pushes again once the recovery its
        # restart set off is deployed.  UNAVAILABLE says "try again" to any gRPC client, not only to ours.
        self._refusal = (grpc.StatusCode.UNAVAILABLE, f"front {self.front_id} restarted while tick {tick} ran; "
                         "it takes pushes again once the cluster's recovery tick is deployed")

    async def deploy(self, tick: Tick) -> None:
        """Switch to ``tick``: its graph, workers and acker, or refuse pushes if it leaves this front out.

        A hand-over tick (one taking over the current tick's state at its
        start) does not switch at once: events stamped below its start still
        belong to the current tick, so it waits as the next route.
        """
        if tick.number <= self._known:
            return
        self._known = tick.number
        route: _Route | None = None
        if self.front_id not in tick.fronts:
            refusal = f"front {self.front_id} is not part of the deployment of tick {tick.number}"
        elif len(tick.workers) != tick.layout.workers or not tick.acker:
            refusal = (f"tick {tick.number} is malformed: {len(tick.workers)} workers for {tick.layout.workers} "
                       f"hash ranges, acker {tick.acker!r}")
        else:
            try:
                plan = compile_graph(Graph.from_dict(tick.graph))
            except Exception as exc:  # the graph's own modules may raise anything on import
                refusal = f"tick {tick.number}: cannot load the graph: {exc}"
            else:
                route, refusal = _Route(tick, plan, self.local, self._break), ""
                route.watch = asyncio.create_task(self._watch_min_time(route))
        if route is None:
            self.logger.error("%s", refusal)
        async with self._lock:
            current = self._route
            if route is not None and tick.previous is not None and current is not None and \
                    current.tick.number == tick.previous and not tick.recovery:
                old, self._next = self._next, route
                self.logger.info("tick %d takes over from tick %d at %s", tick.number, tick.previous, tick.start)
            else:
                old, self._route, self._refusal = current, route, (grpc.StatusCode.FAILED_PRECONDITION, refusal)
                behind, self._behind = self._behind, None
                if behind is not None and behind.pacer is not None:
                    # A tick that replaces the current one outright also ends an older tick's catching up: a
                    # recovery re-sends whatever it had yet to send (all above the min time, so above the last
                    # complete snapshot), and left as it was, its floor would hold back every report of the new
                    # tick for as long as its dead route cannot send.  _close_when_caught_up closes it.
                    behind.pacer.cancel()
                if route is not None:
                    self._clock.report(tick.start.ts)  # the tick covers times from its start on
                if route is not None and tick.recovery:
                    # Paced, after deploy returns: the node still has to deploy this tick to its other roles.
                    route.floor, route.resend_end, route.deferred = tick.start.ts, self._log.end_offset, []
                    assert self._supervisor is not None, "start_reports comes before any deploy"
                    route.pacer = self._supervisor.spawn(f"front{self.front_id}", f"re-send for tick {tick.number}",
                                                         self._resend(route, tick.start), finite=True)
                if self._next is not None:
                    await self._next.close()
                    self._next = None
            self._reportable.set()  # a new route to report on, or a hand-over to switch to on the interval
        if old is not None:
            await old.close()

    async def _resend(self, route: _Route, start: GlobalTime) -> None:
        """Recovery: send every logged event stamped at or after ``start`` again, with its original stamp, and
        then the events pushed meanwhile.

        The recovery tick restores the grouping state of the last complete
        snapshot at ``start``; the events after it are in this log (an event is
        acknowledged only once logged), so sending them again with their
        original global times and traces reproduces the stream the crash
        interrupted, and the barriers drop what they had released already.

        Paced (``_paced``).  Why: a backlog of minutes sent at once sits in
        worker and barrier memory, and the min time would not move until all
        of it was done — longer than the acker's stall timeout, so recovery
        would restart from the same snapshot with an even longer backlog.
        Paced, the min time moves chunk by chunk and records are released as
        they complete.  Pushes go on meanwhile, logged and acknowledged as
        usual, but their events wait in ``route.deferred``, behind the re-sent
        ones.
        """
        logged, size = await asyncio.to_thread(_logged_since, self._log, start, route.resend_end)
        pending = [_Fresh(gt, trace, payload, as_hash(route.balance(payload)), "", 0) for gt, trace, payload in logged]
        meanwhile = await self._paced(route, pending, size)
        self.logger.info("recovery: sent the %d logged events from %s on again, then the %d pushed meanwhile",
                         len(logged), start, meanwhile)

    async def _paced(self, route: _Route, pending: list[_Fresh], size: int) -> int:
        """Send ``pending`` (``size`` bytes of log records) and then the events deferred meanwhile, in chunks
        (``CHUNK_EVENTS``, ``CHUNK_BYTES``), each when the window is open (``SEND_WINDOW_BYTES``) and followed by
        a report up to the next unsent event; then switch back to sending pushes at once.  Returns how many
        deferred events it sent.

        Why: every item that reaches a grouping behind newer items of its key
        makes the grouping replay all of them, and through a cycle (a reduce)
        each replayed version replays in turn.  Sent at once, a burst of pushes
        (a closed loop, or a recovery's backlog) arrives at the groupings from
        both workers in any order, and the inverted index did its work ten
        times over (replay overhead 11 at 2,000 pages in flight) and fell
        behind.  Held to a window, the items of one key in flight at once stay
        few; the chunks grow with the backlog, so throughput does not drop.
        The last chunk and the switch back happen under the lock together, so
        no push slips between them.
        """
        per_chunk, each = _chunking(len(pending), size)
        meanwhile = 0
        while True:
            chunks = _whole_milliseconds(pending, per_chunk)
            # The last chunk waits: events pushed meanwhile may share its millisecond.
            for chunk, following in pairwise(chunks):
                await self._window(route)
                async with self._lock:
                    if not await self._send_chunk(route, chunk, following[0].gt.ts, each):
                        return meanwhile
            await self._window(route)
            async with self._lock:
                assert route.deferred is not None, "only _paced ends the pacing"
                more, route.deferred, size, route.deferred_bytes = route.deferred, [], route.deferred_bytes, 0
                if not more:
                    route.deferred = None
                    if not chunks:  # nothing at all to send: the floor goes now, or no report would ever pass it
                        route.floor = None
                        await self._report_or_break(route)
                    elif not await self._send_chunk(route, chunks[-1], None, each):
                        return meanwhile
                    return meanwhile
            meanwhile += len(more)
            per_chunk, each = _chunking(len(more), size)
            pending = (chunks[-1] if chunks else []) + more

    async def _window(self, route: _Route) -> None:
        """Wait until the window is open."""
        while not self._window_open(route):
            self._progress.clear()
            await self._progress.wait()

    def _window_open(self, route: _Route) -> bool:
        """Whether fewer than ``SEND_WINDOW_BYTES`` are in flight (the sends the min time has not passed yet).

        Sends at or after the floor do not count: the min time cannot pass
        them before the pacer sends what waits at the floor (a millisecond
        whose first events went at once and whose later ones wait), so
        counting them would stop the pacer for good.
        """
        sent = route.sent
        while sent and route.min_time > sent[0][0]:
            route.sent_bytes -= sent.popleft()[1]
        floor = route.floor
        if floor is None or not sent or sent[-1][0].ts < floor:
            return route.sent_bytes < SEND_WINDOW_BYTES
        return sum(size for last, size in sent if last.ts < floor) < SEND_WINDOW_BYTES

    def _sent(self, route: _Route, last: GlobalTime, size: int) -> None:
        route.sent.append((last, size))
        route.sent_bytes += size

    async def _send_chunk(self, route: _Route, chunk: list[_Fresh], floor: int | None, each: float) -> bool:
        """Send one paced chunk (``each`` bytes of log records an event) and report up to ``floor``, the next
        unsent stamp (None: nothing left unsent); with the lock held.  False if the route broke: the next
        recovery tick sends them again."""
        batches, acks = self._batches(route, chunk)
        try:
            await self._to_acker(route, acks)
        except _Rejected:
            return False
        await self._to_workers(route, batches)
        self._sent(route, chunk[-1].gt, round(len(chunk) * each))
        route.floor = floor
        return await self._report_or_break(route)

    async def _switch_if_due(self, ts: int) -> _Route | None:
        """The route of an event stamped ``ts``: the next tick's from its start on (which then becomes current).

        Called with the lock held, so a push or report never straddles the switch.
        """
        nxt = self._next
        if nxt is not None and ts >= nxt.tick.start.ts:
            old, self._route, self._next = self._route, nxt, None
            self.logger.info("switched to tick %d at %d", nxt.tick.number, ts)
            if old is not None and old.deferred is not None:
                # Still catching up after a recovery: what it has yet to send lies below the switch, and tick
                # n's workers must get it, or the hand-over's snapshot never completes.
                assert self._supervisor is not None, "start_reports comes before any deploy"
                self._behind = old
                self._supervisor.spawn(f"front{self.front_id}", f"catching up on tick {old.tick.number}",
                                       self._close_when_caught_up(old), finite=True)
            elif old is not None:
                await old.close()
        return self._route

    async def _close_when_caught_up(self, route: _Route) -> None:
        try:
            if route.pacer is not None:
                await asyncio.wait([route.pacer])
        finally:
            async with self._lock:
                if self._behind is route:
                    self._behind = None
                    if self._route is not None and self._route.broken is None:
                        # The reports the floor held back: a lone front counts its clock covered and would not
                        # report again until its next push.
                        with contextlib.suppress(hosting.StreamBroken):
                            await self._report(self._route)
            await route.close()

    def _break(self, route: _Route, exc: hosting.StreamBroken) -> None:
        if route.broken is None:
            route.broken = f"{exc}; waiting for a new tick"
            self.logger.error("%s", route.broken)
            if self._supervisor is not None:  # a dead peer: the node restarts at once, for the recovery
                self._supervisor.peer_lost(f"front{self.front_id}", str(exc), exc,
                                           lambda: route in (self._route, self._next, self._behind))

    # -- pushes ------------------------------------------------------------------

    async def Push(self, request: pb.PushRequest,
                   context: grpc.aio.ServicerContext[pb.PushRequest, pb.PushResponse]) -> pb.PushResponse:
        # Shielded: gRPC cancels the handler when the client gives up, but an admission that has begun must finish,
        # or the log, the acker and the workers would disagree (and the log could get two writers at once).
        refused = self._budget(request) or await self._wait_for_credit(len(request.events))
        outcome = refused if refused is not None else await asyncio.shield(self._push(request))
        if isinstance(outcome, _Rejected):
            await context.abort(outcome.code, outcome.message)
        return outcome

    async def _push(self, request: pb.PushRequest) -> pb.PushResponse | _Rejected:
        deadline = time.monotonic() + LEASE_WAIT
        while True:
            # The lease is waited for without the lock: its renewal deploys the ticks it finds, which takes the
            # lock, so a push waiting under it (a restarted front's first) held its own renewal up for LEASE_WAIT.
            if self.lease is not None and not await self.lease.covering(self._clock.next_ts(_now_ms()),
                                                                        max(0.0, deadline - time.monotonic())):
                return _Rejected(grpc.StatusCode.UNAVAILABLE, f"the front's stamping lease in ZooKeeper ends at "
                                 f"{self.lease.until} and was not renewed within {LEASE_WAIT:g}s")
            async with self._lock:
                now = _now_ms()
                if self.lease is None or self._clock.next_ts(now) < self.lease.until:
                    return await self._push_locked(request, now)
            # The clock passed the lease while this push waited for the lock: wait for the next renewal.

    async def _push_locked(self, request: pb.PushRequest, now: int) -> pb.PushResponse | _Rejected:
        """The push, under the lock and within the stamping lease."""
        try:
            if self.failed.is_set():
                raise _Rejected(grpc.StatusCode.UNAVAILABLE, f"front is stopping: {self.failure}")
            ts = self._clock.next_ts(now)
            route = await self._switch_if_due(ts)
            if route is None:
                raise _Rejected(*self._refusal)
            if route.broken is not None:
                raise _Rejected(grpc.StatusCode.UNAVAILABLE, route.broken)
            self._check_credit(len(request.events))  # again under the lock: concurrent pushes took credit
            self._check_producers(request.events)
            checked = self._validate(request.events, route)
            response, fresh = self._stamp(request.events, checked, now, self._stamp_bound())
            if fresh:
                await self._admit(route, fresh)
            return response
        except _Rejected as rejected:
            return rejected

    # -- per-push budget and credit ----------------------------------------------

    def _budget(self, request: pb.PushRequest) -> _Rejected | None:
        """Refuse a request larger than ``max_push_bytes`` before anything else looks at it.

        Why: a request is decoded, validated, logged and fanned out as a
        whole while the front's lock is held; the per-event limit alone lets a
        single request of many large events (100 x 400 KB) occupy the front
        and amplify downstream.  Permanent: split the request instead.
        """
        size = request.ByteSize()
        if size > self.max_push_bytes:
            if len(request.events) == 1 and (event := request.events[0].ByteSize()) > self.max_event_bytes:
                return self._too_large(0, event)  # one event, over its own limit: say that one
            return _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"push of {size} bytes exceeds the limit of {self.max_push_bytes} (--max-push-bytes); "
                             "send fewer events per request")
        return None

    def _too_large(self, i: int, size: int) -> _Rejected:
        return _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"event {i}: {size} bytes exceeds the limit of {self.max_event_bytes} (--max-event-bytes)")

    def _has_credit(self, events: int) -> bool:
        """Whether ``events`` more may be admitted: no worker is over its memory budget, and the in-flight count
        stays within ``max_in_flight`` (a request alone above it still goes when nothing is in flight, or it
        could never go)."""
        return not self._pressure and (self._in_flight_events == 0 or
                                       self._in_flight_events + events <= self.max_in_flight)

    def _no_credit(self) -> _Rejected:
        if self._pressure:
            return _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"{'; '.join(self._pressure[w] for w in sorted(self._pressure))} {RETRY_HINT}")
        return _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{self._in_flight_events} admitted events are still in flight, the limit is "
                         f"{self.max_in_flight} (--max-in-flight-events) {RETRY_HINT}")

    async def watch_pressure(self, store: ClusterStore) -> None:
        """Follow the workers' memory pressure (``WorkerService.report_pressure``) from now on."""
        loop = asyncio.get_running_loop()

        def changed(pressure: dict[str, str]) -> None:  # kazoo's thread
            loop.call_soon_threadsafe(self._on_pressure, pressure)

        await asyncio.to_thread(store.watch_pressure, changed)

    def _on_pressure(self, pressure: dict[str, str]) -> None:
        if pressure.keys() != self._pressure.keys():
            self.logger.warning("admission %s", f"paused: {'; '.join(pressure.values())}" if pressure else "resumed")
        self._pressure = {w: reason or f"{w} is over its memory budget" for w, reason in pressure.items()}
        self._progress.set()

    async def _wait_for_credit(self, events: int) -> _Rejected | None:
        """Backpressure: wait up to ``CREDIT_WAIT`` for the min time to retire enough admitted events.

        Why: admitting faster than the workers complete only moves the queue
        into worker and barrier memory (the acker, the groupings and the
        barrier hold every in-flight item).  Credit bounds that; a client
        refused after the short wait retries with backoff (the SDK does).
        Outside the lock, so reports (which move the min time) go on.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CREDIT_WAIT
        while not self._has_credit(events):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self._no_credit()
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._progress.wait()
        return None

    def _check_credit(self, events: int) -> None:
        if not self._has_credit(events):
            raise self._no_credit()

    def _take_credit(self, admitted: list[_Fresh]) -> None:
        if admitted:  # stamped in increasing time: the last one completes last
            self._in_flight.append((admitted[-1].gt, len(admitted)))
            self._in_flight_events += len(admitted)

    def _retire(self, min_time: GlobalTime) -> None:
        """Everything admitted below ``min_time`` is complete: give its credit back."""
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] < min_time:
            self._in_flight_events -= in_flight.popleft()[1]
        self._progress.set()

    async def _watch_min_time(self, route: _Route) -> None:
        """Follow the acker's min time for as long as ``route`` is deployed (cancelled when it closes)."""
        while True:
            try:
                async for min_time in route.watch_min_time():
                    route.min_time = GlobalTime(min_time.ts, min_time.front)
                    self._retire(route.min_time)
            except Exception as exc:  # the acker restarting or moving: pushes wait for credit meanwhile
                self.logger.debug("min-time watch ended (%s); watching again", exc)
            await asyncio.sleep(0.2)

    def _check_producers(self, events: Sequence[pb.Event]) -> None:
        """Producer ids and sequence numbers (``limits.producer_fault`` / ``sequence_fault``), by event index.

        Why: an id is kept in memory, in every input-log record and in the
        truncation marker, so its length is bounded; ids starting with ``~``
        belong to the SDK's anonymous producers; and a sequence at the top of
        uint64 would leave its producer no larger number to continue with.
        """
        for i, event in enumerate(events):
            if event.producer:
                fault = producer_fault(event.producer) or sequence_fault(event.sequence)
                if fault is not None:
                    raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"event {i}: {fault}")

    def _validate(self, events: Sequence[pb.Event], route: _Route) -> list[tuple[Any, int]]:
        """Payload and entry hash of every event, or the first fault: nothing is admitted from a faulty request.

        Everything a worker could not process or write is refused here, by event
        index (``decode_event``: an object with a key twice; ``check_payload``: lone
        surrogates, NaN/Infinity, nesting deeper than ``MAX_DEPTH``): once admitted, an event's ack is at the acker, and
        a failure further on would hold the minimal time back for good.  The
        entry hash goes through ``as_hash`` like every other hash (folded into
        int32; no integer at all is a fault) — the local runtime and the oracle
        ask the same (``worker.entry_hash``).
        """
        checked: list[tuple[Any, int]] = []
        for i, event in enumerate(events):
            size = event.ByteSize()
            if size > self.max_event_bytes:
                raise self._too_large(i, size)
            try:
                payload = payloads.decode_event(event.payload)
            except payloads.PayloadError as exc:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"event {i}: {exc}") from None
            fault = payloads.check_payload(payload)
            if fault is not None:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"event {i}: {fault}")
            try:
                h = as_hash(route.balance(payload))
            except BalanceError as exc:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"event {i}: {exc}") from None
            except Exception as exc:  # business logic: anything can go wrong (its message too: made writable)
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, writable(
                    f"event {i}: balancing function failed: {type(exc).__name__}: {exc}")) from None
            checked.append((payload, h))
        return checked

    def _stamp_bound(self) -> int | None:
        """The timestamp no stamp may reach: the stamping lease's end, and a hand-over's start (events at or after
        it belong to the next tick, which this push does not go to)."""
        bounds = [bound for bound in (self.lease.until if self.lease is not None else None,
                                      self._next.tick.start.ts if self._next is not None else None)
                  if bound is not None]
        return min(bounds) if bounds else None

    def _spread(self, now: int, size: int, bound: int | None) -> None:
        """Move the clock to the next millisecond before an event of ``size`` bytes that would take the current
        one past ``CHUNK_BYTES``, unless that reaches ``bound``.

        Why: the events of one millisecond share a global time, and a global
        time completes, is re-sent and paced (``_paced``) only as a whole.  A
        push of 512 pages stamped in one millisecond was one global time of
        150k postings, sent at once: its replays kept it in flight past the
        acker's stall timeout, and every recovery re-sent it whole, forever.
        """
        ts = self._clock.next_ts(now)
        if ts != self._ms_ts:
            self._ms_ts, self._ms_bytes = ts, 0
        elif self._ms_bytes and self._ms_bytes + size > CHUNK_BYTES and (bound is None or ts + 1 < bound):
            self._clock.report(ts + 1)
            self._ms_ts, self._ms_bytes = ts + 1, 0
        self._ms_bytes += size

    def _stamp(self, events: Sequence[pb.Event], checked: list[tuple[Any, int]],
               now: int, bound: int | None) -> tuple[pb.PushResponse, list[_Fresh]]:
        """Tell retries from new events (also within this request) and give each new event its global time."""
        response = pb.PushResponse()
        fresh: list[_Fresh] = []
        staged: dict[str, dict[int, GlobalTime]] = {}  # this request's new sequences per producer, in order
        for event, (payload, h) in zip(events, checked, strict=True):
            producer, sequence = event.producer, event.sequence
            if producer:
                mine = staged.setdefault(producer, {})
                last = next(reversed(mine)) if mine else self._producers.last(producer)
                if sequence <= last:
                    original = mine.get(sequence)
                    if original is None:
                        original = self._producers.time_of(producer, sequence)
                    response.admitted.append(False)
                    # A retry older than the remembered window gets the unset time (0, 0).
                    response.times.append(pb.GlobalTime() if original is None
                                          else pb.GlobalTime(ts=original.ts, front=original.front))
                    continue
            self._spread(now, len(event.payload), bound)
            gt, trace = self._clock.stamp(now)
            if producer:
                mine[sequence] = gt
            fresh.append(_Fresh(gt, trace, payload, h, producer, sequence if producer else 0))
            self._reportable.set()
            response.admitted.append(True)
            response.times.append(pb.GlobalTime(ts=gt.ts, front=gt.front))
        return response, fresh

    async def _admit(self, route: _Route, fresh: list[_Fresh]) -> None:
        """Log, send and ack ``fresh``; while sends are paced, log it and leave the sending to the pacer.

        Unpaced, the workers get the events between their log write and its
        fsync (``_send_durably``), so they start while the disk syncs: the
        fsync was 0.3-0.5 ms of a word count line's 4-5 ms (p50 4.70 -> 4.13
        ms at 1,000 lines/s, in turns).
        """
        # (ts, front, seq) reproduce the item's global time and initial trace (seq,) for replay and recovery.
        records = [encode_record(event.gt, event.trace[0], event.payload, event.producer, event.sequence)
                   for event in fresh]
        size = sum(map(len, records))
        if self.pace_pushes and route.deferred is None and (size > CHUNK_BYTES or not self._window_open(route)):
            self._pace(route, fresh[0].gt.ts)
        first = self._log.end_offset
        if route.deferred is None:
            self._unacked = fresh[0].gt.ts
            try:
                await self._send_durably(route, fresh, records, first, size)
            finally:
                if self._unacked is not None:
                    self._fail("a push failed between its input-log write and its acks; the recovery replays what "
                               "the log holds")
            return
        try:
            await self._appends.run(self._log.append_many, records)
        except (OSError, LogError) as exc:
            await self._salvage(route, fresh, first, exc, size)
            return
        self._commit(fresh)
        self._take_credit(fresh)
        await self._send_or_defer(route, fresh, [], size)

    async def _send_durably(self, route: _Route, fresh: list[_Fresh], records: list[bytes], first: int,
                            size: int) -> None:
        """Write ``records`` to the log, send ``fresh`` to the workers, fsync, then the acks and the report past
        them; ``_unacked`` (set by the caller) is cleared once they are at the acker.

        Nothing of the events completes before they are durable: the acker
        hears of them only after the fsync, and nothing promises past them
        meanwhile (the lock, and ``_unacked`` for ``_report``); the workers'
        acks alone never add up to a completed time.  A full disk fails the
        write, before anything was sent (``_salvage``).  Any failure after the
        write that leaves them unacked (the fsync, the acker's stream, the
        unexpected) stops the front with the hold in place (``_admit``): the
        recovery replays what the log holds.
        """
        sends, acks = self._batches(route, fresh)
        try:
            await self._appends.write(self._log.write_many, records)
        except (OSError, LogError) as exc:
            await self._salvage(route, fresh, first, exc, size)
            return
        await self._to_workers(route, sends)
        try:
            await self._appends.publish(self._log.publish, records)
        except (OSError, LogError) as exc:
            self._fail(f"input log failed to sync ({exc}); its events reached the workers, the recovery replays "
                       "what the log holds")
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, f"front is stopping: {self.failure}") from None
        self._commit(fresh)  # durable, so admitted, whatever happens to their acks
        self._take_credit(fresh)
        self._sent(route, fresh[-1].gt, size)
        with contextlib.suppress(_Rejected):  # the acker's stream broke (``_break``): the push stands, the hold too
            await self._to_acker(route, acks, self._report_with_acks(route))
            self._unacked = None

    def _fail(self, reason: str) -> None:
        """Stop the front (``FrontRole._watch_log``) for ``reason``, the first one given."""
        if not self.failed.is_set():
            self.failure = reason
            self.failed.set()

    def _pace(self, route: _Route, floor: int) -> None:
        """From the push stamped ``floor`` on, hand the sending to a pacer (``_paced``) until it caught up."""
        assert self._supervisor is not None, "start_reports comes before any push"
        route.floor, route.deferred = floor, []
        route.pacer = self._supervisor.spawn(f"front{self.front_id}", f"paced sends of tick {route.tick.number}",
                                             self._paced(route, [], 0), finite=True)

    async def _send_or_defer(self, route: _Route, admitted: list[_Fresh],
                             sends: list[tuple[int, pb.ItemBatch]], size: int) -> None:
        if route.deferred is not None:
            route.deferred.extend(admitted)
            route.deferred_bytes += size
        else:
            await self._to_workers(route, sends)
            if admitted:
                self._sent(route, admitted[-1].gt, size)

    async def _salvage(self, route: _Route, fresh: list[_Fresh], first: int, exc: Exception, size: int) -> None:
        """After a failed write: reopen the log, and admit the records that did reach it (nothing of the batch
        was sent or acked yet).

        A log that failed refuses further appends until reopened, and reopening
        (which cuts a torn tail and fsyncs) may find that a prefix of the batch
        was written after all.  Those records are durable input now, so they
        are processed like any admitted event; their clients got an error and
        learn their times by retrying with the same producer and sequence.
        """
        try:
            kept = await asyncio.to_thread(self._reopen_log, first)
        except (OSError, LogError) as reopen_exc:
            # Nothing of the batch was sent, acked or promised past: the recovery replays what the log holds.
            self._fail(f"input log failed ({exc}) and cannot be reopened ({reopen_exc})")
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, f"front is stopping: {self.failure}") from None
        survivors = fresh[:kept]
        self._commit(survivors)  # in the log, so admitted, whatever happens to their delivery
        self._take_credit(survivors)
        sends: list[tuple[int, pb.ItemBatch]] = []
        if route.deferred is None:  # else the survivors wait for the catching up like any paced push
            sends, acks = self._batches(route, survivors)
            await self._to_acker(route, acks)
            self._unacked = None  # what was written and not kept was neither sent nor acked
        await self._send_or_defer(route, survivors, sends, size * len(survivors) // max(len(fresh), 1))
        if kept < len(fresh):
            full = disk_full(exc)
            raise _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED if full else grpc.StatusCode.UNAVAILABLE,
                            f"{'disk full: ' if full else ''}input log write failed ({exc}); {kept} of the "
                            f"{len(fresh)} new events reached it and are admitted (retry with the same producer and "
                            f"sequence to learn their times) {RETRY_HINT}")

    def _reopen_log(self, first: int) -> int:
        """Reopen the input log; returns how many records of the batch that started at ``first`` it holds."""
        self._log = self._log.reopen()
        return self._log.end_offset - first

    def _batches(self, route: _Route, fresh: list[_Fresh]) -> tuple[list[tuple[int, pb.ItemBatch]],
                                                                   dict[GlobalTime, int]]:
        """One batch per destination worker, and the XOR of all their send acks for the acker."""
        per_worker = front_envelopes(route.plan, route.tick.layout,
                                     [(event.h, (event.payload, event.gt, event.trace, False)) for event in fresh])
        sends: list[tuple[int, pb.ItemBatch]] = []
        total: dict[GlobalTime, int] = {}
        for worker, envelopes in per_worker.items():
            acks = codec.new_acks(dict.fromkeys(envelope[2][1] for envelope in envelopes))
            codec.xor_into(total, acks)
            sends.append((worker, codec.encode_batch(envelopes, acks, sender=-1 - self.front_id,
                                                           tick=route.tick.number)))
        return sends, total

    def _report_with_acks(self, route: _Route) -> pb.Report | None:
        """A report past this push's stamps, to ride with their acks; None where ``_report_forever`` decides.

        Why: the min time can pass a push only once its front promised
        nothing older will come, and the reports' loop promises the clock's
        time: a millisecond after the push at the earliest, then every report
        interval under load.  That wait was 1.5 ms of a word count's 4 ms from
        admission to release at 1,000 lines/s.  A promise in the acks' own
        message costs no message of its own, and the acker applies the acks
        first, so the promise cannot pass the push before its items are done.
        Not during a hand-over or a recovery's re-send (the loop's ``_report``
        bounds those promises), nor past the persisted promise (the loop
        persists further first).  A lone front whose stamps are all covered
        has nothing left for its loop to report.
        """
        if (route is not self._route or self._next is not None or self._behind is not None or route.floor is not None
                or self._report_owed):
            return None
        ts = self._clock.report_past_stamps(_now_ms(), self._promised)
        if ts is None:
            return None
        route.reported = max(route.reported, ts)
        if len(route.tick.fronts) == 1:
            self._reportable.clear()
        return pb.Report(front=self.front_id, ts=ts)

    async def _to_acker(self, route: _Route, acks: dict[GlobalTime, int], report: pb.Report | None = None) -> None:
        try:
            await route.acker.write(pb.AckBatch(acks=codec.ack_messages(acks), report=report, tick=route.tick.number))
        except hosting.StreamBroken as exc:
            self._break(route, exc)
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, str(route.broken)) from None

    async def _to_workers(self, route: _Route, sends: list[tuple[int, pb.ItemBatch]]) -> None:
        # The events are in the log and their acks go to the acker (after their fsync, ``_admit``), so a lost batch
        # stalls the minimal time (until recovery replays the input log) instead of losing data: the push itself
        # still succeeds.
        for worker, batch in sends:
            try:
                await route.workers[worker].write(batch)
            except hosting.StreamBroken as exc:
                self._break(route, exc)

    def _commit(self, admitted: list[_Fresh]) -> None:
        for event in admitted:
            if event.producer:
                self._producers.admit(event.producer, event.sequence, event.gt)
        if admitted:
            self._logged_ts = max(self._logged_ts, admitted[-1].gt.ts)

    async def checkpoint_producers(self) -> None:
        """Every ``CHECKPOINT_EVERY`` s that the log grew, record the producer table and the highest logged
        timestamp at the log's end (``write_checkpoint``), so a restart reads back only what came after.

        Taken under the lock pushes hold across append and commit, so every record below the offset is in the
        table; written outside it.  A failure is logged and retried: an old checkpoint only means reading more.
        """
        written = -1
        while True:
            await asyncio.sleep(CHECKPOINT_EVERY)
            async with self._lock:
                offset = self._log.end_offset
                if offset == written or self._unacked is not None:  # the latter: a push failed half way
                    continue
                state = Truncation(start=offset, last_ts=self._logged_ts, producers=self._producers.lasts())
            try:
                await asyncio.to_thread(write_checkpoint, self._log.directory, state)
            except OSError:
                self.logger.warning("cannot write the input log's checkpoint; a restart reads more of the log",
                                    exc_info=True)
                continue
            written = offset

    # -- reports -----------------------------------------------------------------

    def start_reports(self, interval: float, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._reports = supervisor.spawn(f"front{self.front_id}", "reports", self._report_forever(interval))

    async def _report_forever(self, interval: float) -> None:
        """Promise the acker every ``interval`` that nothing older will come.

        Another front's items wait for this front's promise to pass them, so
        with several fronts an idle front keeps reporting.  A front of its
        own only reports while something it stamped is not covered yet (most
        pushes are covered by the promise their acks carry, ``_report_with_acks``): idle,
        it sends nothing (reports are a few hundred microseconds of CPU each
        on both ends), and it does not even wake every ``interval`` to find
        that out (200 wake-ups a second were 5 % of a core on an idle node)
        but waits for ``_reportable``.  Its next stamp is reported a
        millisecond later (a report in the stamp's own millisecond would
        not pass it), then every ``interval`` while stamps keep coming.  A
        hand-over tick announced keeps it on the interval, which is what
        switches to the tick at its start; and a tick's route reports at
        least once past the tick's start, covered or not: the old tick's
        hand-over completes only when the min time passes that start, and
        on an idle cluster nothing else takes it there (``deploy`` and
        ``scale`` waited for the next push, and timed out without one).
        """
        idle = True  # until the first tick: nothing to report on
        while True:
            if idle:
                await self._reportable.wait()
                await asyncio.sleep(IDLE_REPORT_DELAY)
            else:
                await asyncio.sleep(interval)
            async with self._lock:
                self._reportable.clear()  # under the lock: what sets it after this is seen by the next turn
                route = await self._switch_if_due(self._clock.next_ts(_now_ms()))
                idle = False
                if route is None or route.broken is not None:
                    continue
                if len(route.tick.fronts) == 1 and self._clock.covered() and not self._report_owed:
                    if route.reported < route.tick.start.ts and route.floor is None:  # (a pacer reports itself)
                        await self._report_or_break(route)
                    idle = self._next is None
                    continue
                await self._report_or_break(route)

    async def _report_or_break(self, route: _Route) -> bool:
        """``_report``; False, with the route broken, if its acker stream broke."""
        try:
            await self._report(route)
        except hosting.StreamBroken as exc:
            self._break(route, exc)
            return False
        return True

    async def _report(self, route: _Route) -> None:
        """Promise the acker the clock's time now, persisted ahead first (a restarted front never stamps below
        a time it promised), but not past a recovery's next unsent event; called with the lock held."""
        ts = self._clock.report(_now_ms())
        if ts > self._promised:  # persist ahead, in steps, before promising past the persisted bound
            try:
                # Durably replaced: a crash leaves the old or the new bound, never a torn one.
                await asyncio.to_thread(write_durably, self._promise_file, str(ts + PROMISE_STEP_MS).encode())
                self._promised, self._report_owed = ts + PROMISE_STEP_MS, False
            except OSError as exc:
                # Disk full: promise only the persisted bound, and keep trying (the clock now counts as
                # covered, so without ``_report_owed`` a lone front would stop reporting for good).
                if not self._report_owed:
                    self.logger.warning("cannot persist the report promise (%s); reporting at most %d",
                                        exc, self._promised)
                self._report_owed, ts = True, self._promised
                self._reportable.set()
        for r in (route, self._route, self._behind):
            if r is not None and r.floor is not None:  # the acker's table spans ticks: every route's floor holds
                ts = min(ts, r.floor)
        if self._unacked is not None:  # held since a push failed between its log write and its acks
            ts = min(ts, self._unacked)
        if route is not self._route and self._route is not None:
            # A route the stamps left (catching up after a hand-over) promises up to the switch only: on its own
            # stream, a promise past it could overtake the acks the current tick sends on another.
            ts = min(ts, self._route.tick.start.ts)
        await route.acker.write(pb.AckBatch(report=pb.Report(front=self.front_id, ts=ts), tick=route.tick.number))
        route.reported = max(route.reported, ts)

    # -- input-log retention -----------------------------------------------------

    async def retain_input(self, store: ClusterStore) -> None:
        """Every ``RETENTION_EVERY`` s, delete the input-log segments wholly below the oldest retained complete
        snapshot.

        Why that bound: events below it are in every retained snapshot's
        state, so nothing can need them — neither a hand-over falling back
        to the oldest retained snapshot nor a replay from it — while every
        event at or after it may be re-processed.  The segments to delete are
        found on a read-only view of the log without the lock
        (``plan_truncation``: records are compared by global time (ts,
        front), a record *at* the boundary stays); only deleting them takes
        the lock pushes hold, so no append runs meanwhile.  A failure (ZooKeeper
        away, a damaged segment) is logged and retried: keeping the log a
        little longer is always safe.
        """
        logger = self.logger
        seen = SnapshotsSeen()
        while True:
            await asyncio.sleep(RETENTION_EVERY)
            try:
                oldest = await asyncio.to_thread(store.oldest_complete_snapshot, seen)
                if oldest is None:
                    continue
                below = boundary_of(oldest)
                plan = await asyncio.to_thread(plan_truncation, self._log.directory, below)
                if plan is None:
                    continue
                offset, state = plan
                async with self._lock:
                    start = await asyncio.to_thread(self._log.truncate_before, offset, state.meta())
            except Exception:
                logger.warning("input-log retention failed; the log is kept for now", exc_info=True)
                continue
            logger.info("input log now starts at offset %d: deleted the events up to %s (the oldest retained "
                        "complete snapshot is below %s)", start,
                        f"{state.last.ts}-{state.last.front}" if state.last else "-", oldest)

    # -- shutdown ----------------------------------------------------------------

    async def close(self) -> None:
        """Stop reporting, end the streams cleanly and close the input log."""
        async with self._lock:  # no push or report is half done once this is held
            route, self._route = self._route, None
            self._refusal = (grpc.StatusCode.UNAVAILABLE, "front is shutting down")
            if self._reports is not None:
                self._reports.cancel()
        if self._reports is not None:
            await asyncio.wait([self._reports])
        if route is not None:
            await route.close()
        self._log.close()


class FrontFailed(Exception):
    """The front can no longer keep its promises."""


class FrontRole:
    """Front ``front_id`` as a role of a node (see ``flamestream.runtime.node``)."""

    kind = ROLE

    def __init__(self, service: FrontService, report_interval_ms: int) -> None:
        self.service = service
        self.name = f"front{service.front_id}"
        self._report_interval = report_interval_ms / 1000

    @classmethod
    async def open(cls, front_id: int, data_dir: Path, local: LocalEndpoints, store: ClusterStore, *,
                   report_interval_ms: int = 5, max_event_bytes: int = 1 << 20,
                   segment_bytes: int = SEGMENT_BYTES, max_push_bytes: int = MAX_PUSH_BYTES,
                   max_in_flight: int = MAX_IN_FLIGHT_EVENTS, pace_pushes: bool = True) -> FrontRole:
        """Open (and replay) the front's input log; exits naming the log if it cannot."""
        try:
            service = await FrontService.open(front_id, data_dir, max_event_bytes, local, store, segment_bytes,
                                              max_push_bytes, max_in_flight, pace_pushes)
        except (OSError, LogError) as exc:
            raise SystemExit(f"front {front_id}: cannot open the input log: {exc}") from None
        return cls(service, report_interval_ms)

    def info(self) -> dict[str, Any]:
        return {"id": self.service.front_id}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        codec.add_servicer(server, self.service, pb.DESCRIPTOR.services_by_name["Front"])

    def start(self, supervisor: Supervisor) -> None:
        self.service.start_reports(self._report_interval, supervisor)
        if self.service.lease is not None:
            supervisor.spawn(self.name, "stamping lease", self.service.lease.run())
            supervisor.spawn(self.name, "input-log retention", self.service.retain_input(self.service.lease.store))
            supervisor.spawn(self.name, "memory pressure", self.service.watch_pressure(self.service.lease.store),
                             finite=True)
        supervisor.spawn(self.name, "input-log checkpoints", self.service.checkpoint_producers())
        supervisor.spawn(self.name, "input log", self._watch_log(), essential=True)

    async def _watch_log(self) -> None:
        await self.service.failed.wait()
        raise FrontFailed(self.service.failure)

    async def deploy(self, tick: Tick) -> None:
        await self.service.deploy(tick)

    def warm(self) -> None:
        self.service.warm()

    def skip_through(self, tick: int) -> None:
        # The stamping lease reads the ticks after the newest known one: not these.
        self.service.skip_through(tick)

    async def close(self) -> None:
        await self.service.close()
