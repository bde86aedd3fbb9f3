"""The front service as a real process (``python -m fronts``) against a real ZooKeeper.

Workers and the acker are stand-ins served by this test process: they record
every batch and ack message they receive, which is exactly what the front
promises to produce.  Each test runs its own event loop (``asyncio.run``) for
the stand-ins and the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import wordcount
from flamestream.cluster import ClusterStore
from flamestream.core.graph import Graph
from flamestream.core.hashing import stable_hash
from flamestream.core.item import Envelope
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.fronts.producers import ProducerTable
from flamestream.fronts.service import CHUNK_BYTES, SEND_WINDOW_BYTES, FrontService, _logged_since
from flamestream.runtime.channels import LocalEndpoints
from flamestream.storage.input_log import encode_record, front_log_dir, read_checkpoint
from flamestream.storage.log import SegmentedLog
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.transport import ACK, EXCHANGE
from tests.loopback import start_server, stop_server

REPO = Path(__file__).resolve().parents[1]
FRONT = 3
LAYOUT = Layout.even(2)
WAIT = 10.0

slow = pytest.mark.slow


# -- stand-ins for the workers and the acker ------------------------------------------------------------------


class RecordingWorker(rpc.WorkerServicer):
    def __init__(self) -> None:
        self.batches: list[tuple[int, list[Envelope], dict[GlobalTime, int]]] = []

    async def Exchange(self, request_iterator: AsyncIterator[pb.ItemBatch], context: Any) -> pb.Empty:
        async for batch in request_iterator:
            entries, acks = codec.decode_batch(batch)
            self.batches.append((batch.sender, entries, acks))
        return pb.Empty()

    def envelopes(self) -> list[Envelope]:
        return [envelope for _, entries, _ in self.batches for envelope in entries]


class RecordingAcker(rpc.AckerServicer):
    def __init__(self) -> None:
        self.messages: list[tuple[str, Any]] = []
        """In arrival order: ("acks", {gt: xor}) or ("report", (front, ts))."""
        self.streams: list[list[int]] = []
        """The reports of each Ack stream (a new tick's route opens a new one)."""
        self.with_acks: list[tuple[set[GlobalTime], int]] = []
        """(the acked times, the report) of each message that carried both."""
        self.min_time = GlobalTime(-1, -1)
        """What ``WatchMinTime`` says: moved only by the test (``advance``)."""
        self._moved = asyncio.Event()

    def advance(self, min_time: GlobalTime) -> None:
        self.min_time = min_time
        self._moved.set()

    async def WatchMinTime(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.GlobalTime]:
        while True:
            sent = self.min_time
            yield pb.GlobalTime(ts=sent.ts, front=sent.front)
            while self.min_time == sent:
                self._moved.clear()
                await self._moved.wait()

    async def Ack(self, request_iterator: AsyncIterator[pb.AckBatch], context: Any) -> pb.Empty:
        reports: list[int] = []
        self.streams.append(reports)
        async for message in request_iterator:
            if message.acks:
                self.messages.append(("acks", codec.acks_of(message.acks)))
            if message.HasField("report"):
                self.messages.append(("report", (message.report.front, message.report.ts)))
                reports.append(message.report.ts)
                if message.acks:
                    self.with_acks.append((set(codec.acks_of(message.acks)), message.report.ts))
        return pb.Empty()

    def reports(self) -> list[int]:
        return [value[1] for kind, value in self.messages if kind == "report"]


class StandIns:
    """Two recording workers and a recording acker, each on its own loopback port."""

    def __init__(self) -> None:
        self.workers = [RecordingWorker(), RecordingWorker()]
        self.acker = RecordingAcker()
        self.worker_addresses: list[str] = []
        self.acker_address = ""
        self._servers: list[grpc.aio.Server] = []

    async def _serve(self, register: Callable[[grpc.aio.Server], None], streams: dict[str, Any]) -> str:
        server, address = await start_server(register, streams)
        self._servers.append(server)
        return address

    async def start(self) -> None:
        for worker in self.workers:
            self.worker_addresses.append(
                await self._serve(lambda s, w=worker: rpc.add_WorkerServicer_to_server(w, s),
                                  {EXCHANGE: worker.Exchange}))
        self.acker_address = await self._serve(lambda s: rpc.add_AckerServicer_to_server(self.acker, s),
                                               {ACK: self.acker.Ack})

    async def stop(self) -> None:
        for server in self._servers:
            await stop_server(server)

    def tick(self, graph: dict[str, Any], start_ts: int) -> dict[str, Any]:
        return Tick(number=0, start=GlobalTime(start_ts, 0), graph=graph, layout=LAYOUT,
                    workers=tuple(self.worker_addresses), fronts=(FRONT,), acker=self.acker_address).to_dict()

    def balance(self) -> dict[GlobalTime, int]:
        """Per global time, the acker's XOR combined with the acks the workers received: all zero when they cancel."""
        total: dict[GlobalTime, int] = {}
        for kind, acks in self.acker.messages:
            if kind == "acks":
                codec.xor_into(total, acks)
        for worker in self.workers:
            for _, _, acks in worker.batches:
                codec.xor_into(total, acks)
        return {gt: value for gt, value in total.items() if value}


@asynccontextmanager
async def stand_ins() -> AsyncIterator[StandIns]:
    services = StandIns()
    await services.start()
    try:
        yield services
    finally:
        await services.stop()


# -- the front process ---------------------------------------------------------------------------------------


class FrontProcess:
    def __init__(self, zookeeper: str, cluster: str, data_dir: Path, *extra: str,
                 file_size_limit: int | None = None) -> None:
        self.proc = subprocess.Popen(
            [*_front_command(file_size_limit), "--zookeeper", zookeeper, "--cluster", cluster, "--name", "node",
             "--front", str(FRONT), "--data-dir", str(data_dir), *extra],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("ready node "):
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"front did not start: {line!r}, exit code {self.proc.returncode}")
        self.address = line.split()[-1]

    def stop(self) -> int:
        """SIGTERM, as a supervisor would; the exit code (0 = clean shutdown)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WAIT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


@asynccontextmanager
async def front(zookeeper: str, cluster: str, data_dir: Path, *extra: str, file_size_limit: int | None = None,
                paced: bool = False) -> AsyncIterator[tuple[FrontProcess, Any]]:
    """A running front and a Front stub connected to it; on exit the front must stop with exit code 0.

    Unless ``paced``, the front sends every push at once (``--send-at-once``): the stand-in acker moves the min
    time only when a test says so, and a paced front would hold every push after the second until it did."""
    process = await asyncio.to_thread(FrontProcess, zookeeper, cluster, data_dir, *extra,
                                      *(() if paced else ("--send-at-once",)), file_size_limit=file_size_limit)
    channel = grpc.aio.insecure_channel(process.address)
    try:
        yield process, rpc.FrontStub(channel)
    finally:
        await channel.close()
        code = await asyncio.to_thread(process.stop)
    assert code == 0, f"front exited with {code}"


# -- helpers ---------------------------------------------------------------------------------------------------


@asynccontextmanager
async def logged_front(zookeeper: str, cluster: str, data_dir: Path,
                       paced: bool = False) -> AsyncIterator[tuple[StandIns, Any, Path, Tick]]:
    """Stand-ins, a front logging to a file (to wait for what it says), and tick 0 of ``routed_graph`` published."""
    log = data_dir / "front.log"
    async with stand_ins() as services, front(zookeeper, cluster, data_dir, "--log-file", str(log),
                                              paced=paced) as (_, stub):
        tick = Tick.from_dict(services.tick(routed_graph(), now_ms()))
        await publish(zookeeper, cluster, tick.to_dict())
        yield services, stub, log, tick


def event(payload: Any, producer: str = "", sequence: int = 0) -> pb.Event:
    return pb.Event(payload=json.dumps(payload).encode(), producer=producer, sequence=sequence)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def publish(zookeeper: str, cluster: str, tick: dict[str, Any]) -> None:
    def run() -> None:
        with ClusterStore(zookeeper, cluster=cluster) as store:
            store.publish_tick(tick)

    await asyncio.to_thread(run)


async def push(stub: Any, events: Sequence[pb.Event]) -> pb.PushResponse:
    response: pb.PushResponse = await stub.Push(pb.PushRequest(events=events), timeout=WAIT)
    return response


async def push_once_deployed(stub: Any, events: Sequence[pb.Event]) -> pb.PushResponse:
    """Push, retrying while the front has not yet seen the tick (FAILED_PRECONDITION; UNAVAILABLE once restarted)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await push(stub, events)
        except grpc.aio.AioRpcError as exc:
            restarted = exc.code() == grpc.StatusCode.UNAVAILABLE and "recovery tick" in (exc.details() or "")
            if not (exc.code() == grpc.StatusCode.FAILED_PRECONDITION or restarted) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.02)


