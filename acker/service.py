"""Acker servicer and process lifecycle.

A tick that starts afresh replaces the ack table with a new one for the
tick's fronts, starting at the tick's start timestamp (entries in flight under
the previous table are dropped).  A hand-over tick with the same fronts keeps
the table: it tracks global times, whichever tick's items carry them.

Every ack batch names its sender's tick (``TickGate``): a batch of a tick the
acker has not seen yet waits for it (applied to the old table, it would be
dropped with it, and its global times would stay in flight in the new one),
and a batch of a tick older than the table is dropped.

All state lives on the event loop thread, so no locks are needed: an ``Ack``
message is applied, and its min-time change published, without yielding.

Failure detection (issue #11): a batch that never arrives, or a worker that
stopped working, leaves a global time in flight while the rest completes.
The stall watch looks every ``STALL_CHECK`` seconds; once a global time is
stuck for ``--stall-timeout`` (``StallDetector``) it logs it and fails as an
essential task, so the node exits 1, is restarted, and the cluster recovers
from its last complete snapshot (``flamestream.runtime.recovery``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from flamestream.core.acker import AckTable, StallDetector
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Tick
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.logs import role_logger
from flamestream.runtime.supervision import Supervisor
from flamestream.runtime.tick_gate import TickGate
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as pb_grpc

log = role_logger("acker")

AckContext = grpc.aio.ServicerContext[pb.AckBatch, pb.Empty]
WatchContext = grpc.aio.ServicerContext[pb.Empty, pb.GlobalTime]

STALL_TIMEOUT = 30.0
"""Default ``--stall-timeout``: seconds a global time may stay in flight while the min time does not move."""
STALL_CHECK = 0.5
"""Seconds between the stall watch's looks at the table."""


class Stalled(Exception):
    """A global time stayed in flight far longer than the stream's pace: a lost batch or a stuck worker."""


class _Latest:
    """One watcher's mailbox holding only the newest min time.

    A watcher that reads slowly (or whose client stopped reading) skips
    intermediate values instead of queueing them, so publishing never waits on
    it and memory per watcher stays constant.  Min times only matter as "the
    newest bound", so nothing is lost by skipping.
    """

    def __init__(self) -> None:
        self._value: GlobalTime | None = None
        self._closed = False
        self._changed = asyncio.Event()

    def put(self, value: GlobalTime) -> None:
        self._value = value
        self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def get(self) -> GlobalTime | None:
        """The newest value not taken yet, waiting for one; None once closed."""
        await self._changed.wait()
        self._changed.clear()
        return None if self._closed else self._value


