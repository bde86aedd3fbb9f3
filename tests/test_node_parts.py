"""The pieces of a node, in one process: in-process streams keep the gRPC stream contract; supervision shows failures.

The real-process side (a node hosting every role, several nodes, a killed
node turning its peer NOT_SERVING) is in tests/test_nodes.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2

from flamestream.runtime import hosting
from flamestream.runtime.channels import Channels, LocalEndpoints, LocalStream
from flamestream.runtime.frames import FrameServer, FrameStream, NodeServicer
from flamestream.runtime.hosting import LocalContext, StreamBroken
from flamestream.runtime.supervision import Supervisor
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.transport import ACK, DELIVER, EXCHANGE
from tests.loopback import free_port, start_server, stop_server

HERE = "127.0.0.1:7000"


class Receiver:
    """A client-streaming handler like ``Worker.Exchange``: records what arrives; aborts on a marked message."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.ended = asyncio.Event()

    async def handle(self, requests: AsyncIterator[pb.ItemBatch], context: Any) -> pb.Empty:
        async for message in requests:
            if message.sender < 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"refused {message.sender}")
            self.got.append(message.sender)
            await asyncio.sleep(0)  # a receiver that yields: the writer must not overtake it
        self.ended.set()
        return pb.Empty()


def test_a_node_runs_with_the_short_switch_interval() -> None:
    """Threads doing a node's disk writes get the GIL back within ``SWITCH_INTERVAL``, not CPython's 5 ms."""
    seen: list[float] = []

    async def main() -> None:
        seen.append(sys.getswitchinterval())

    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    try:
        hosting.run(main)
    finally:  # this process is pytest's, not a node's
        sys.setswitchinterval(before)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert seen == [hosting.SWITCH_INTERVAL] and before > hosting.SWITCH_INTERVAL


def test_local_streams_are_fifo_and_close_waits_for_the_receiver() -> None:
    async def scenario() -> None:
        receiver = Receiver()
        stream = LocalStream[pb.ItemBatch](receiver.handle, "worker 0")
        for i in range(500):  # far more than the queue holds: the writer waits, nothing is dropped
            await stream.write(pb.ItemBatch(sender=i))
        await stream.close()
        assert receiver.ended.is_set()
        assert receiver.got == list(range(500))

    asyncio.run(scenario())


def test_an_aborted_local_stream_breaks_the_next_write_like_grpc() -> None:
    async def scenario() -> None:
        receiver = Receiver()
        stream = LocalStream[pb.ItemBatch](receiver.handle, "barrier 0")
        await stream.write(pb.ItemBatch(sender=1))
        await stream.write(pb.ItemBatch(sender=-7))
        with pytest.raises(StreamBroken, match=r"barrier 0.*refused -7"):
            for _ in range(100):  # the abort lands once the receiver reaches the message
                await stream.write(pb.ItemBatch(sender=2))
                await asyncio.sleep(0.01)
        assert receiver.got == [1]
        await stream.close()  # closing a broken stream is a no-op, as for gRPC

    asyncio.run(scenario())


def test_a_local_stream_that_breaks_is_reported_without_another_write() -> None:
    """A writer with nothing more to write must learn of the break too (``Channels``' ``on_broken``)."""
    async def scenario() -> None:
        broken: asyncio.Queue[StreamBroken] = asyncio.Queue()
        stream = LocalStream[pb.ItemBatch](Receiver().handle, "barrier 0", broken.put_nowait)
        await stream.write(pb.ItemBatch(sender=-7))
        report = await asyncio.wait_for(broken.get(), 10)
        assert "barrier 0" in str(report) and "refused -7" in str(report)
        # logged like any failure: with a traceback, and the receiver's own failure as its cause
        assert report.__traceback__ is not None and "refused -7" in str(report.__cause__)
        assert report.__cause__ is not None and report.__cause__.__traceback__ is not None
        await stream.close()

    asyncio.run(scenario())


