"""Failure detection beyond a process exit (issue #11): hangs, broken streams and lost batches become restarts.

The pure part — whether an in-flight global time is stuck — is tested
directly; the timers on real processes: an acker that exits on a stuck global
time, a node that exits on a broken stream, and on a real cluster a SIGSTOPped
node that the supervisor kills and a lost ``Exchange`` batch that the acker
notices, both followed by a recovery whose topic equals the oracle exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health

from flamestream.cluster import ClusterStore
from flamestream.core.acker import AckTable, StallDetector
from flamestream.core.meta import GlobalTime
from flamestream.runtime.channels import LOSE_EXCHANGE
from flamestream.runtime.hosting import StreamBroken, refuses
from flamestream.runtime.supervision import Supervisor
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as pb_grpc
from flamestream.wire.transport import GRPC_OPTIONS, KEEPALIVE_MS
from tests.loopback import free_port
from tests.netns import veth_pair
from tests.test_acker_service import REPO, ack, publish_tick, report, running, send
from tests.test_nodes import eventually
from tests.test_recovery import _kill_and_check, _node

A, B = GlobalTime(10, 0), GlobalTime(20, 0)


# -- the pure detector -----------------------------------------------------------------------------------------


def test_oldest_in_flight_ignores_the_fronts_promises() -> None:
    table = AckTable([0])
    assert table.oldest_in_flight() is None
    table.ack(B, 5)
    table.ack(A, 7)
    assert table.oldest_in_flight() == A and table.min_time() == GlobalTime(0, 0)  # capped by the promise
    table.ack(A, 7)
    assert table.oldest_in_flight() == B
    table.ack(B, 5)
    assert table.oldest_in_flight() is None


def test_a_global_time_stuck_for_the_timeout_is_a_stall() -> None:
    detector = StallDetector(timeout=30)
    assert detector.observe(0, A) is None
    assert detector.observe(29.9, A) is None
    stall = detector.observe(30, A)
    assert stall is not None and stall.time == A and stall.seconds == 30


def test_a_moving_stream_never_stalls_and_nothing_in_flight_is_no_stall() -> None:
    detector = StallDetector(timeout=5)
    for look in range(1000):  # a new oldest time at every look, every 0.1 s
        assert detector.observe(look / 10, GlobalTime(look, 0)) is None
    assert detector.typical == pytest.approx(0.1)
    assert detector.observe(100, None) is None
    assert detector.observe(1000, None) is None  # idle: a silent front holds the min time, nothing is stuck
    assert detector.observe(1001, A) is None  # the clock starts when a time is first seen, not at the last change
    assert detector.observe(1005.9, A) is None
    assert detector.observe(1006, A) is not None


def test_a_slow_stream_gets_longer_than_the_timeout() -> None:
    """The oldest time usually moves on every 4 s (a backlog): stuck means 10 x that, not just the timeout."""
    detector = StallDetector(timeout=5, factor=10)
    for step in range(40):
        assert detector.observe(4.0 * step, GlobalTime(step, 0)) is None
    assert detector.typical == pytest.approx(4.0, rel=0.01)
    start = 4.0 * 39
    assert detector.observe(start + 39, GlobalTime(39, 0)) is None
    stall = detector.observe(start + 41, GlobalTime(39, 0))
    assert stall is not None and stall.typical == pytest.approx(4.0, rel=0.01)


def test_the_detector_needs_a_positive_timeout() -> None:
    with pytest.raises(ValueError, match="positive"):
        StallDetector(timeout=0)


# -- broken streams in a node ----------------------------------------------------------------------------------


async def _broken() -> None:
    raise StreamBroken("stream to worker 1 at 10.0.0.2:5000 broke (UNAVAILABLE: Socket closed)")


def test_a_broken_stream_that_does_not_come_back_stops_the_node_naming_the_peer() -> None:
    async def scenario() -> None:
        supervisor = Supervisor(health.aio.HealthServicer(), stream_timeout=0.2)
        supervisor.spawn("worker0", "min-time watch", _broken())
        await asyncio.sleep(0.05)
        assert not supervisor.fatal.is_set() and "worker0" in supervisor.failures  # NOT_SERVING, still running
        await asyncio.wait_for(supervisor.fatal.wait(), 5)
        await supervisor.stop()

    asyncio.run(scenario())


def test_a_broken_stream_whose_role_recovers_in_time_does_not_stop_the_node() -> None:
    async def scenario() -> None:
        supervisor = Supervisor(health.aio.HealthServicer(), stream_timeout=0.3)
        supervisor.spawn("worker0", "min-time watch", _broken())
        await asyncio.sleep(0.05)
        await supervisor.recovered("worker0", "min-time watch")
        fatal = asyncio.create_task(supervisor.fatal.wait())
        done, _ = await asyncio.wait([fatal], timeout=1.0)  # more than three times the timeout
        assert not done and not supervisor.failures
        fatal.cancel()
        await supervisor.stop()

    asyncio.run(scenario())


def _closed_port() -> str:
    """A loopback address nothing listens on."""
    return f"127.0.0.1:{free_port()}"


def test_refuses_tells_a_closed_port_from_a_listening_one() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            assert await refuses(_closed_port())
            assert not await refuses(f"127.0.0.1:{port}")
            assert not await refuses("not an address")
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_broken_stream_to_a_dead_peer_stops_the_node_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """The peer's address refuses connections: its process is gone, so the node stops without waiting out the
    stream timeout (here an hour), to restart alongside the dead peer."""
    peer = _closed_port()

    async def broken() -> None:
        raise StreamBroken(f"stream to worker 1 at {peer} broke (UNAVAILABLE: Socket closed)", peer)

    async def scenario() -> None:
        supervisor = Supervisor(health.aio.HealthServicer(), stream_timeout=3600)
        supervisor.spawn("worker0", "exchange", broken())
        await asyncio.wait_for(supervisor.fatal.wait(), 10)
        await supervisor.stop()

    with caplog.at_level(logging.CRITICAL):
        asyncio.run(scenario())
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert f"{peer} refuses connections: the process there is gone" in record.getMessage()


def test_a_broken_stream_to_a_live_peer_waits_for_the_stream_timeout() -> None:
    """The peer still accepts connections (a cut stream, not a dead process): the probe proves nothing, so the
    node stops only after the timeout; the probe's own answer is awaited first (positive signal)."""
    async def scenario() -> None:
        accepted = asyncio.Event()

        def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set()
            writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        peer = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

        async def broken() -> None:
            raise StreamBroken(f"stream to worker 1 at {peer} broke", peer)

        supervisor = Supervisor(health.aio.HealthServicer(), stream_timeout=1.0)
        started = asyncio.get_running_loop().time()
        supervisor.spawn("worker0", "exchange", broken())
        await asyncio.wait_for(accepted.wait(), 10)  # the probe connected
        await asyncio.sleep(0.1)  # and had its answer handled
        assert not supervisor.fatal.is_set()
        await asyncio.wait_for(supervisor.fatal.wait(), 10)
        assert asyncio.get_running_loop().time() - started >= 1.0
        await supervisor.stop()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())