class AckerService(pb_grpc.AckerServicer):
    def __init__(self) -> None:
        self._table: AckTable | None = None
        self._fronts: frozenset[int] = frozenset()
        self._tick: int | None = None
        """The latest tick this table runs for (a hand-over carries the table on to its tick)."""
        self._min: GlobalTime | None = None
        """The newest min time: where a new watcher starts."""
        self._published: GlobalTime | None = None
        """The min time last sent to the watchers (see AckTable.worth_publishing)."""
        self._handover: GlobalTime | None = None
        """The start of a hand-over tick: the min time reaching it is always published, even if only reports
        moved it (the previous tick's workers hand over on it, and the new tick's items wait for that)."""
        self._watchers: set[_Latest] = set()
        self._closing = False
        self._gate = TickGate()
        """Batches wait for their tick, and those of a tick older than the table are dropped."""
        self._stalls: StallDetector | None = None
        """The stall watch's view of the current table (None: it starts afresh at its next look)."""

    def deploy(self, tick: Tick) -> None:
        """Start tick ``tick`` with an empty table, or, for a hand-over from the tick this table runs with the
        same fronts, keep the table.

        The table is indexed by global time, not by tick: during a hand-over
        the previous tick's items (below the new tick's start) and the new
        tick's are tracked side by side, and the min time passing the start
        is what tells the previous tick's workers to hand their state over.

        A recovery tick also names a ``previous`` (the tick whose snapshot it
        starts from), but it always starts empty at its start, as the recovery
        procedure says: a table carried into it would keep the crashed tick's
        in-flight times (stuck: their items died with a worker), holding the
        min time until the stall watch restarted the cluster again.  Recovery
        restarts every process, so an acker normally meets a recovery tick
        with no table at all; this rule keeps it right when it does not.
        """
        if not tick.fronts:
            log.error("ignoring tick %d: it has no fronts", tick.number)
            return
        if not tick.recovery and tick.previous is not None and tick.previous == self._tick and \
                self._table is not None and frozenset(tick.fronts) == self._fronts:
            log.info("tick %d takes over at %s; the ack table carries on", tick.number, tick.start)
            self._tick, self._handover = tick.number, tick.start
            self._gate.deploy(tick.number, fresh=False)
            return
        self._tick = tick.number
        self._handover = None
        self._table = AckTable(tick.fronts, start_ts=tick.start.ts)
        self._stalls = None  # a new table: what was stuck in the old one is gone
        self._published = None
        self._fronts = frozenset(tick.fronts)
        self._gate.deploy(tick.number, fresh=True)
        self._publish(self._table.min_time())

    def close(self) -> None:
        """End every watch stream (with UNAVAILABLE, so clients know to reconnect elsewhere)."""
        self._closing = True
        for watcher in self._watchers:
            watcher.close()

    def _publish(self, min_time: GlobalTime) -> None:
        self._min = min_time
        assert self._table is not None
        handover = self._handover is not None and min_time >= self._handover
        if not handover and not self._table.worth_publishing(self._published, min_time):
            return
        if handover:
            self._handover = None
        self._published = min_time
        for watcher in self._watchers:
            watcher.put(min_time)

    async def watch_stalls(self, timeout: float) -> None:
        """Raise ``Stalled`` once a global time is stuck in flight (see ``StallDetector``)."""
        while True:
            await asyncio.sleep(STALL_CHECK)
            table = self._table
            if table is None:
                continue
            if self._stalls is None:
                self._stalls = StallDetector(timeout)
            stall = self._stalls.observe(time.monotonic(), table.oldest_in_flight())
            if stall is not None:
                raise Stalled(f"global time {stall.time} has been in flight for {stall.seconds:.1f}s (the oldest "
                              f"in-flight time usually moves on within {stall.typical:.2f}s; {table.in_flight()} "
                              f"global times in flight, min time {table.min_time()}): a batch was lost or a worker "
                              "is stuck, so this node exits for the cluster to recover from its last snapshot")

    async def Ack(self, request_iterator: AsyncIterator[pb.AckBatch], context: AckContext) -> pb.Empty:
        async for message in request_iterator:
            if not message.HasField("tick"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an ack batch must name its sender's tick")
            # A sender that saw the tick first must not lose acks: it only learns of a rejected stream on a
            # later write, after the rejected message is gone.  So acks wait for the tick instead.
            if not await self._gate.admitted(message.tick, context):
                continue  # the table of its global times was replaced (see the module's docstring)
            table = self._table
            assert table is not None
            has_report = message.HasField("report")
            # Checked before applying anything, so a rejected message changes nothing.
            if has_report and message.report.front not in self._fronts:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"report from front {message.report.front}, which is not in the current tick "
                                    f"(fronts {sorted(self._fronts)})")
            for ack in message.acks:
                table.ack(GlobalTime(ack.ts, ack.front), ack.xor)
            if has_report:
                table.report(message.report.front, message.report.ts)
            self._publish(table.min_time())
        return pb.Empty()

    async def WatchMinTime(self, request: pb.Empty, context: WatchContext) -> AsyncIterator[pb.GlobalTime]:
        watcher = _Latest()
        if self._closing:
            watcher.close()
        elif self._min is not None:
            watcher.put(self._min)
        self._watchers.add(watcher)
        try:
            while (value := await watcher.get()) is not None:
                yield pb.GlobalTime(ts=value.ts, front=value.front)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "acker is shutting down")
        finally:
            self._watchers.discard(watcher)


class AckerRole:
    """The acker as a role of a node (see ``flamestream.runtime.node``)."""

    kind = "acker"
    name = "acker"

    def __init__(self, stall_timeout: float = STALL_TIMEOUT) -> None:
        self.service = AckerService()
        self.stall_timeout = stall_timeout
        """Seconds a global time may be stuck in flight before the node exits (0: never)."""

    def info(self) -> dict[str, Any]:
        return {}

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        codec.add_servicer(server, self.service, pb.DESCRIPTOR.services_by_name["Acker"])
        local.streams[transport.ACK] = self.service.Ack
        local.min_time = self.service.WatchMinTime

    def start(self, supervisor: Supervisor) -> None:
        """The acker works inside the calls of its senders and watchers; its one task is the stall watch."""
        if self.stall_timeout > 0:
            supervisor.spawn(self.name, "stall watch", self.service.watch_stalls(self.stall_timeout), essential=True)

    async def deploy(self, tick: Tick) -> None:
        self.service.deploy(tick)

    def warm(self) -> None:
        """Nothing to connect: the acker opens no streams, its senders and watchers connect to it."""

    def skip_through(self, tick: int) -> None:
        """Ticks reach this role only through ``deploy``, which the node filters."""

    async def close(self) -> None:
        self.service.close()