async def rejected(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def log_records(data_dir: Path) -> list[dict[str, Any]]:
    log = SegmentedLog(data_dir / "input" / f"front-{FRONT}", readonly=True)
    try:
        records: list[dict[str, Any]] = []
        while batch := log.read(len(records)):
            records.extend(json.loads(data) for _, data in batch)
        return records
    finally:
        log.close()


def times(response: pb.PushResponse) -> list[GlobalTime]:
    return [GlobalTime(t.ts, t.front) for t in response.times]


BACKLOG_PUSH = CHUNK_BYTES // 130
"""Events of a push in the recovery tests: their log records take some 97 bytes each, so a paced chunk
(``CHUNK_BYTES``) ends after two pushes, and two chunks fill the send window."""


def routed_graph() -> dict[str, Any]:
    """Word count with a balanced split (by the line's hash): the front routes each line to one worker.

    Plain word count has an unbalanced stateless entry, which fronts replicate to every worker.
    """
    graph = wordcount.graph().to_dict()
    for op in graph["operations"]:
        if op["name"] == "split":
            op["balance"] = "examples.wordcount:word_hash"
    return graph


# -- tests -----------------------------------------------------------------------------------------------------


@slow
@pytest.mark.parametrize("replicated", [False, True])
def test_events_reach_their_workers_in_order_with_acks_reports_and_log(
        zookeeper: str, cluster_name: str, tmp_path: Path, replicated: bool) -> None:
    graph = wordcount.graph().to_dict() if replicated else routed_graph()
    entry = compile_graph(Graph.from_dict(graph)).entry
    copies = len(LAYOUT.starts) if replicated else 1

    async def scenario() -> None:
        async with stand_ins() as cluster, front(zookeeper, cluster_name, tmp_path) as (_, stub):
            error = await rejected(push(stub, [event("too early")]))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "flamestream deploy" in (error.details() or "")

            start_ts = now_ms() + 300  # ahead of the wall clock: the front must not stamp below it
            await publish(zookeeper, cluster_name, cluster.tick(graph, start_ts))
            pushed = ["the first line"]
            answers = [await push_once_deployed(stub, [event(pushed[0])])]

            for r in range(5):  # sequential: each reply comes after its events are in the input log
                lines = [f"line {r} {i} dog cat" for i in range(10)]
                answer = await push(stub, [event(line) for line in lines])
                tail = log_records(tmp_path)[-len(lines):]
                assert [rec["payload"] for rec in tail] == lines
                assert [GlobalTime(rec["ts"], rec["front"]) for rec in tail] == times(answer)
                pushed += lines
                answers.append(answer)

            batches = [[f"batch {b} event {i}" for i in range(25)] for b in range(8)]
            answers += await asyncio.gather(*(push(stub, [event(line) for line in batch]) for batch in batches))
            pushed += [line for batch in batches for line in batch]

            admitted = [gt for answer in answers for gt in times(answer)]
            assert all(flag for answer in answers for flag in answer.admitted)
            assert all(gt.front == FRONT and gt.ts >= start_ts for gt in admitted)

            await eventually(lambda: sum(len(w.envelopes()) for w in cluster.workers) == len(pushed) * copies,
                             "every event at its worker (at every worker, when the entry is replicated)")
            await eventually(lambda: not cluster.balance(), "the front's acks to cancel the acks the workers got")

            received: list[tuple[int, int, str]] = []
            for index, worker in enumerate(cluster.workers):
                order = []
                for sender, entries, _ in worker.batches:
                    assert sender == -1 - FRONT
                    for op, h, (payload, gt, trace, tombstone) in entries:
                        assert (op, h, tombstone, gt.front, len(trace)) == (entry, stable_hash(payload), False,
                                                                           FRONT, 1)
                        assert replicated or LAYOUT.owner(h) == index
                        order.append((gt.ts, trace[0]))
                        received.append((gt.ts, trace[0], payload))
                assert order == sorted(set(order)), f"worker {index} got this front's items out of order"
            assert Counter(p for _, _, p in received) == Counter(pushed * copies)
            distinct = sorted(set(received))
            assert len(distinct) == len(pushed)
            assert [GlobalTime(ts, FRONT) for ts, _, _ in distinct] == sorted(admitted)

            records = log_records(tmp_path)
            assert sorted((r["ts"], r["seq"], r["payload"]) for r in records) == distinct
            assert all(r["front"] == FRONT and r["producer"] == "" for r in records)

            last = max(admitted)
            await eventually(lambda: any(ts > last.ts for ts in cluster.acker.reports()), "a report past the pushes")
            acked: set[GlobalTime] = set()
            previous = start_ts
            for kind, value in list(cluster.acker.messages):
                if kind == "acks":
                    acked |= set(value)
                    continue
                front_id, ts = value
                assert front_id == FRONT and ts >= previous
                previous = ts
                missing = [gt for gt in admitted if gt.ts < ts and gt not in acked]
                assert not missing, f"report {ts} arrived before the acks of {missing[:3]}"

    asyncio.run(scenario())


@slow
def test_rejected_requests_admit_nothing_and_the_front_keeps_serving(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    graph = routed_graph()  # word_hash fails on anything but strings and dicts: a failing balancer

    async def scenario() -> None:
        async with stand_ins() as cluster, \
                front(zookeeper, cluster_name, tmp_path, "--max-event-bytes", "200", "--max-push-bytes", "1000") \
                as (_, stub):
            await publish(zookeeper, cluster_name, cluster.tick(graph, 0))
            await push_once_deployed(stub, [event("warm up")])

            bad_json = pb.Event(payload=b"{not json")
            error = await rejected(push(stub, [event("fine"), bad_json, event("also fine")]))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (error.details() or "").startswith("event 1: payload is not valid JSON")

            key_twice = pb.Event(payload=b'{"word": "a", "word": "b"}')  # json.loads would keep "b" only
            error = await rejected(push(stub, [event("fine"), key_twice]))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (error.details() or "") == "event 1: payload has the key 'word' twice in one object"

            error = await rejected(push(stub, [event("fine"), event("fine too"), event("x" * 300)]))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (error.details() or "").startswith("event 2: ")

            error = await rejected(push(stub, [event("x" * 2000)]))  # over both limits: named by its own
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (error.details() or "").startswith("event 0: 2") and "(--max-event-bytes)" in (error.details() or "")

            error = await rejected(push(stub, [event(42), event("fine")]))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (error.details() or "").startswith("event 0: balancing function failed: TypeError")

            answer = await push(stub, [event("still serving"), event({"word": "dict payloads balance"})])
            assert list(answer.admitted) == [True, True]
            expected = ["warm up", "still serving", {"word": "dict payloads balance"}]
            assert [r["payload"] for r in log_records(tmp_path)] == expected
            await eventually(lambda: sum(len(w.envelopes()) for w in cluster.workers) == 3, "the admitted events")
            await asyncio.sleep(0.2)  # nothing else may trickle in
            assert sorted(json.dumps(e[2][0]) for w in cluster.workers for e in w.envelopes()) == sorted(
                json.dumps(p) for p in expected)
            await eventually(lambda: not cluster.balance(), "acks to cancel")

    asyncio.run(scenario())


@slow
def test_retries_are_admitted_once_also_across_a_restart(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                first = await push_once_deployed(stub, [event("a", "p", 1), event("b", "p", 2)])
                assert list(first.admitted) == [True, True]
                a, b = times(first)
                second = await push(stub, [event("b", "p", 2), event("c", "p", 3), event("d"), event("c", "p", 3),
                                           event("a", "p", 1), event("x", "q", 1)])
                assert list(second.admitted) == [False, True, True, False, False, True]
                t = times(second)
                assert t[0] == b and t[4] == a and t[3] == t[1] and t[1] <= t[2] <= t[5]
                c = t[1]

            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                # Restarted while its tick runs, the front waits for a newer tick (as after a crash recovery).
                await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
                third = await push_once_deployed(stub, [event("c", "p", 3), event("e", "p", 4), event("y", "q", 1)])
                assert list(third.admitted) == [False, True, False]
                assert times(third)[0] == c and times(third)[2] == t[5]
                assert times(third)[1] > t[5], "a restarted front must stamp after everything it logged"

            records = log_records(tmp_path)
            assert [(r["producer"], r["sequence"], r["payload"]) for r in records] == [
                ("p", 1, "a"), ("p", 2, "b"), ("p", 3, "c"), ("", 0, "d"), ("q", 1, "x"), ("p", 4, "e")]
            await eventually(lambda: sum(len(w.envelopes()) for w in cluster.workers) == 6, "the admitted events")
            assert sorted(e[2][0] for w in cluster.workers for e in w.envelopes()) == ["a", "b", "c", "d", "e", "x"]
            await eventually(lambda: not cluster.balance(), "acks to cancel")

    asyncio.run(scenario())


def test_a_restarted_front_deduplicates_from_its_checkpoint(zookeeper: str, cluster_name: str,
                                                            tmp_path: Path) -> None:
    """The front checkpoints its producer table at the log's end; a restart reads no record after it, so the
    retry below is refused (with its original time) only if the checkpoint holds the producer right."""
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            directory = front_log_dir(tmp_path, FRONT)

            def checkpointed() -> bool:
                checkpoint = read_checkpoint(directory)
                return checkpoint is not None and checkpoint.start == 2

            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                first = times(await push_once_deployed(stub, [event("a", "p", 1), event("b", "p", 2)]))
                await eventually(checkpointed, "the checkpoint at the log's end")
            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))  # see the test above
                again = await push_once_deployed(stub, [event("b", "p", 2), event("c", "p", 3)])
                assert list(again.admitted) == [False, True]
                assert times(again)[0] == first[1] and times(again)[1] > first[1]

    asyncio.run(scenario())


def test_an_idle_lone_front_reports_its_next_push_at_once_not_an_interval_later(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """Idle, a lone front waits for its next stamp rather than waking every report interval to find nothing to
    report (200 wake-ups a second were 5 % of a core on an idle node); that stamp's report goes out at once.  With
    an interval of a minute, only that wake-up can report the push within the test's wait."""
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path, "--report-interval-ms", "60000") as (_, stub):
                (pushed,) = times(await push_once_deployed(stub, [event("a")]))
                await eventually(lambda: any(ts > pushed.ts for ts in cluster.acker.reports()),
                                 "a report past the push")

    asyncio.run(scenario())


def test_a_push_is_reported_in_its_own_acks_message_not_a_report_interval_later(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """The min time passes a push only once its front promised nothing older will come.  The reports' loop promises
    the clock's time, which passes a stamp only in the next millisecond, then every report interval while pushes keep
    coming: under load the wait was a third of a word count's time from admission to release.  So the acks of a push
    carry a promise past it (``_report_with_acks``), and the acker applies the acks first.  With an interval of a
    minute, back-to-back pushes are reported in their acks' messages, or only the idle path's wake-ups report them.
    """
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path, "--report-interval-ms", "60000") as (_, stub):
                pushed = [times(await push_once_deployed(stub, [event("first")]))[0]]
                for i in range(20):
                    pushed += times(await push(stub, [event(f"line {i}")]))
                await eventually(lambda: any(ts > pushed[-1].ts for ts in cluster.acker.reports()),
                                 "a report past the pushes")
                for acked, report in cluster.acker.with_acks:
                    assert all(gt.ts < report for gt in acked), f"report {report} does not pass its acks {acked}"
                carried = {gt for acked, _ in cluster.acker.with_acks for gt in acked}
                # A push's own report is refused where the clock would run 2 ms ahead (two pushes in one
                # millisecond) or past the persisted promise (once a second): most pushes still carry theirs.
                assert len(carried & set(pushed)) >= len(pushed) // 2, (
                    f"{len(carried & set(pushed))} of {len(pushed)} pushes reported in their acks' messages")

    asyncio.run(scenario())