class _OneBatchAndGone(rpc.WorkerServicer):
    """A receiver whose stream ends after it took one batch: the batch is gone with it, unseen by the writer."""

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        async for _batch in request_iterator:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gone after one batch")
        return pb.Empty()


def test_a_stream_to_another_node_that_breaks_after_its_last_write_is_reported() -> None:
    """The write returned (the socket took the batch), nothing more is written: only the call's end tells of the
    loss."""
    async def scenario() -> None:
        receiver = _OneBatchAndGone()
        server, address = await start_server(lambda s: rpc.add_WorkerServicer_to_server(receiver, s),
                                             {EXCHANGE: receiver.Exchange})
        broken: asyncio.Queue[StreamBroken] = asyncio.Queue()
        channels = Channels(LocalEndpoints(HERE), broken.put_nowait)
        try:
            await channels.write(address, EXCHANGE, pb.ItemBatch(sender=1))
            report = await asyncio.wait_for(broken.get(), 10)
            assert report.peer == address and "UNAVAILABLE: gone after one batch" in str(report)
            assert report.__traceback__ is not None  # logged with one, like any failure
        finally:
            await channels.close()
            await stop_server(server)

    asyncio.run(scenario())


class _Collecting(rpc.WorkerServicer):
    def __init__(self) -> None:
        self.got: list[int] = []

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        async for batch in request_iterator:
            self.got.append(batch.sender)
        return pb.Empty()


def test_a_first_write_waits_for_a_peer_it_could_not_connect_to_yet() -> None:
    """A call that could not connect was never sent, so nothing of the stream is lost: the first write waits for
    the connection (up to ``CONNECT_WAIT``) instead of breaking the stream, which restarts the cluster.  For 0.3 s
    the port hangs up on every connection, as a failed handshake does; then the receiver serves there."""
    async def scenario() -> None:
        port = free_port()
        receiver, server = _Collecting(), grpc.aio.server()
        rpc.add_WorkerServicer_to_server(receiver, server)
        frames = FrameServer({EXCHANGE: receiver.Exchange}.get, None)
        rpc.add_NodeServicer_to_server(NodeServicer(frames), server)
        broken: list[StreamBroken] = []
        channels = Channels(LocalEndpoints(HERE), broken.append)
        hung_up = 0

        def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal hung_up
            hung_up += 1
            writer.transport.abort()

        rude = await asyncio.start_server(hang_up, "127.0.0.1", port)

        async def serve_later() -> None:
            await asyncio.sleep(0.3)
            rude.close()
            await rude.wait_closed()
            await frames.start("127.0.0.1")
            assert server.add_insecure_port(f"127.0.0.1:{port}") == port
            await server.start()

        later = asyncio.create_task(serve_later())
        try:
            await channels.write(f"127.0.0.1:{port}", EXCHANGE, pb.ItemBatch(sender=1))
            await channels.write(f"127.0.0.1:{port}", EXCHANGE, pb.ItemBatch(sender=2))
            assert later.done() and hung_up > 0 and not broken
        finally:
            await channels.close()
            await later
            await frames.close()
            await server.stop(None)
        assert receiver.got == [1, 2]

    asyncio.run(scenario())


def test_a_first_write_to_a_port_nothing_listens_on_breaks_the_stream_at_once() -> None:
    """A refused connection: the process there is gone, so the first write does not wait for it."""
    async def scenario() -> None:
        channels = Channels(LocalEndpoints(HERE))
        address = f"127.0.0.1:{free_port()}"
        try:
            started = time.monotonic()
            with pytest.raises(StreamBroken, match="Connection refused") as info:
                await channels.write(address, EXCHANGE, pb.ItemBatch(sender=1))
            assert info.value.peer == address and time.monotonic() - started < hosting.CONNECT_WAIT
        finally:
            await channels.close()

    asyncio.run(scenario())


def test_a_stream_its_writer_closes_is_no_break() -> None:
    async def scenario() -> None:
        broken: list[StreamBroken] = []
        receiver = Receiver()
        stream = LocalStream[pb.ItemBatch](receiver.handle, "worker 0", broken.append)
        await stream.write(pb.ItemBatch(sender=1))
        await stream.close()  # the receiver's end is reported (or not) before close returns
        assert receiver.ended.is_set() and receiver.got == [1]
        assert broken == []

    asyncio.run(scenario())


