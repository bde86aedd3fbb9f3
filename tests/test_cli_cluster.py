"""The cluster commands (up, down, deploy, push, consume) and the SDK behind them.

Most tests need no FlameStream service: argument and input errors are caught
before any cluster is contacted, and the SDK is exercised against small
in-test grpc.aio servicers registered as members in the shared real
ZooKeeper.  Tests that launch processes with `flamestream up` are slow; the
last one is the whole user journey over real services.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import inverted_index
from flamestream.client import (
    ANONYMOUS,
    LANES,
    PUSH_BATCH,
    AsyncClient,
    Client,
    ClientError,
    PushResult,
    Record,
    StateWarning,
)
from flamestream.cluster import ClusterStore
from flamestream.core.hashing import stable_hash
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.tick import Layout, Tick
from flamestream.runtime import launcher
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from tests.loopback import connections_to, free_port, start_server

ROOT = Path(__file__).resolve().parents[1]


def flamestream(*args: str, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def port_free(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


# -- in-test servicers -----------------------------------------------------------------------------------------


class AioServers:
    """grpc.aio servers on an event loop of their own, so synchronous clients can call them from the test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[grpc.aio.Server] = []

    def start(self, register: Callable[[grpc.aio.Server], None]) -> str:
        async def start() -> str:
            server, address = await start_server(register)
            self.servers.append(server)
            return address

        return asyncio.run_coroutine_threadsafe(start(), self.loop).result()

    def close(self) -> None:
        async def stop() -> None:
            await asyncio.gather(*(server.stop(None) for server in self.servers))

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def servers() -> Iterator[AioServers]:
    started = AioServers()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def store(zookeeper: str, cluster_name: str) -> Iterator[ClusterStore]:
    """Registers the fake members; its session (and so their membership) ends with the test."""
    with ClusterStore(zookeeper, cluster=cluster_name) as opened:
        yield opened


class FakeFront(rpc.FrontServicer):
    """Admits like a real front (per producer, only sequences above the last admitted one).

    ``faults`` are injected into the first calls, in order: ``"down"`` fails
    before admitting anything, ``"lost"`` admits the batch and then fails, as
    if the reply had been lost, ``"ok"`` serves the call; any other entry is a
    status code to abort with, or a (code, details) pair.
    """

    def __init__(self, front_id: int, faults: list[Any] | None = None) -> None:
        self.front_id = front_id
        self.faults = list(faults or [])
        self.calls: list[list[tuple[str, int, Any]]] = []
        self.log: list[tuple[str, int, Any]] = []
        self.last: dict[str, int] = {}
        self.times: dict[tuple[str, int], GlobalTime] = {}

    async def Push(self, request: pb.PushRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.PushResponse:
        self.calls.append([(e.producer, e.sequence, json.loads(e.payload)) for e in request.events])
        fault = self.faults.pop(0) if self.faults else None
        if fault == "down":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "front restarting")
        if isinstance(fault, grpc.StatusCode):
            await context.abort(fault, f"injected {fault.name}")
        if isinstance(fault, tuple):  # (code, details): a refusal in the front's own words
            await context.abort(*fault)
        response = pb.PushResponse()
        for event in request.events:
            key = (event.producer, event.sequence)
            if event.producer and event.sequence <= self.last.get(event.producer, -1):
                gt, admitted = self.times[key], False
            else:
                gt, admitted = GlobalTime(1000 + len(self.log), self.front_id), True
                self.log.append((event.producer, event.sequence, json.loads(event.payload)))
                if event.producer:
                    self.last[event.producer] = event.sequence
                    self.times[key] = gt
            response.admitted.append(admitted)
            response.times.append(pb.GlobalTime(ts=gt.ts, front=gt.front))
        if fault == "lost":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost after admission")
        return response


class FakeBarrier(rpc.BarrierServicer):
    """Serves fixed topics: each partition's records from an offset on, then nothing more (a quiet stream)."""

    def __init__(self, topics: dict[int, list[Any]]) -> None:
        self.topics = topics
        self.offsets: dict[tuple[str, int], int] = {}

    async def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> Any:
        for offset, payload in enumerate(self.topics[request.partition]):
            if offset >= request.from_offset:
                time = pb.GlobalTime(ts=100 + offset, front=request.partition)
                yield pb.RecordBatch(records=[pb.Record(partition=request.partition, offset=offset, time=time,
                                                        payload=json.dumps(payload).encode())])
        await asyncio.Event().wait()  # live: the client decides when to stop

    async def Commit(self, request: pb.CommitRequest, context: Any) -> pb.Empty:
        self.offsets[(request.group, request.partition)] = request.offset
        return pb.Empty()

    async def Committed(self, request: pb.CommittedRequest, context: Any) -> pb.Offset:
        return pb.Offset(offset=self.offsets.get((request.group, request.partition), 0))


def add_front(servers: AioServers, store: ClusterStore, front: FakeFront) -> str:
    address = servers.start(lambda server: rpc.add_FrontServicer_to_server(front, server))
    store.register("front", f"front{front.front_id}", {"address": address, "id": front.front_id})
    return address