def test_an_idle_lone_front_reports_past_a_hand_over_start_without_a_push(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """A hand-over completes when the min time passes its start, and with no push in flight only the front's report
    can take it there.  An idle lone front sends no reports (its promise covers everything it stamped), but a tick
    it switched to starts above that promise: it reports past the start once, or ``deploy`` and ``scale`` on an
    idle cluster wait for the next push (they timed out after 60 s)."""
    async def scenario() -> None:
        async with logged_front(zookeeper, cluster_name, tmp_path) as (cluster, stub, log, tick):
            (pushed,) = times(await push_once_deployed(stub, [event("a")]))
            await eventually(lambda: any(ts > pushed.ts for ts in cluster.acker.reports()), "a report past the push")
            handover = dataclasses.replace(tick, number=1, previous=0, start=GlobalTime(now_ms() + 300, 0))
            await publish(zookeeper, cluster_name, handover.to_dict())
            await eventually(lambda: any(ts >= handover.start.ts for ts in cluster.acker.reports()),
                             "a report at or past the hand-over's start")
            assert "switched to tick 1" in log.read_text()

    asyncio.run(scenario())


def test_a_restarted_front_keeps_the_promises_it_reported(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """Reports are persisted ahead of being sent, so a restart (even with the clock stepped back) never stamps
    below a time already promised to the acker; a persisted bound far in the future stands in for that clock."""
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                await push_once_deployed(stub, [event("a")])
                await asyncio.sleep(0.2)  # some reports go out
            promise = tmp_path / "input" / f"promise-{FRONT}"
            persisted = int(promise.read_text())
            assert persisted >= now_ms() - 1000 and max(cluster.acker.reports()) <= persisted
            promise.write_text(str(now_ms() + 60_000))  # as if the wall clock had stepped back a minute
            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))  # see the test above
                (after,) = times(await push_once_deployed(stub, [event("b")]))
                assert after.ts >= int(promise.read_text()) - 1000 >= now_ms() + 50_000

    asyncio.run(scenario())