def test_local_context_abort_raises_like_a_servicer_context() -> None:
    async def scenario() -> None:
        with pytest.raises(Exception, match="NOT_FOUND: no such partition"):
            await LocalContext().abort(grpc.StatusCode.NOT_FOUND, "no such partition")

    asyncio.run(scenario())


def test_channels_use_the_local_handler_only_for_this_nodes_address_and_its_methods() -> None:
    async def scenario() -> None:
        receiver = Receiver()
        local = LocalEndpoints(HERE)
        local.streams[EXCHANGE] = receiver.handle
        channels = Channels(local)
        assert isinstance(channels.stream(HERE, EXCHANGE), LocalStream)
        assert channels.stream(HERE, EXCHANGE) is channels.stream(HERE, EXCHANGE)  # one stream: FIFO
        assert isinstance(channels.stream(HERE, DELIVER), FrameStream)  # no barrier on this node
        assert isinstance(channels.stream("127.0.0.1:7001", EXCHANGE), FrameStream)  # another node
        await channels.write(HERE, EXCHANGE, pb.ItemBatch(sender=3))
        await channels.close()
        assert receiver.got == [3]

    asyncio.run(scenario())


def test_min_time_watch_is_the_local_ackers_generator_on_its_node() -> None:
    async def watch(request: pb.Empty, context: Any) -> AsyncIterator[pb.GlobalTime]:
        for ts in (1, 5, 9):
            yield pb.GlobalTime(ts=ts, front=0)

    async def scenario() -> None:
        local = LocalEndpoints(HERE)
        local.min_time = watch
        local.streams[ACK] = Receiver().handle
        seen = [mt.ts async for mt in Channels(local).watch_min_time(HERE)]
        assert seen == [1, 5, 9]

    asyncio.run(scenario())


async def _statuses(servicer: health.aio.HealthServicer, services: list[str]) -> list[str]:
    names = []
    for service in services:
        reply = await servicer.Check(health_pb2.HealthCheckRequest(service=service), None)
        names.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return names


def test_a_failed_task_is_logged_with_its_traceback_and_turns_its_role_not_serving(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken_watch() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("acker stream ended")

    async def scenario() -> None:
        servicer = health.aio.HealthServicer()
        supervisor = Supervisor(servicer)
        await supervisor.serving(["worker0", "front0"])
        task = supervisor.spawn("worker0", "min-time watch", broken_watch())
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.01)  # the health update is a task of its own
        assert await _statuses(servicer, ["worker0", "", "front0"]) == ["NOT_SERVING", "NOT_SERVING", "SERVING"]
        assert not supervisor.fatal.is_set()  # not essential: the node goes on, visibly degraded
        assert "acker stream ended" in supervisor.failures["worker0"]
        await supervisor.stop()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    (record,) = [r for r in caplog.records if "min-time watch failed" in r.getMessage()]
    assert record.name == "flamestream.worker0" and record.levelno == logging.ERROR
    assert record.exc_info is not None and "ConnectionError" in caplog.text and "Traceback" in caplog.text


def test_an_essential_task_that_ends_stops_the_node_and_shutdown_is_no_failure() -> None:
    async def returns() -> None:
        return None

    async def forever() -> None:
        await asyncio.Event().wait()

    async def scenario() -> None:
        supervisor = Supervisor(health.aio.HealthServicer())
        supervisor.spawn("barrier0", "release loop", returns(), essential=True)
        await asyncio.wait_for(supervisor.fatal.wait(), 5)
        assert supervisor.failures == {"barrier0": "release loop ended unexpectedly"}
        supervisor.spawn("front0", "reports", forever())
        await supervisor.stop()  # cancelling at shutdown is not a failure
        assert set(supervisor.failures) == {"barrier0"}

    asyncio.run(scenario())