def add_barrier(servers: AioServers, store: ClusterStore, barrier: FakeBarrier) -> str:
    address = servers.start(lambda server: rpc.add_BarrierServicer_to_server(barrier, server))
    store.register("barrier", "barrier0", {"address": address, "partitions": sorted(barrier.topics)})
    return address


# -- usage errors (no cluster needed) -----------------------------------------------------------------------------


def test_usage_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    cases = {
        ("up", "--nodes", "0"): "must be >= 1",
        ("up", "--nodes", "1", "--fronts", "2"): "2 fronts need at least 2 nodes",
        ("up", "--cluster", "a/b"): "must not contain '/'",
        ("up", "--timeout", "0"): "must be > 0",
        ("push", "--cluster", "x"): "--cluster needs --zookeeper",
        ("push", "--data-dir", "d", "--zookeeper", "z:1"): "not allowed with argument",
        ("consume", "--limit", "0"): "must be >= 1",
        ("consume", "--timeout", "soon"): "not a number of seconds",
        ("deploy",): "the following arguments are required: graph",
        ("push", str(tmp_path / "missing.txt"), "--zookeeper", "127.0.0.1:1"): "No such file",
        ("consume", "--group", "bad/name", "--zookeeper", "127.0.0.1:1"): "consumer group 'bad/name' may only hold",
        ("push", "--producer", "~me", "--zookeeper", "127.0.0.1:1"): "producer id must be a non-empty string",
        ("push", "--credentials", str(tmp_path), "--zookeeper", "127.0.0.1:1"): "cannot read credentials in",
    }
    for args, message in cases.items():
        done = flamestream(*args, stdin="x\n")
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)