@pytest.mark.parametrize("back", [False, True])
def test_a_front_whose_route_stays_broken_against_a_live_peer_stops_the_node_after_the_timeout(
        back: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A front does not fail over a broken stream: it marks its route broken and waits for a new tick.  If the
    peer still listens (its restart's handshake broke the stream) and no tick comes, the node stops after the
    stream timeout — it once waited for the acker's stall watch, 30 s — and not if the route was replaced."""
    async def scenario() -> bool:
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
        peer = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        supervisor = Supervisor(health.aio.HealthServicer(), stream_timeout=0.5)
        broken = [True]
        supervisor.peer_lost("front0", f"stream to worker 1 at {peer} broke", StreamBroken("broke", peer),
                             lambda: broken[0])
        if back:
            broken[0] = False  # a new tick replaced the route
        fatal = asyncio.create_task(supervisor.fatal.wait())
        done, _ = await asyncio.wait([fatal], timeout=5.0)  # the probes (1 s) and the timeout, with room
        fatal.cancel()
        await supervisor.stop()
        server.close()
        await server.wait_closed()
        return bool(done)

    with caplog.at_level(logging.WARNING):
        stopped = asyncio.run(scenario())
    assert any("still accepts connections: waiting up to 0.5s" in r.getMessage() for r in caplog.records)
    assert stopped is not back
    if stopped:
        (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert "it did not come back within 0.5s" in record.getMessage()


_SINK = """
import asyncio, sys
import grpc
from flamestream.runtime.frames import FrameServer, NodeServicer
from flamestream.wire import flamestream_pb2 as pb, flamestream_pb2_grpc as rpc
from flamestream.wire.transport import EXCHANGE, GRPC_OPTIONS

class Sink(rpc.WorkerServicer):
    async def Exchange(self, request_iterator, context):
        async for _ in request_iterator:
            print("got a batch", flush=True)
        return pb.Empty()

async def main():
    server = grpc.aio.server(options=GRPC_OPTIONS)
    frames = FrameServer({EXCHANGE: Sink().Exchange}.get, None)
    rpc.add_NodeServicer_to_server(NodeServicer(frames), server)
    await frames.start(sys.argv[1].rpartition(":")[0])
    server.add_insecure_port(sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""

_WRITER = """
import asyncio, json, sys, time
from flamestream.runtime.channels import Channels, LocalEndpoints
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.transport import EXCHANGE

async def main():
    broken = asyncio.Queue()
    channels = Channels(LocalEndpoints(), broken.put_nowait)
    await channels.write(sys.argv[1], EXCHANGE, pb.ItemBatch(sender=1))
    try:
        report = await asyncio.wait_for(broken.get(), float(sys.argv[2]))
    except TimeoutError:
        print(json.dumps({"at": None}), flush=True)
    else:
        print(json.dumps({"at": time.monotonic(), "report": str(report)}), flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_an_idle_stream_over_a_cut_link_is_reported_broken_by_the_keepalive(tmp_path: Path) -> None:
    """Two hosts (network namespaces); a stream carried one batch and then sits idle, as a re-send waiting for the
    min time does.  The link goes down without a reset reaching anyone: only the keepalive notices (TCP's, with
    gRPC's timings, on the frames connection)."""
    names, address = ("fs-ka-a", "fs-ka-b"), "10.232.0.2:7411"
    with veth_pair(names, ("fs-ka-va", "fs-ka-vb"), ("10.232.0.1", "10.232.0.2")):
        sink_log = tmp_path / "sink.log"
        with sink_log.open("w") as out:
            sink = subprocess.Popen(["ip", "netns", "exec", names[1], sys.executable, "-c", _SINK, address], cwd=REPO,
                                    stdout=out, stderr=subprocess.STDOUT, text=True)
        writer: subprocess.Popen[str] | None = None
        try:
            eventually(lambda: "ready" in sink_log.read_text(), "the sink's ready line")
            writer = subprocess.Popen(["ip", "netns", "exec", names[0], sys.executable, "-c", _WRITER, address, "60"],
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            eventually(lambda: "got a batch" in sink_log.read_text(), "the batch at the sink")
            subprocess.run(["ip", "-n", names[1], "link", "set", "fs-ka-vb", "down"], check=True, timeout=30)
            cut_at = time.monotonic()
            out_text, err_text = writer.communicate(timeout=120)
            assert writer.returncode == 0, err_text
            result = json.loads(out_text.strip().splitlines()[-1])
            assert result["at"] is not None, "the idle stream's break went unnoticed for 60 s"
            assert "UNAVAILABLE" in result["report"], result
            # 10 s without traffic, then a probe unanswered for 5 s (transport.KEEPALIVE_MS), with some slack.
            assert result["at"] - cut_at < 30, result
        finally:
            for process in (writer, sink):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()


@pytest.mark.slow
def test_an_idle_stream_outlives_the_keepalive_pings(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """The other side of the keepalive: a healthy stream that sits idle (a min-time watch on an idle cluster) must
    not be cut by the server as a ping abuser.  With the server's ping interval set under a name gRPC does not know,
    the third unanswered-by-data ping (~30 s) drew a GOAWAY "too_many_pings" and the stream broke: a node exit and
    a recovery on every idle half-minute."""
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with running("acker", args, tmp_path / "acker.err") as acker:
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=100, acker=acker.address)
        # The options every member's channels use (a channel of its own: the acks below must not be its traffic).
        with grpc.insecure_channel(acker.address, options=GRPC_OPTIONS) as idle, \
                grpc.insecure_channel(acker.address) as other:
            watch = pb_grpc.AckerStub(idle).WatchMinTime(pb.Empty(), timeout=120)
            assert next(watch) == pb.GlobalTime(ts=100, front=0)
            time.sleep(4 * KEEPALIVE_MS[0] / 1000)  # four pings without data
            send(pb_grpc.AckerStub(other), [pb.AckBatch(acks=[ack(150, 0, 5), ack(150, 0, 5)], tick=0),
                                            report(0, 200)])
            assert next(watch) == pb.GlobalTime(ts=200, front=0)  # the watch is still there
            watch.cancel()


@pytest.mark.slow
def test_a_node_exits_1_naming_the_acker_whose_stream_broke(zookeeper: str, cluster_name: str,
                                                            tmp_path: Path) -> None:
    """A worker node whose acker dies: its streams to the acker break and the acker's address refuses connections,
    so the node exits 1 at once, not after --stream-timeout (an hour here).  Two streams go to the acker, both open
    since the tick was deployed (``Channels.warm``): the min-time watch and the worker's acks.  Whichever is seen
    to break first names it; the node may exit before the other is logged."""
    acker = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--name", "acker", "--zookeeper",
                              zookeeper, "--cluster", cluster_name, "--acker"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    worker = None
    try:
        assert acker.stdout is not None
        address = acker.stdout.readline().split()[2]
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=0, acker=address)
        log = tmp_path / "worker.log"
        worker = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--name", "w", "--zookeeper",
                                   zookeeper, "--cluster", cluster_name, "--worker", "0", "--stream-timeout", "3600",
                                   "--log-file", str(log)], cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        eventually(lambda: "serving worker0" in (log.read_text() if log.exists() else ""), "the worker to serve")
        # Its min-time watch waits for the acker (wait_for_ready): kill the acker only once a min time came through
        # it.  A connection to the acker's port was not enough: killed before the call was sent on it, the watch
        # waited for the acker to come back (CI, under load: the node outlived the 60 s below).
        eventually(lambda: "min times from the acker" in log.read_text(), "the worker's min-time watch")
        acker.kill()
        assert worker.wait(60) == 1
        text = log.read_text()
        assert f"min-time stream from the acker at {address} broke" in text or f"stream to {address} broke" in text
        assert f"{address} refuses connections: the process there is gone" in text
    finally:
        for process in (acker, worker):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


# -- lost batches: the acker's stall watch ---------------------------------------------------------------------


@pytest.mark.slow
def test_an_acker_exits_1_on_a_global_time_stuck_in_flight(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """A send ack whose receipt never comes (the batch was lost): the acker logs the global time and exits 1,
    while a time that completes, and the fronts' reports moving on, change nothing about that."""
    log = tmp_path / "acker.log"
    acker = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--name", "acker", "--zookeeper",
                              zookeeper, "--cluster", cluster_name, "--acker", "--stall-timeout", "2",
                              "--log-file", str(log)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    try:
        assert acker.stdout is not None
        address = acker.stdout.readline().split()[2]
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=100, acker=address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.AckerStub(channel)
            send(stub, [pb.AckBatch(acks=[ack(150, 0, 0xA), ack(160, 0, 0xB)], tick=0), report(0, 1000),
                        pb.AckBatch(acks=[ack(160, 0, 0xB)], tick=0)])  # 160 completes, 150 stays in flight
        assert acker.wait(60) == 1
    finally:
        if acker.poll() is None:
            acker.kill()
            acker.wait()
    text = log.read_text()
    assert "global time GlobalTime(ts=150, front=0) has been in flight" in text and "a batch was lost" in text


# -- on a real cluster: detection, restart, recovery, topic == oracle --------------------------------------------

@pytest.mark.slow
def test_a_sigstopped_node_is_killed_by_the_supervisor_and_the_cluster_recovers(cluster_dir: Path, zookeeper: str,
                                                                                 cluster_name: str) -> None:
    def hang(_store: ClusterStore) -> int:
        node1 = _node(cluster_dir, "node1")
        os.kill(node1["pid"], signal.SIGSTOP)  # alive, holding its port, answering nothing
        eventually(lambda: _node(cluster_dir, "node1")["restarts"] >= 1, "the supervisor to restart node1")
        return 1  # recovery tick

    _kill_and_check(cluster_dir, zookeeper, cluster_name,
                    ["--nodes", "2", "--snapshot-interval-ms", "300", "--hang-timeout", "5"], hang)
    supervisor = (cluster_dir / "logs" / "supervisor.out").read_text()
    assert "node node1" in supervisor and "hangs: no answer to its health check" in supervisor, supervisor


@pytest.mark.slow
def test_a_lost_exchange_batch_is_detected_by_the_acker_and_the_cluster_recovers(
        cluster_dir: Path, zookeeper: str, cluster_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loss = tmp_path / "lose-one-exchange"
    monkeypatch.setenv(LOSE_EXCHANGE, str(loss))  # inherited by `up`, its nodes and its supervisor

    def lose(_store: ClusterStore) -> int:
        loss.touch()
        eventually(lambda: Path(f"{loss}.lost").exists(), "a node to lose an Exchange batch")
        return 1  # recovery tick

    _kill_and_check(cluster_dir, zookeeper, cluster_name,
                    ["--nodes", "2", "--snapshot-interval-ms", "300", "--stall-timeout", "8"], lose)
    node0 = (cluster_dir / "logs" / "node0.log").read_text()
    assert "has been in flight" in node0 and "a batch was lost or a worker is stuck" in node0
    assert not loss.exists()  # one batch lost, not one per process