def _front_command(file_size_limit: int | None) -> list[str]:
    """``flamestream node --front``, optionally with files capped at ``file_size_limit`` bytes (so the input log
    fills up).

    The limit is set by the child's own interpreter: a ``preexec_fn`` would run
    Python in a fork of this gRPC-threaded process, which gRPC does not survive
    reliably.
    """
    if file_size_limit is None:
        return [sys.executable, "-m", "flamestream", "node"]
    return [sys.executable, "-c", "import resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, {file_size_limit})); "
            "from flamestream.cli import main; sys.exit(main(['node', *sys.argv[1:]]))"]


class LogCheckingAcker(RecordingAcker):
    """A recording acker that, as each message of acks arrives, notes which of its times the front's input log
    does not hold yet (read as any reader reads it: published records only)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.early: list[GlobalTime] = []

    async def Ack(self, request_iterator: AsyncIterator[pb.AckBatch], context: Any) -> pb.Empty:
        async def checked() -> AsyncIterator[pb.AckBatch]:
            async for message in request_iterator:
                if message.acks:
                    logged = {GlobalTime(r["ts"], r["front"]) for r in log_records(self.data_dir)}
                    self.early += [gt for gt in codec.acks_of(message.acks) if gt not in logged]
                yield message

        return await super().Ack(checked(), context)


@slow
def test_a_push_is_acked_to_the_acker_only_once_its_events_are_in_the_log(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """The front sends a push to the workers before its log's fsync (the workers start meanwhile), but the acker
    hears of it only afterwards: without its send acks no time can complete, so no output of a push is released
    before it is durable.  (Before, the acks went first: this fails on that order.)"""
    async def scenario() -> None:
        services = StandIns()
        services.acker = LogCheckingAcker(tmp_path)
        await services.start()
        try:
            await publish(zookeeper, cluster_name, services.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path) as (_, stub):
                answers = [await push_once_deployed(stub, [event("the first line")])]
                for r in range(5):
                    answers.append(await push(stub, [event(f"line {r} {i} dog cat") for i in range(10)]))
                answers += await asyncio.gather(*(push(stub, [event(f"batch {b} {i}") for i in range(25)])
                                                  for b in range(8)))
                admitted = {gt for answer in answers for gt in times(answer)}
                await eventually(lambda: not services.balance() and
                                 sum(len(w.envelopes()) for w in services.workers) == 1 + 50 + 200,
                                 "every event at its worker, and the acks to balance")
                acked = {gt for kind, acks in services.acker.messages if kind == "acks" for gt in acks}
                assert acked == admitted
                assert services.acker.early == [], f"acks before the log held {services.acker.early[:3]}"
        finally:
            await services.stop()

    asyncio.run(scenario())


@slow
def test_a_failed_log_write_admits_exactly_what_reached_the_log(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with stand_ins() as cluster:
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), 0))
            async with front(zookeeper, cluster_name, tmp_path, file_size_limit=2048) as (_, stub):
                events = [event(f"event {i:02d} " + "x" * 60, "p", i) for i in range(40)]
                error = await rejected(push_once_deployed(stub, events))
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                records = log_records(tmp_path)
                kept = len(records)
                assert 0 < kept < 40
                assert f"{kept} of the 40 new events reached it" in (error.details() or "")

                await eventually(lambda: sum(len(w.envelopes()) for w in cluster.workers) == kept, "the kept events")
                await eventually(lambda: not cluster.balance(), "the cancelled acks and the kept ones to balance")
                received = sorted(e[2][0] for w in cluster.workers for e in w.envelopes())
                assert received == [r["payload"] for r in records]

                retry = await push(stub, events[:kept])
                assert not any(retry.admitted)
                assert times(retry) == [GlobalTime(r["ts"], r["front"]) for r in records]

                error = await rejected(push(stub, events[kept:kept + 1]))
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert "0 of the 1 new events" in (error.details() or "")
                assert len(log_records(tmp_path)) == kept

    asyncio.run(scenario())


@slow
def test_a_paced_front_holds_pushes_beyond_the_window_and_spreads_a_large_push_over_milliseconds(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """Sends go while less than ``SEND_WINDOW_BYTES`` is in flight: a push after that is logged and acknowledged,
    but sent only once the min time passes the first, and no report passes it meanwhile.  A push larger than
    ``CHUNK_BYTES`` is stamped over several milliseconds, none holding more than ``CHUNK_BYTES``, and sent a
    millisecond's chunk at a time."""
    async def scenario() -> None:
        async with stand_ins() as cluster, front(zookeeper, cluster_name, tmp_path, paced=True) as (_, stub):
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), now_ms()))

            def received() -> list[Any]:
                return [p for w in cluster.workers for _, _, (p, _, _, _) in w.envelopes()]

            def sized(name: str) -> pb.Event:  # after three, the window is full
                return event(f"{name} {'x' * (SEND_WINDOW_BYTES * 2 // 5)}")

            (first,) = times(await push_once_deployed(stub, [sized("push 0")]))
            for p in (1, 2):
                times(await push(stub, [sized(f"push {p}")]))
            (held,) = times(await push(stub, [sized("push 3")]))
            await eventually(lambda: held.ts in cluster.acker.reports(), "a report up to the held push")
            assert not any(held in value for kind, value in cluster.acker.messages if kind == "acks"), \
                "the fourth push waits: no acks for it before the report (acks precede reports on the stream)"
            await eventually(lambda: len(received()) == 3, "the first three pushes at their workers")
            assert not any(p.startswith("push 3") for p in received()), "the fourth push waits"
            assert max(cluster.acker.reports()) == held.ts, "no report passes the held push"

            cluster.acker.advance(GlobalTime(first.ts + 1, 0))
            await eventually(lambda: len(received()) == 4, "the held push, once the min time passed the first")
            await eventually(lambda: max(cluster.acker.reports()) > held.ts, "reports past it once it is sent")

            cluster.acker.advance(GlobalTime(held.ts + 1, 0))
            large = [f"{i} {'x' * (CHUNK_BYTES // 4 - 40)}" for i in range(10)]  # four to a millisecond
            stamps = times(await push(stub, [event(payload) for payload in large]))
            per_ms = Counter(gt.ts for gt in stamps)
            assert stamps == sorted(stamps) and len(per_ms) >= 3, f"one push over several milliseconds: {per_ms}"
            sizes: Counter[int] = Counter()
            for gt, payload in zip(stamps, large, strict=True):
                sizes[gt.ts] += len(json.dumps(payload))
            assert max(sizes.values()) <= CHUNK_BYTES, f"no millisecond over CHUNK_BYTES: {sizes}"
            ms = sorted(per_ms)
            await eventually(lambda: sum(p in received() for p in large) == per_ms[ms[0]] + per_ms[ms[1]],
                             "the first two milliseconds' chunks")
            await eventually(lambda: ms[2] in cluster.acker.reports(), "a report up to the first unsent millisecond")
            assert max(cluster.acker.reports()) == ms[2], "reports stop at the first unsent millisecond"
            cluster.acker.advance(GlobalTime(ms[0] + 1, 0))
            await eventually(lambda: all(p in received() for p in large), "the rest as the min time moves")
            await eventually(lambda: not cluster.balance(), "every send's acks at the acker, cancelled by the workers")

    asyncio.run(scenario())