def test_down_without_a_cluster_exits_0(tmp_path: Path) -> None:
    done = flamestream("down", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "no cluster is recorded" in done.stderr


def test_commands_without_a_running_cluster_exit_1(tmp_path: Path) -> None:
    data = str(tmp_path)
    for args in (("deploy", "examples/wordcount.py"), ("push",), ("consume", "--timeout", "1")):
        done = flamestream(*args, "--data-dir", data, stdin="x\n")
        assert done.returncode == 1, (args, done.stderr)
        assert "no cluster is running" in done.stderr and "flamestream up" in done.stderr


def test_bad_json_line_exits_2_naming_the_line_before_any_cluster_is_contacted(tmp_path: Path) -> None:
    done = flamestream("push", "--json", "--data-dir", str(tmp_path), stdin='{"a": 1}\n\n[2]\n{oops}\n')
    assert done.returncode == 2, done.stderr
    assert "stdin line 4 is not valid JSON" in done.stderr and "nothing was pushed" in done.stderr


def test_deploy_of_a_bad_graph_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from flamestream import Graph\ndef graph():\n    g = Graph('x')\n    g.source()\n    return g\n")
    for graph, message in ((str(broken), "a graph needs at least one sink"),
                           ("examples/missing.py", "is not an existing .py file")):
        done = flamestream("deploy", graph, "--zookeeper", "127.0.0.1:1")
        assert done.returncode == 2, done.stderr
        assert message in done.stderr


# -- the state file: refusing a second up, cleaning up with down ---------------------------------------------------


def record(role: str, name: str, pid: int, address: str = "") -> launcher.ProcessRecord:
    return launcher.ProcessRecord(role=role, name=name, pid=pid, started=launcher.start_time(pid),
                                         log="", address=address)


def test_up_refuses_while_the_recorded_cluster_runs(tmp_path: Path) -> None:
    state = launcher.ClusterState("default", "127.0.0.1:1", own_zookeeper=False,
                                         processes=[record("acker", "acker", os.getpid())])
    launcher.save_state(tmp_path, state)
    done = flamestream("up", "--data-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "already running" in done.stderr and f"acker (pid {os.getpid()})" in done.stderr
    assert launcher.load_state(tmp_path) == state  # untouched


def test_down_stops_recorded_processes_and_frees_their_ports(tmp_path: Path) -> None:
    listener = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
                "print(s.getsockname()[1], flush=True)\ntime.sleep(600)\n")
    procs = [subprocess.Popen([sys.executable, "-c", listener], stdout=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        addresses = [f"127.0.0.1:{proc.stdout.readline().strip()}" for proc in procs if proc.stdout]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        state = launcher.ClusterState(
            "default", addresses[1], own_zookeeper=True,
            processes=[record("zookeeper", "zookeeper", procs[1].pid, addresses[1]),
                       record("worker", "worker0", procs[0].pid, addresses[0]),
                       record("worker", "worker1", gone.pid)])
        launcher.save_state(tmp_path, state)
        done = flamestream("down", "--data-dir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert [proc.wait(timeout=5) for proc in procs] == [-signal.SIGTERM, -signal.SIGTERM]
        assert not launcher.state_path(tmp_path).exists()
        assert all(port_free(address) for address in addresses)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_down_kills_what_ignores_sigterm_and_what_it_started(tmp_path: Path) -> None:
    stubborn = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "helper = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True)\n"
                "print(helper.pid, flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    helper = int(proc.stdout.readline()) if proc.stdout else 0
    try:
        worker = record("worker", "worker0", proc.pid)
        worker.helpers = [(helper, launcher.start_time(helper))]
        launcher.save_state(tmp_path, launcher.ClusterState("default", "127.0.0.1:1", False, [worker]))
        started = time.monotonic()
        done = flamestream("down", "--data-dir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= launcher.SERVICE_GRACE  # SIGTERM was given its chance
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not launcher.is_alive(helper, None)
    finally:
        for pid in (proc.pid, helper):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


# -- the SDK against in-test servicers ------------------------------------------------------------------------


def test_producer_sequences_continue_across_pushes_and_retries_reuse_them(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    front = FakeFront(0, faults=["down", "lost"])
    add_front(servers, store, front)
    payloads = [{"n": i} for i in range(PUSH_BATCH + 20)]
    with Client(zookeeper, cluster_name, backoff=0.01) as client:
        result = client.push(payloads, producer="p")
        more = client.push(["tail"], producer="p")
    # Call 1 failed before admitting, call 2 admitted batch 1 but lost the reply:
    # all three carried sequences 0..499; then batch 2 (500..519), then the tail.
    assert [[seq for _, seq, _ in call][:1] + [len(call)] for call in front.calls] == [
        [0, PUSH_BATCH], [0, PUSH_BATCH], [0, PUSH_BATCH], [PUSH_BATCH, 20], [PUSH_BATCH + 20, 1]]
    assert {producer for call in front.calls for producer, _, _ in call} == {"p"}
    assert [payload for _, _, payload in front.log] == [*payloads, "tail"]  # each event admitted once
    assert (result.events, result.duplicates, more.events) == (PUSH_BATCH + 20, PUSH_BATCH, 1)
    assert result.times[0] == GlobalTime(1000, 0) and more.times == (GlobalTime(1000 + PUSH_BATCH + 20, 0),)


def test_a_new_client_with_the_same_producer_pushes_nothing_twice(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    front = FakeFront(0)
    add_front(servers, store, front)
    with Client(zookeeper, cluster_name) as client:
        assert client.push(["a", "b"], producer="p").duplicates == 0
    with Client(zookeeper, cluster_name) as client:  # e.g. `flamestream push --producer p` run again
        again = client.push(["a", "b", "c"], producer="p")
    assert (again.events, again.duplicates, again.admitted) == (3, 2, 1)
    assert [payload for _, _, payload in front.log] == ["a", "b", "c"]


def test_failed_precondition_is_retried_other_errors_raise_with_status_and_progress(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    front = FakeFront(0, faults=[grpc.StatusCode.FAILED_PRECONDITION, None, grpc.StatusCode.INVALID_ARGUMENT])
    add_front(servers, store, front)
    payloads = list(range(2 * PUSH_BATCH))
    with Client(zookeeper, cluster_name, backoff=0.01) as client:
        with pytest.raises(ClientError) as failed:
            client.push(payloads, producer="p")
        assert failed.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert failed.value.details == "injected INVALID_ARGUMENT" and failed.value.pushed == PUSH_BATCH
        resumed = client.push(payloads[failed.value.pushed:], producer="p")
    assert resumed.duplicates == 0
    assert [call[0][1] for call in front.calls] == [0, 0, PUSH_BATCH, PUSH_BATCH]  # the failed batch's numbers again
    assert [payload for _, _, payload in front.log] == payloads


def test_a_refused_event_is_named_by_its_index_in_the_push_and_its_input_line(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    """A front names the event it refuses by its index in the request; a push goes in requests of ``PUSH_BATCH``,
    and the CLI's reads in batches of lines, so both say which event of theirs it was."""
    front = FakeFront(0, ["ok", (grpc.StatusCode.INVALID_ARGUMENT, "event 3: payload is not valid JSON")])
    add_front(servers, store, front)
    with Client(zookeeper, cluster_name, retries=0) as client, pytest.raises(ClientError) as refused:
        client.push([f"e{i}" for i in range(PUSH_BATCH + 10)])
    assert refused.value.event == PUSH_BATCH + 3 and refused.value.pushed == PUSH_BATCH
    assert f"event {PUSH_BATCH + 3}: payload is not valid JSON" in str(refused.value)

    front.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "event 1: 1200 bytes exceeds the limit of 1000")]
    done = flamestream("push", "--json", "--zookeeper", zookeeper, "--cluster", cluster_name,
                       stdin='{"a": 1}\n\n"two"\n3\n')
    assert done.returncode == 1
    assert "stdin line 3 was refused (RESOURCE_EXHAUSTED): 1200 bytes exceeds the limit of 1000" in done.stderr


def test_a_push_results_repr_leaves_out_each_events_time() -> None:
    result = PushResult(events=3, duplicates=1, times=tuple(GlobalTime(ts, 0) for ts in range(3)))
    assert repr(result) == "PushResult(events=3, duplicates=1)" and result.admitted == 2


def test_unavailable_retries_run_out(servers: AioServers, store: ClusterStore, zookeeper: str,
                                     cluster_name: str) -> None:
    front = FakeFront(0, faults=["down"] * 10)
    add_front(servers, store, front)
    with Client(zookeeper, cluster_name, retries=2, backoff=0.01) as client, pytest.raises(ClientError) as failed:
        client.push(["x"])
    assert failed.value.code is grpc.StatusCode.UNAVAILABLE and len(front.calls) == 3 and not front.log


def test_a_front_that_registers_late_is_waited_for_one_that_never_does_is_an_error(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    with Client(zookeeper, cluster_name, retries=1, backoff=0.01) as client, pytest.raises(ClientError) as failed:
        client.push(["x"])
    assert "no front is registered" in str(failed.value) and failed.value.code is None
    front = FakeFront(0)
    later = threading.Timer(0.3, add_front, (servers, store, front))
    later.start()
    with Client(zookeeper, cluster_name, backoff=0.1) as client:
        assert client.push(["x"]).events == 1
    later.join()
    # anonymous pushes carry the client's internal producer id, so a retry of them is deduplicated too
    assert [(producer.startswith(ANONYMOUS), sequence, x) for producer, sequence, x in front.log] == [(True, 0, "x")]


def test_calls_that_start_together_share_one_zookeeper_session(zookeeper: str, cluster_name: str) -> None:
    """A client's first ZooKeeper calls, made at once (a gather, a consume's partitions), open one session; each
    used to open its own, and all but one outlived ``close``, reconnecting for good once ZooKeeper was gone (the
    chaos test's pusher left one behind for the rest of the suite)."""
    port = int(zookeeper.rpartition(":")[2])
    before = connections_to(port, own=True)

    async def scenario() -> int:
        async with AsyncClient(zookeeper, cluster_name) as client:
            await asyncio.gather(*(client.members(role) for role in ("acker", "worker", "front", "barrier")))
            return connections_to(port, own=True)

    assert asyncio.run(scenario()) == before + 1
    assert connections_to(port, own=True) == before


def test_a_call_cancelled_while_its_session_opens_leaves_no_session(zookeeper: str, cluster_name: str) -> None:
    """``close`` cancels an abandoned consume; if that lands while the session connects (in a thread), the
    session must still be stopped, not left to nobody."""
    port = int(zookeeper.rpartition(":")[2])
    before = connections_to(port, own=True)

    async def scenario() -> None:
        async with AsyncClient(zookeeper, cluster_name) as client:
            call = asyncio.ensure_future(client.members("front"))
            while connections_to(port, own=True) == before:  # connected: the session's start is under way in its thread
                await asyncio.sleep(0)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call

    asyncio.run(scenario())
    assert connections_to(port, own=True) == before


def test_async_client_spreads_anonymous_batches_and_pins_a_producer(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    fronts = [FakeFront(0), FakeFront(1)]
    for front in fronts:
        add_front(servers, store, front)

    async def scenario() -> None:
        async with AsyncClient(zookeeper, cluster_name) as client:
            await client.push(range(3 * PUSH_BATCH))
            assert [len(front.calls) for front in fronts] == [2, 1]  # round-robin over sorted front ids
            for _ in range(3):
                await client.push(["p"], producer="pinned")

    asyncio.run(scenario())
    assert sorted(len([e for call in front.calls for e in call if e[0] == "pinned"]) for front in fronts) == [0, 3]


def test_concurrent_anonymous_pushes_are_all_admitted(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    """Pushes in flight together each take a lane (an anonymous producer id of their own, at most ``LANES``): with
    one id they all sent sequence 0, and the front took all but the first for retries.

    A first push fills the client's caches of the tick and the fronts: without it each push of the ``gather``
    read ZooKeeper in a thread first, and on a busy machine one could be answered before the next was sent,
    so they were not in flight together and one lane took them all."""
    front = FakeFront(0)
    add_front(servers, store, front)

    async def scenario() -> None:
        async with AsyncClient(zookeeper, cluster_name) as client:
            assert (await client.push(["before"])).duplicates == 0
            results = await asyncio.gather(*(client.push([i]) for i in range(2 * LANES)))
            assert [result.duplicates for result in results] == [0] * (2 * LANES)
            assert (await client.push(["after"])).duplicates == 0

    asyncio.run(scenario())
    assert sorted(str(payload) for _producer, _sequence, payload in front.log) == \
        sorted(["before", "after", *map(str, range(2 * LANES))])
    producers = {producer for producer, _sequence, _payload in front.log}
    assert 1 < len(producers) <= LANES
    for producer in producers:  # each lane numbered 0, 1, 2, ... in the order the front saw its pushes
        assert [sequence for p, sequence, _payload in front.log if p == producer] == \
            list(range(sum(1 for p, _s, _e in front.log if p == producer)))


def test_an_anonymous_push_after_a_failed_one_is_admitted(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    """The failed push was admitted (its reply lost, no retries left): the next push on its lane, which reused its
    sequences, was taken for its retry and dropped; the lane now takes a new id."""
    front = FakeFront(0, faults=["lost"])
    add_front(servers, store, front)

    async def scenario() -> None:
        async with AsyncClient(zookeeper, cluster_name, retries=0) as client:
            with pytest.raises(ClientError):
                await client.push(["lost reply"])
            assert (await client.push(["next"])).duplicates == 0

    asyncio.run(scenario())
    assert [payload for _producer, _sequence, payload in front.log] == ["lost reply", "next"]
    assert len({producer for producer, _sequence, _payload in front.log}) == 2


def test_connect_opens_a_channel_to_every_front_and_barrier_before_any_call(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    fronts = [FakeFront(0), FakeFront(1)]
    addresses = [add_front(servers, store, front) for front in fronts]
    addresses.append(add_barrier(servers, store, FakeBarrier({0: [], 1: []})))
    ports = [int(address.rsplit(":", 1)[1]) for address in addresses]

    async def scenario() -> list[int]:
        async with AsyncClient(zookeeper, cluster_name) as client:
            assert [connections_to(port, own=True) for port in ports] == [0, 0, 0]
            await client.connect()
            return [connections_to(port, own=True) for port in ports]

    assert asyncio.run(scenario()) == [1, 1, 1]
    assert [front.calls for front in fronts] == [[], []]  # connected, nothing pushed


def test_connect_names_the_member_it_cannot_reach(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    add_front(servers, store, FakeFront(0))
    gone = f"127.0.0.1:{free_port()}"
    store.register("barrier", "barrier0", {"address": gone, "partitions": [0]})

    async def scenario() -> None:
        async with AsyncClient(zookeeper, cluster_name) as client:
            with pytest.raises(ClientError, match=r"cannot reach .* within 0\.5s") as raised:
                await client.connect(timeout=0.5)
            assert gone in str(raised.value) and raised.value.code == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_deploy_publishes_a_tick_of_the_registered_members(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    store.register("acker", "acker", {"address": "10.0.0.1:1"})
    for index in (1, 0):
        store.register("worker", f"worker{index}", {"address": f"10.0.1.{index}:1", "index": index})
    for front in (1, 0):
        store.register("front", f"front{front}", {"address": f"10.0.2.{front}:1", "id": front})
        store.register("barrier", f"barrier{front}", {"address": f"10.0.3.{front}:1", "partitions": [front]})
    before = time.time_ns() // 1_000_000
    done = flamestream("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert done.returncode == 0, done.stderr
    number, data = store.latest_tick() or (None, {})
    assert done.stdout.strip() == str(number)
    tick = Tick.from_dict({**data, "number": number})
    assert tick.workers == ("10.0.1.0:1", "10.0.1.1:1") and tick.layout == Layout.even(2)
    assert tick.fronts == (0, 1) and tick.acker == "10.0.0.1:1"
    assert tick.barriers == ((0, "10.0.3.0:1"), (1, "10.0.3.1:1"))
    assert tick.graph["name"] == "wordcount" and tick.start.front == 0 and tick.start.ts >= before


def test_deploy_cuts_the_hash_space_by_the_registered_weights(store: ClusterStore, zookeeper: str,
                                                              cluster_name: str) -> None:
    """A worker beside other roles registers half the weight (``roles.worker_weight``), one of an older version
    none (1); a weight that is not one is refused, naming the member, and nothing is published."""
    store.register("acker", "acker", {"address": "10.0.0.1:1"})
    store.register("worker", "worker0", {"address": "10.0.1.0:1", "index": 0, "weight": 0.5})
    store.register("worker", "worker1", {"address": "10.0.1.1:1", "index": 1, "weight": 1.0})
    store.register("worker", "worker2", {"address": "10.0.1.2:1", "index": 2})
    store.register("front", "front0", {"address": "10.0.2.0:1", "id": 0})
    store.register("barrier", "barrier0", {"address": "10.0.3.0:1", "partitions": [0]})
    where = ("--zookeeper", zookeeper, "--cluster", cluster_name)
    done = flamestream("deploy", "examples/wordcount.py", *where)
    assert done.returncode == 0, done.stderr
    number, data = store.latest_tick() or (None, {})
    layout = Tick.from_dict({**data, "number": number}).layout
    assert layout == Layout.weighted([0.5, 1.0, 1.0])
    lo, hi = layout.range_of(0)
    assert abs((hi - lo + 1) / (1 << 32) - 0.2) < 1e-6  # half of what each other worker gets
    store.register("worker", "worker3", {"address": "10.0.1.3:1", "index": 3, "weight": "heavy"})
    refused = flamestream("deploy", "examples/wordcount.py", "--fresh", *where)
    assert refused.returncode == 1 and "member worker/worker3 registered a bad weight: a worker's weight must be a " \
        "finite number, not 'heavy'" in refused.stderr, refused.stderr
    assert (store.latest_tick() or (None,))[0] == number, "nothing published"


def test_deploy_warns_when_a_grouping_takes_over_state_under_other_functions_and_refuses_another_window(
        store: ClusterStore, zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """Both examples name a grouping ``by_word``; the index's, handed word count's counts, failed on every word seen
    before, and the deploy said nothing.  Functions are compared by reference, which a renamed file changes too,
    so that is a warning; a changed window is refused (even with --drop-state, which only allows dropping a
    grouping the new graph lacks); --fresh starts empty."""
    store.register("acker", "acker", {"address": "10.0.0.1:1"})
    store.register("worker", "worker0", {"address": "10.0.1.0:1", "index": 0})
    store.register("front", "front0", {"address": "10.0.2.0:1", "id": 0})
    store.register("barrier", "barrier0", {"address": "10.0.3.0:1", "partitions": [0]})
    where = ("--zookeeper", zookeeper, "--cluster", cluster_name)
    assert flamestream("deploy", "examples/wordcount.py", *where).returncode == 0
    wider = tmp_path / "wider.py"
    wider.write_text((ROOT / "examples" / "wordcount.py").read_text().replace("g.grouping(2,", "g.grouping(3,"))
    assert "g.grouping(3," in wider.read_text()
    for extra in ((), ("--drop-state",)):
        done = flamestream("deploy", str(wider), *extra, *where)
        assert done.returncode == 1 and "'by_word' (window 2 -> 3) would take over state kept for another window" \
            in done.stderr, done.stderr
        assert (store.latest_tick() or (None,))[0] == 0, "nothing published"
    with Client(zookeeper, cluster_name) as client, pytest.warns(StateWarning, match="'by_word' \\(balance "
                                                                 "'examples.wordcount:word_hash' -> "
                                                                 "'examples.inverted_index:word_hash'"):
        assert client.deploy(inverted_index.graph(), drop_state=True) == 1  # published: the deployer judges
    fresh = flamestream("deploy", "examples/wordcount.py", "--fresh", *where)
    assert fresh.returncode == 0, fresh.stderr
    number, data = store.latest_tick() or (None, {})
    assert number == 2 and data["graph"]["name"] == "wordcount" and data["previous"] is None


def test_a_hand_over_that_times_out_names_the_workers_whose_snapshot_is_missing(
        store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    """A worker that cannot write its snapshot (a value in its state that is not plain) holds a hand-over back; the
    timeout said "1 of 2 snapshots", not whose, nor where to look."""
    first = Tick(number=0, start=GlobalTime(1000, 0), graph={}, layout=Layout.even(2), workers=("a:1", "b:1"),
                 fronts=(0,), acker="c:1", barriers=((0, "d:1"),))
    store.publish_tick(first.to_dict())
    handover = dataclasses.replace(first, number=1, start=GlobalTime(2000, 0), previous=0)
    store.publish_tick(handover.to_dict())
    store.register_snapshot(0, boundary_name(handover.start), 0, {"path": "x"})
    with Client(zookeeper, cluster_name) as client, pytest.raises(ClientError) as late:
        client.wait_handover(1, timeout=0.3)
    assert "1 of 2 snapshots; no snapshot from worker1 (a worker that cannot write one is NOT_SERVING" in \
        str(late.value)


def test_deploy_refuses_an_incomplete_cluster(store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    store.register("acker", "acker", {"address": "10.0.0.1:1"})
    store.register("worker", "worker1", {"address": "10.0.1.1:1", "index": 1})
    store.register("front", "front0", {"address": "10.0.2.0:1", "id": 0})
    store.register("barrier", "barrier0", {"address": "10.0.3.0:1", "partitions": [0]})
    done = flamestream("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert done.returncode == 1 and "need workers 0..0" in done.stderr and "found [1]" in done.stderr
    assert store.latest_tick() is None


def test_cli_push_and_consume_resume_exactly_once(servers: AioServers, store: ClusterStore, zookeeper: str,
                                                  cluster_name: str) -> None:
    front = FakeFront(0)
    add_front(servers, store, front)
    where = ("--zookeeper", zookeeper, "--cluster", cluster_name)
    done = flamestream("push", "--json", "--producer", "cli", *where, stdin='{"a": 1}\n"two"\n3\n')
    assert done.returncode == 0 and "pushed 3 events (0 duplicates)" in done.stderr, done.stderr
    again = flamestream("push", "--json", "--producer", "cli", *where, stdin='{"a": 1}\n"two"\n3\n')
    assert "pushed 3 events (3 duplicates)" in again.stderr
    assert [payload for _, _, payload in front.log] == [{"a": 1}, "two", 3]
    plain = flamestream("push", *where, stdin="line one\n")
    assert plain.returncode == 0 and front.log[-1][2] == "line one"

    barrier = FakeBarrier({0: ["a", "b", "c"], 1: [{"x": 1}, {"x": 2}]})
    add_barrier(servers, store, barrier)
    first = flamestream("consume", "--limit", "2", "--timeout", "10", *where)
    assert first.returncode == 0, first.stderr
    rest = flamestream("consume", "--timeout", "1", "--meta", *where)
    assert rest.returncode == 0, rest.stderr
    seen = [json.loads(line) for line in first.stdout.splitlines()]
    metas = [json.loads(line) for line in rest.stdout.splitlines()]
    assert len(seen) == 2 and len(metas) == 3
    assert Counter(map(json.dumps, seen + [m["payload"] for m in metas])) == Counter(
        map(json.dumps, ["a", "b", "c", {"x": 1}, {"x": 2}]))
    assert all(m["ts"] == 100 + m["offset"] and m["front"] == m["partition"] for m in metas)
    assert barrier.offsets == {("cli", 0): 3, ("cli", 1): 2}
    empty = flamestream("consume", "--timeout", "0.5", *where)
    assert empty.stdout == "" and "consumed 0 records" in empty.stderr


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_consume_merges_partitions_and_commit_stores_the_next_offset(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    barrier = FakeBarrier({0: list(range(5)), 1: list(range(100, 103))})
    add_barrier(servers, store, barrier)
    with Client(zookeeper, cluster_name) as client:
        records = list(client.consume("g", timeout=0.5))
        assert sorted(r.payload for r in records) == [*range(5), *range(100, 103)]
        for partition in (0, 1):  # each partition in offset order
            assert [r.offset for r in records if r.partition == partition] == sorted(
                r.offset for r in records if r.partition == partition)
        client.commit(next(r for r in records if r.partition == 0 and r.offset == 3))
        assert client.committed("g", 0) == 4 and client.committed("g", 1) == 0
        assert [r.payload for r in client.consume("g", timeout=0.5) if r.partition == 0] == [4]
        everything = [r.payload for r in client.consume("g", from_committed=False, timeout=0.5)]
        assert len(everything) == 8
        abandoned = client.consume("g")
        assert next(abandoned).partition in (0, 1)  # left open: closing the client must end it cleanly
    with Client(zookeeper, cluster_name) as client:  # two groups on one client: a record commits to its own
        read_x = next(r for r in client.consume("x", timeout=0.5) if r.partition == 0 and r.offset == 1)
        assert [r.group for r in client.consume("y", timeout=0.5)] == ["y"] * 8
        client.commit(read_x)
        assert (client.committed("x", 0), client.committed("y", 0)) == (2, 0)
    with Client(zookeeper, cluster_name) as client, pytest.raises(ValueError, match="needs a group"):
        client.commit(Record(0, 0, GlobalTime(0, 0), None))


# -- launching processes -------------------------------------------------------------------------------------


def shadow_nodes(data: Path, behaviour: dict[str, str]) -> None:
    """Put a fake ``flamestream`` package in the data directory, which `up` runs the nodes from.

    ``python -m flamestream node`` looks in the working directory first, so it
    replaces the real package for this cluster's nodes only; each node runs
    the code given for its ``--name``.
    """
    package = data / "flamestream"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        f"import sys\nBEHAVIOUR = {behaviour!r}\nexec(BEHAVIOUR[sys.argv[sys.argv.index('--name') + 1]])\n")


SLEEP = "import time\ntime.sleep(600)\n"


@pytest.mark.slow
def test_up_reports_a_crashing_component_and_leaves_nothing_running(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    shadow_nodes(data, {"node0": "import sys\nprint('node0: boom', flush=True)\nsys.exit(3)\n", "node1": SLEEP})
    done = flamestream("up", "--data-dir", str(data), "--timeout", "60")
    assert done.returncode == 1, done.stderr
    assert "node0 failed to start: exited with code 3" in done.stderr and "node0: boom" in done.stderr
    assert not launcher.state_path(data).exists()
    assert_nothing_left(data)


@pytest.mark.slow
def test_up_times_out_on_a_silent_component(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    shadow_nodes(data, dict.fromkeys(["node0", "node1"], SLEEP))
    done = flamestream("up", "--data-dir", str(data), "--timeout", "8")
    assert done.returncode == 1, done.stderr
    assert "node0 failed to start: did not register in ZooKeeper within 8s" in done.stderr
    assert_nothing_left(data)


def assert_nothing_left(data: Path) -> None:
    """No process started for the cluster in ``data`` is alive: `up` starts them all with their cwd there."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if Path(cwd).is_relative_to(data):
                assert not launcher.is_alive(int(entry.name), None), (entry / "cmdline").read_bytes()


@pytest.mark.slow
def test_up_deploy_push_consume_down(tmp_path: Path) -> None:
    """The whole journey over real node processes."""
    data = tmp_path / "cluster"
    where = ("--data-dir", str(data))
    up = flamestream("up", "--nodes", "2", "--fronts", "2", *where)
    assert up.returncode == 0, up.stdout + up.stderr
    processes = json.loads(launcher.state_path(data).read_text())["processes"]
    try:
        endpoints = {line.split()[0]: line.split()[2:] for line in up.stdout.splitlines()}
        assert endpoints == {"zookeeper": [], "node0": ["acker", "worker0", "front0", "barrier0"],
                             "node1": ["worker1", "front1", "barrier1"]}
        again = flamestream("up", *where)
        assert again.returncode == 2 and "already running" in again.stderr

        deploy = flamestream("deploy", "examples/wordcount.py", *where)
        assert deploy.returncode == 0 and deploy.stdout.strip().isdigit(), deploy.stderr
        text = "the dog saw a dog\nA DOG and a cat\n"
        first = flamestream("push", "--producer", "journey", *where, stdin=text)
        assert "pushed 2 events (0 duplicates)" in first.stderr, first.stderr
        repeat = flamestream("push", "--producer", "journey", *where, stdin=text)
        assert "pushed 2 events (2 duplicates)" in repeat.stderr, repeat.stderr
        anonymous = "cat and dog\nthe end\n"
        assert flamestream("push", *where, stdin=anonymous).returncode == 0

        oracle = flamestream("run", "examples/wordcount.py", "--input", "-", "--oracle", stdin=text + anonymous)
        expected = Counter(json.dumps(json.loads(line), sort_keys=True) for line in oracle.stdout.splitlines())
        total = sum(expected.values())
        head = flamestream("consume", "--limit", "5", "--timeout", "60", *where)
        tail = flamestream("consume", "--limit", str(total - 5), "--timeout", "60", *where)
        nothing_more = flamestream("consume", "--timeout", "2", *where)
        got = [json.dumps(json.loads(line), sort_keys=True) for line in (head.stdout + tail.stdout).splitlines()]
        assert Counter(got) == expected  # word counts do not depend on the order across fronts
        assert nothing_more.stdout == ""
        meta = flamestream("consume", "--group", "meta", "--meta", "--limit", str(total), "--timeout", "30", *where)
        rows = [json.loads(line) for line in meta.stdout.splitlines()]
        assert len(rows) == total and {row["partition"] for row in rows} <= {0, 1}
        assert all(row["front"] == row["partition"] for row in rows)
    finally:
        down = flamestream("down", *where)
    assert down.returncode == 0, down.stderr
    assert not launcher.state_path(data).exists()
    for p in processes:
        assert not launcher.is_alive(p["pid"], p["started"]), p
        assert not p["address"] or port_free(p["address"]), p
    assert_nothing_left(data)


@pytest.mark.slow
def test_on_an_idle_cluster_a_redeploy_and_a_rescale_return_and_keep_the_counts(tmp_path: Path) -> None:
    """With one front and nothing pushed, only the front's report takes the min time past a hand-over's start;
    without it ``deploy`` and ``scale`` waited for the next push and timed out (found by a new user)."""
    data = tmp_path / "cluster"
    where = ("--data-dir", str(data))
    up = flamestream("up", "--nodes", "2", *where)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert flamestream("deploy", "examples/wordcount.py", *where).returncode == 0
        assert flamestream("push", *where, stdin="a dog\n").returncode == 0
        first = flamestream("consume", "--limit", "2", "--timeout", "60", *where)
        assert sorted(first.stdout.splitlines()) == ['{"word": "a", "count": 1}', '{"word": "dog", "count": 1}']
        for step in (("deploy", "examples/wordcount.py"), ("scale", "--workers", "3"), ("scale", "--workers", "2")):
            done = flamestream(*step, *where)
            assert done.returncode == 0, (step, done.stderr)  # not the hand-over's timeout, after 60 s
        assert flamestream("push", *where, stdin="dog\n").returncode == 0
        after = flamestream("consume", "--limit", "1", "--timeout", "60", *where)
        assert after.stdout.splitlines() == ['{"word": "dog", "count": 2}'], "the count went on across the ticks"
    finally:
        assert flamestream("down", *where).returncode == 0


def test_a_producer_waits_for_its_own_front_and_never_switches(
        servers: AioServers, store: ClusterStore, zookeeper: str, cluster_name: str) -> None:
    """Deduplication lives in the producer's front; a retry sent to another front would be admitted twice."""
    fronts = [FakeFront(0), FakeFront(1)]
    add_front(servers, store, fronts[0])
    with ClusterStore(zookeeper, cluster=cluster_name) as session:  # front 1's membership ends with this session
        add_front(servers, session, fronts[1])
    store.publish_tick({"fronts": [0, 1]})
    producer = next(p for p in (f"p{i}" for i in range(100)) if stable_hash(p) % 2 == 1)  # pinned to front 1
    with Client(zookeeper, cluster_name, retries=2, backoff=0.01) as client, pytest.raises(ClientError) as failed:
        client.push(["x"], producer=producer)
    assert "front 1 is not registered" in str(failed.value)
    assert fronts[0].calls == [] and fronts[1].calls == []