@slow
def test_a_paced_front_does_not_wait_on_sends_of_the_millisecond_it_holds_back(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """A millisecond's first events went at once and filled the window; a push stamped in the same millisecond
    waits.  The min time cannot pass that millisecond before the held push is sent, so the window must not count
    its sends: every event reaches its worker while the stand-in acker holds the min time."""
    async def scenario() -> None:
        async with stand_ins() as cluster, front(zookeeper, cluster_name, tmp_path, paced=True) as (_, stub):
            start_ts = now_ms() + 3000  # every push until then is stamped at the tick's start: one millisecond
            await publish(zookeeper, cluster_name, cluster.tick(routed_graph(), start_ts))
            # Under CHUNK_BYTES of payloads (one millisecond), over SEND_WINDOW_BYTES of log records.
            many = [f"small line {i:04d} {'y' * 20}" for i in range(700)]
            first = times(await push_once_deployed(stub, [event(line) for line in many]))
            (last,) = times(await push(stub, [event("the push after them")]))
            assert {gt.ts for gt in first} == {last.ts} == {start_ts}, "all in the tick's first millisecond"
            await eventually(lambda: sum(len(w.envelopes()) for w in cluster.workers) == len(many) + 1,
                             "every event at its worker, the min time held")

    asyncio.run(scenario())


@slow
def test_a_hand_over_while_both_ticks_pace_keeps_the_old_ticks_reports_below_the_switch(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """Tick 0's pacer still has a chunk to send when tick 1 takes over, and tick 1 paces a large push too.  When
    tick 0's pacer finishes, its report stops at the switch: past it, on tick 0's stream, it would pass tick 1's
    unsent events (whose acks the acker has not seen) and could overtake the acks tick 1 sends on its own."""
    def large(name: str) -> list[pb.Event]:  # three milliseconds, four events each at most: paced
        return [event(f"{name} {i} {'x' * (CHUNK_BYTES // 4 - 40)}") for i in range(10)]

    async def scenario() -> None:
        async with logged_front(zookeeper, cluster_name, tmp_path, paced=True) as (cluster, stub, log, tick):
            old = sorted({gt.ts for gt in times(await push_once_deployed(stub, large("old")))})
            await eventually(lambda: bool(cluster.acker.streams) and old[2] in cluster.acker.streams[0],
                             "tick 0 holding its third millisecond")
            handover = dataclasses.replace(tick, number=1, previous=0, start=GlobalTime(now_ms() + 300, 0))
            await publish(zookeeper, cluster_name, handover.to_dict())
            await eventually(lambda: "tick 1 takes over from tick 0" in log.read_text(), "the hand-over announced")
            await asyncio.sleep(max(0.0, (handover.start.ts - now_ms()) / 1000 + 0.01))
            new = sorted({gt.ts for gt in times(await push(stub, large("new")))})
            assert handover.start.ts <= new[0]
            await eventually(lambda: len(cluster.acker.streams) == 2 and bool(cluster.acker.streams[1]),
                             "a report of tick 1")
            assert max(cluster.acker.streams[1]) <= old[2], "tick 1's reports wait for what tick 0 has yet to send"

            cluster.acker.advance(GlobalTime(old[0] + 1, 0))  # tick 0's last chunk may go; tick 1's still waits
            await eventually(lambda: handover.start.ts in cluster.acker.streams[0], "tick 0's report at the switch")
            assert max(cluster.acker.streams[0]) == handover.start.ts, "tick 0 promises nothing past the switch"
            await eventually(lambda: new[2] in cluster.acker.streams[1], "tick 1 reporting up to its unsent ms")
            assert max(cluster.acker.streams[1]) == new[2], "tick 1's reports wait for its unsent millisecond"

    asyncio.run(scenario())


@slow
def test_a_recovery_resends_the_log_paced_by_the_min_time(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """A recovery tick re-sends the logged events in chunks that end at a millisecond, at most two in flight, each
    followed by a report up to the next unsent event; pushes go on meanwhile and are sent after the re-sent
    events, and nothing is sent twice."""
    graph = routed_graph()

    def received(cluster: StandIns, after: Sequence[int] = (0, 0)) -> list[tuple[GlobalTime, Any]]:
        """(global time, payload) of what the workers got, each past its first ``after`` envelopes."""
        return [(gt, payload) for w, skip in zip(cluster.workers, after, strict=True)
                for _, _, (payload, gt, _, _) in w.envelopes()[skip:]]

    async def scenario() -> None:
        async with stand_ins() as cluster, front(zookeeper, cluster_name, tmp_path) as (_, stub):
            tick = Tick.from_dict(cluster.tick(graph, now_ms()))
            await publish(zookeeper, cluster_name, tick.to_dict())
            admitted: list[list[GlobalTime]] = []
            for p in range(5):  # one millisecond each: chunks are pushes 0-1, 2-3 and 4
                batch = [event(f"push {p} line {i}") for i in range(BACKLOG_PUSH)]
                admitted.append(times(await (push_once_deployed if p == 0 else push)(stub, batch)))
                await asyncio.sleep(0.005)
            await eventually(lambda: len(received(cluster)) == 5 * BACKLOG_PUSH, "every event at its worker")
            first_pass, seen = received(cluster), [len(w.envelopes()) for w in cluster.workers]

            recovery = dataclasses.replace(tick, number=1, previous=0, recovery=True)
            await publish(zookeeper, cluster_name, recovery.to_dict())
            floor = admitted[4][0].ts
            await eventually(lambda: len(cluster.acker.streams) == 2 and floor in cluster.acker.streams[1],
                             "the recovery's report up to the third chunk")
            during = times(await push(stub, [event("pushed while recovering")]))[0]
            await eventually(lambda: len(received(cluster, seen)) == 4 * BACKLOG_PUSH, "the first two chunks re-sent")
            assert cluster.acker.streams[1][0] == admitted[2][0].ts and max(cluster.acker.streams[1]) == floor, \
                "the third chunk waits until the min time passes the first, and no report passes it"

            cluster.acker.advance(GlobalTime(admitted[1][-1].ts + 1, 0))
            await eventually(lambda: len(received(cluster)) == 10 * BACKLOG_PUSH + 1,
                             "the third chunk and the push sent")
            await eventually(lambda: cluster.acker.streams[1][-1] > during.ts, "a report past it all")
            for w, skip in zip(cluster.workers, seen, strict=True):
                stamps = [gt for _, _, (_, gt, _, _) in w.envelopes()[skip:]]
                assert stamps == sorted(stamps), "the push waits behind the re-sent events: no grouping replays"
            again = [r for r in received(cluster, seen) if r[1] != "pushed while recovering"]
            assert Counter(again) == Counter(first_pass), "every logged event once more, with its original stamp"
            assert {gt for gt, _ in again} == {gt for times_ in admitted for gt in times_}
            await eventually(lambda: not cluster.balance(), "the re-sent acks to cancel at the acker")

    asyncio.run(scenario())


async def recovery_with_a_backlog(zookeeper: str, cluster_name: str, cluster: StandIns, stub: Any,
                                  tick: Tick) -> tuple[list[list[GlobalTime]], int]:
    """Five pushes of ``BACKLOG_PUSH`` events, then recovery tick 1 re-sending them: chunks are pushes 0-1, 2-3 and
    4, and the third waits for the min time, which the stand-in acker holds.  The pushes' times, and the floor the
    recovery's reports stop at (the first time of the third chunk)."""
    admitted: list[list[GlobalTime]] = []
    for p in range(5):
        batch = [event(f"push {p} line {i}") for i in range(BACKLOG_PUSH)]
        admitted.append(times(await (push_once_deployed if p == 0 else push)(stub, batch)))
        await asyncio.sleep(0.005)
    await eventually(lambda: len(cluster.workers[0].envelopes()) + len(cluster.workers[1].envelopes())
                     == 5 * BACKLOG_PUSH,
                     "every event at its worker")
    await publish(zookeeper, cluster_name, dataclasses.replace(tick, number=1, previous=0, recovery=True).to_dict())
    floor = admitted[4][0].ts
    await eventually(lambda: len(cluster.acker.streams) == 2 and floor in cluster.acker.streams[1],
                     "the recovery's report up to the third chunk")
    return admitted, floor


async def hand_over_then_push(zookeeper: str, cluster_name: str, stub: Any, log: Path,
                              tick: Tick) -> tuple[Tick, GlobalTime]:
    """Tick 2 takes over from tick 1 300 ms from now; one push after its start: the tick and the push's time."""
    handover = dataclasses.replace(tick, number=2, previous=1, recovery=False, start=GlobalTime(now_ms() + 300, 0))
    await publish(zookeeper, cluster_name, handover.to_dict())
    await eventually(lambda: "tick 2 takes over from tick 1" in log.read_text(), "the hand-over announced")
    await asyncio.sleep(max(0.0, (handover.start.ts - now_ms()) / 1000 + 0.01))
    (after,) = times(await push(stub, [event("pushed after the switch")]))
    return handover, after


@slow
def test_a_hand_over_while_a_recovery_catches_up_lets_it_send_the_rest(zookeeper: str, cluster_name: str,
                                                                       tmp_path: Path) -> None:
    """Events below a hand-over that a recovery has yet to send still go to tick n's workers after the switch
    (cancelled with the old route, they never did, and the hand-over's snapshot could not complete), and the new
    tick's reports wait for them: the acker's table spans ticks."""
    async def scenario() -> None:
        async with logged_front(zookeeper, cluster_name, tmp_path) as (cluster, stub, log, tick):
            admitted, floor = await recovery_with_a_backlog(zookeeper, cluster_name, cluster, stub, tick)
            (deferred,) = times(await push(stub, [event("pushed while catching up")]))
            handover, after = await hand_over_then_push(zookeeper, cluster_name, stub, log, tick)
            assert deferred < handover.start <= after
            await eventually(lambda: len(cluster.acker.streams) == 3 and cluster.acker.streams[2],
                             "a report of the new tick")
            assert max(cluster.acker.streams[2]) <= floor, "no report passes what the recovery has yet to send"

            cluster.acker.advance(GlobalTime(admitted[1][-1].ts + 1, 0))
            payloads = lambda: [p for w in cluster.workers for _, _, (p, _, _, _) in w.envelopes()]  # noqa: E731
            await eventually(lambda: "pushed while catching up" in payloads()
                             and len(payloads()) == 10 * BACKLOG_PUSH + 2,
                             "the rest of the re-send and the deferred push, after the switch")
            await eventually(lambda: cluster.acker.streams[2][-1] > after.ts, "the new tick's reports pass it all")

    asyncio.run(scenario())


@slow
def test_a_recovery_after_a_hand_over_ends_the_old_ticks_catching_up(zookeeper: str, cluster_name: str,
                                                                     tmp_path: Path) -> None:
    """A recovery tick replaces every route, also one a hand-over left catching up: its floor must not cap the
    recovery's reports while its re-send waits for a min time that never comes (its workers or acker died; here
    the stand-in acker never advances)."""
    async def scenario() -> None:
        async with logged_front(zookeeper, cluster_name, tmp_path) as (cluster, stub, log, tick):
            _, floor = await recovery_with_a_backlog(zookeeper, cluster_name, cluster, stub, tick)
            _, switched = await hand_over_then_push(zookeeper, cluster_name, stub, log, tick)
            await eventually(lambda: "switched to tick 2" in log.read_text(), "the switch, tick 1 still behind")

            recovery = dataclasses.replace(tick, number=3, previous=2, recovery=True,
                                           start=GlobalTime(switched.ts + 1, 0))
            await publish(zookeeper, cluster_name, recovery.to_dict())
            await eventually(lambda: "recovery: sent the 0 logged events" in log.read_text(), "the second re-send")
            (after,) = times(await push(stub, [event("after the second recovery")]))
            await eventually(lambda: len(cluster.acker.streams) == 4 and cluster.acker.streams[3]
                             and max(cluster.acker.streams[3]) > after.ts,
                             "a report of the second recovery past its push, beyond tick 1's floor")
            assert floor < after.ts

    asyncio.run(scenario())


@slow
def test_a_recovery_with_nothing_to_send_again_lets_reports_pass_its_start(zookeeper: str, cluster_name: str,
                                                                           tmp_path: Path) -> None:
    """The last complete snapshot may lie after every logged event: then the re-send has nothing to send, and it
    must still lift its floor, or no report passes the recovery's start and the min time stays there for good
    (nothing pushed after such a recovery was ever released: once a flake of test_recovery's second kill)."""
    async def scenario() -> None:
        async with logged_front(zookeeper, cluster_name, tmp_path) as (cluster, stub, log, tick):
            (before,) = times(await push_once_deployed(stub, [event("before")]))
            recovery = dataclasses.replace(tick, number=1, previous=0, recovery=True,
                                           start=GlobalTime(before.ts + 1, 0))
            await publish(zookeeper, cluster_name, recovery.to_dict())
            # The re-send is over before the next push (which it would otherwise send, lifting the floor itself).
            await eventually(lambda: "recovery: sent the 0 logged events" in log.read_text(), "the empty re-send")
            (after,) = times(await push(stub, [event("after")]))
            assert after > recovery.start
            await eventually(lambda: len(cluster.acker.streams) == 2 and max(cluster.acker.streams[1]) > after.ts,
                             "a report past the push after the recovery")

    asyncio.run(scenario())


def test_a_restarted_front_refuses_pushes_as_unavailable_until_its_recovery_tick(tmp_path: Path) -> None:
    """Not "no graph deployed" (a user would redeploy): the graph is there and the recovery is under way, so the
    refusal says so, with a status every gRPC client retries."""
    async def scenario() -> None:
        fresh = await FrontService.open(FRONT, tmp_path / "fresh", 1024, LocalEndpoints())
        restarted = await FrontService.open(FRONT, tmp_path / "restarted", 1024, LocalEndpoints())
        restarted.skip_through(7)  # what a node does when the newest tick already runs its roles
        answers = []
        for service in (fresh, restarted):
            server, address = await start_server(lambda server, s=service: rpc.add_FrontServicer_to_server(s, server))
            try:
                async with grpc.aio.insecure_channel(address) as channel:
                    answers.append(await rejected(push(rpc.FrontStub(channel), [event("x")])))
            finally:
                await stop_server(server)
                await service.close()
        assert [(a.code(), a.details()) for a in answers] == [
            (grpc.StatusCode.FAILED_PRECONDITION, "no graph deployed; run `flamestream deploy`"),
            (grpc.StatusCode.UNAVAILABLE, f"front {FRONT} restarted while tick 7 ran; it takes pushes again once "
                                          "the cluster's recovery tick is deployed")]

    asyncio.run(scenario())


def test_a_recovery_reads_the_log_only_below_the_end_it_had_when_installed(tmp_path: Path) -> None:
    """Events logged after the recovery route was installed are its deferred pushes: read from the log too, they
    would be sent twice."""
    log = SegmentedLog(tmp_path / "log", 4096)
    try:
        stamps = [GlobalTime(ts, 0) for ts in (5, 6, 6, 7, 9)]
        log.append_many([encode_record(gt, seq, f"event {seq}") for seq, gt in enumerate(stamps)])
        events, size = _logged_since(log, GlobalTime(6, 0), end=4)
        assert events == [(stamps[seq], (seq,), f"event {seq}") for seq in (1, 2, 3)]
        assert size == sum(len(data) for _, data in log.read(1, 3))
    finally:
        log.close()


def test_producer_table_remembers_recent_times_only() -> None:
    table = ProducerTable(remember=3)
    for sequence in range(1, 6):
        table.admit("p", sequence, GlobalTime(sequence * 10, 0))
    assert table.last("p") == 5 and table.last("other") == -1
    assert [table.time_of("p", s) for s in range(1, 6)] == [None, None, GlobalTime(30, 0), GlobalTime(40, 0),
                                                            GlobalTime(50, 0)]
    with pytest.raises(ValueError, match="not above 5"):
        table.admit("p", 5, GlobalTime(60, 0))
