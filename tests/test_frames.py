"""The frames listener against hostile and broken callers, on real sockets (``flamestream.runtime.frames``).

Each test speaks the protocol by hand where it must misbehave (a garbage frame,
a huge length, a client certificate), and through ``Channels`` where it must not.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from pathlib import Path
from typing import Any

import grpc
import pytest

from flamestream.runtime import frames, tls
from flamestream.runtime.channels import Channels, LocalEndpoints
from flamestream.runtime.frames import END, FrameServer
from flamestream.runtime.hosting import StreamBroken
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.security import Credentials
from flamestream.wire.transport import ACK, EXCHANGE, MAX_MESSAGE_BYTES
from tests.loopback import FramesAt, start_server, stop_server


class Collecting(rpc.WorkerServicer):
    def __init__(self) -> None:
        self.got: list[int] = []
        self.ends: list[str] = []

    async def Exchange(self, request_iterator: Any, context: Any) -> pb.Empty:
        try:
            async for batch in request_iterator:
                self.got.append(batch.sender)
        except BaseException as exc:
            self.ends.append(type(exc).__name__)
            raise
        self.ends.append("end")
        return pb.Empty()


def frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


async def status_of(reader: asyncio.StreamReader) -> str:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    return (await reader.readexactly(length)).decode()


async def call(port: int, *frames: bytes, tls_context: ssl.SSLContext | None = None) -> str:
    """Open a connection, send ``frames`` as they are, and return the status the server answers with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls_context,
                                                   server_hostname="127.0.0.1" if tls_context else None)
    try:
        writer.write(b"".join(frames))
        await writer.drain()
        async with asyncio.timeout(10):
            return await status_of(reader)
    finally:
        writer.close()


def test_a_stream_over_frames_arrives_in_order_and_its_close_is_no_break() -> None:
    async def scenario() -> None:
        receiver = Collecting()
        server, address = await start_server(lambda s: rpc.add_WorkerServicer_to_server(receiver, s),
                                             {EXCHANGE: receiver.Exchange})
        broken: list[StreamBroken] = []
        channels = Channels(LocalEndpoints("127.0.0.1:1"), broken.append)
        try:
            for sender in range(500):
                await channels.write(address, EXCHANGE, pb.ItemBatch(sender=sender, items=b"x" * (sender % 7)))
            await channels.write(address, EXCHANGE, pb.ItemBatch())  # an empty message is a frame of length 0
        finally:
            await channels.close()  # returns once the receiver answered END
            await stop_server(server)
        assert receiver.got == [*range(500), 0] and receiver.ends == ["end"] and broken == []

    asyncio.run(scenario())


def test_a_stream_to_an_address_without_a_port_breaks_instead_of_failing_its_writer() -> None:
    """Addresses come from ticks, which ZooKeeper holds: a bad one is a broken stream (the supervisor's business),
    never an exception that ends the task writing to it."""
    async def scenario() -> None:
        channels = Channels(LocalEndpoints("127.0.0.1:1"))
        try:
            with pytest.raises(StreamBroken, match="has no port"):
                await channels.write("node-without-port", EXCHANGE, pb.ItemBatch())
        finally:
            await channels.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("frames", "status"), [
    ((frame(EXCHANGE.encode()), frame(b"\xff\xff not a batch")),
     f"INVALID_ARGUMENT\n{EXCHANGE}: the request is not a flamestream.ItemBatch message"),
    ((frame(EXCHANGE.encode()), struct.pack(">I", MAX_MESSAGE_BYTES + 1)),
     f"RESOURCE_EXHAUSTED\na frame of {MAX_MESSAGE_BYTES + 1} bytes"),
    ((struct.pack(">I", 10_000),), "RESOURCE_EXHAUSTED\na frame of 10000 bytes (at most 256)"),
    ((frame(b"/flamestream.Front/Push"),), "UNIMPLEMENTED\nno stream"),
    ((frame(ACK.encode()),), "UNIMPLEMENTED\nno stream"),  # a method this listener's node does not serve
    ((struct.pack(">I", END),), "UNIMPLEMENTED\nno stream"),
])
def test_hostile_frames_end_their_own_call_and_the_listener_goes_on(frames: tuple[bytes, ...], status: str) -> None:
    """A garbage message, a length beyond the limit (refused before its bytes are read), a method that is not a
    stream here: each ends its call with a status naming it; the next call is served as if nothing happened."""
    async def scenario() -> None:
        receiver = Collecting()
        listener = FrameServer({EXCHANGE: receiver.Exchange}.get, None)
        port = await listener.start("127.0.0.1")
        try:
            assert (await call(port, *frames)).startswith(status)
            assert await call(port, frame(EXCHANGE.encode()), frame(pb.ItemBatch(sender=7).SerializeToString()),
                              struct.pack(">I", END)) == "OK"
        finally:
            await listener.close()
        assert receiver.got[-1] == 7

    asyncio.run(scenario())


def test_a_connection_that_names_no_method_is_closed_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        monkeypatch.setattr(frames, "METHOD_WAIT", 0.2)
        listener = FrameServer({}.get, None)
        port = await listener.start("127.0.0.1")
        try:
            assert await call(port) == "DEADLINE_EXCEEDED\nno method within 0.2 s"  # sends nothing at all
        finally:
            await listener.close()

    asyncio.run(scenario())


def test_a_writer_that_vanishes_without_end_cancels_its_call_and_keeps_what_arrived() -> None:
    """As gRPC cancels a call whose client went away: the handler took what arrived, and its iteration ends with
    an error rather than as a clean end (which would say the writer closed the stream)."""
    async def scenario() -> None:
        receiver = Collecting()
        listener = FrameServer({EXCHANGE: receiver.Exchange}.get, None)
        port = await listener.start("127.0.0.1")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frame(EXCHANGE.encode()) + frame(pb.ItemBatch(sender=1).SerializeToString())
                         + struct.pack(">I", 99) + b"cut")  # a frame cut short
            await writer.drain()
            writer.transport.abort()
            async with asyncio.timeout(10):
                while not receiver.ends:
                    await asyncio.sleep(0.01)
        finally:
            await listener.close()
        assert receiver.got == [1] and receiver.ends == ["_PeerGone"]

    asyncio.run(scenario())


def test_a_receiver_that_goes_away_breaks_the_stream_with_unavailable() -> None:
    async def scenario() -> None:
        receiver = Collecting()
        server, address = await start_server(lambda s: rpc.add_WorkerServicer_to_server(receiver, s),
                                             {EXCHANGE: receiver.Exchange})
        broken: asyncio.Queue[StreamBroken] = asyncio.Queue()
        channels = Channels(LocalEndpoints("127.0.0.1:1"), broken.put_nowait)
        try:
            await channels.write(address, EXCHANGE, pb.ItemBatch(sender=1))
            async with asyncio.timeout(10):
                while not receiver.got:
                    await asyncio.sleep(0.01)
            await stop_server(server)  # cancels the call under way, as a killed node's kernel resets it
            async with asyncio.timeout(10):
                report = await broken.get()
            assert report.peer == address and "UNAVAILABLE: connection lost" in str(report)
            with pytest.raises(StreamBroken, match="UNAVAILABLE"):
                await channels.write(address, EXCHANGE, pb.ItemBatch(sender=2))
        finally:
            await channels.close()
        assert receiver.got == [1]

    asyncio.run(scenario())


def test_only_a_node_certificate_may_open_a_secured_frames_stream(tmp_path: Path) -> None:
    """The clients' certificate is signed by the same CA, so the handshake passes: the listener refuses it
    itself, since frames carry only internal streams (as ``AuthInterceptor`` does for the same methods)."""
    directory = tls.init(tmp_path / "tls", [("n0", "127.0.0.1"), ("n1", "127.0.0.1")])

    async def scenario() -> None:
        receiver = Collecting()
        listener = FrameServer({EXCHANGE: receiver.Exchange}.get,
                               Credentials.load(directory, node="n0").ssl_context(server=True))
        port = await listener.start("127.0.0.1")
        batch = frame(pb.ItemBatch(sender=5).SerializeToString())
        try:
            node = Credentials.load(directory, node="n1").ssl_context(server=False)
            client = Credentials.load(directory).ssl_context(server=False)
            assert await call(port, frame(EXCHANGE.encode()), batch, struct.pack(">I", END),
                              tls_context=node) == "OK"
            assert (await call(port, frame(EXCHANGE.encode()), batch, struct.pack(">I", END),
                               tls_context=client)).startswith("PERMISSION_DENIED\n")
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await call(port, frame(EXCHANGE.encode()))  # plaintext to a TLS listener: no call at all
        finally:
            await listener.close()
        assert receiver.got == [5]

    asyncio.run(scenario())


async def first_break(address: str) -> StreamBroken:
    """Write one batch to ``address`` over frames; the break its stream reports (within 10 s)."""
    broken: asyncio.Queue[StreamBroken] = asyncio.Queue()
    channels = Channels(LocalEndpoints("127.0.0.1:1"), broken.put_nowait)
    try:
        await channels.write(address, EXCHANGE, pb.ItemBatch(sender=1))
        async with asyncio.timeout(10):
            return await broken.get()
    finally:
        await channels.close()


class Refusing(rpc.WorkerServicer):
    """Aborts its call at the first batch with a megabyte of details (a handler quoting what it refused)."""

    async def Exchange(self, request_iterator: Any, context: Any) -> pb.Empty:
        async for _batch in request_iterator:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "é" * 500_000)
        return pb.Empty()


def test_a_long_status_is_cut_to_its_limit_and_still_names_its_code() -> None:
    async def scenario() -> None:
        receiver = Refusing()
        server, address = await start_server(lambda s: rpc.add_WorkerServicer_to_server(receiver, s),
                                             {EXCHANGE: receiver.Exchange})
        try:
            report = await first_break(address)
        finally:
            await stop_server(server)
        assert "INVALID_ARGUMENT: éé" in str(report)
        assert len(str(report).encode()) < frames.STATUS_BYTES + 200  # cut mid-character: replaced, not an error

    asyncio.run(scenario())


def test_a_status_frame_over_the_limit_breaks_the_stream_unread() -> None:
    """A receiver that answers with a 50 MB status: the writer refuses the length and reports the stream broken,
    without waiting for (or holding) the bytes."""
    async def scenario() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(struct.unpack(">I", await reader.readexactly(4))[0])  # the method
            writer.write(struct.pack(">I", 50_000_000) + b"x" * 100)
            await writer.drain()
            await asyncio.sleep(30)  # holds the connection open: the writer must not wait for the rest

        raw = await asyncio.start_server(answer, "127.0.0.1", 0)
        server, address = await start_server(
            lambda s: rpc.add_NodeServicer_to_server(FramesAt(raw.sockets[0].getsockname()[1]), s))
        try:
            report = await first_break(address)
        finally:
            await stop_server(server)
            raw.close()
        assert "UNAVAILABLE: connection lost" in str(report)
        assert f"a frame of 50000000 bytes (at most {frames.STATUS_BYTES})" in str(report)

    asyncio.run(scenario())


class Opening(Collecting):
    """Counts the calls that reached the handler: a frames call starts it when its method frame arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.called = asyncio.Event()

    async def Exchange(self, request_iterator: Any, context: Any) -> pb.Empty:
        self.calls += 1
        self.called.set()
        return await super().Exchange(request_iterator, context)


def warming(address: str) -> tuple[Channels, list[StreamBroken]]:
    """Channels with one stream to ``address`` declared and warming (call on a running loop), and the breaks they
    report."""
    broken: list[StreamBroken] = []
    channels = Channels(LocalEndpoints("127.0.0.1:1"), broken.append)
    channels.stream(address, EXCHANGE)
    channels.warm()
    return channels, broken


def test_warm_connects_a_stream_before_its_first_write_which_then_uses_that_connection() -> None:
    async def scenario() -> None:
        receiver = Opening()
        server, address = await start_server(lambda s: rpc.add_WorkerServicer_to_server(receiver, s),
                                             {EXCHANGE: receiver.Exchange})
        channels, broken = warming(address)
        try:
            async with asyncio.timeout(10):
                await receiver.called.wait()  # connected, and the method sent, with nothing written
            assert receiver.got == []
            await channels.write(address, EXCHANGE, pb.ItemBatch(sender=7))
        finally:
            await channels.close()
            await stop_server(server)
        assert receiver.calls == 1 and receiver.got == [7] and receiver.ends == ["end"] and broken == []

    asyncio.run(scenario())


class SilentNode(rpc.NodeServicer):
    """A peer whose answer with its frames port never comes; says when it was asked and when the asker gave up."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def Frames(self, request: pb.Empty, context: Any) -> pb.FramesPort:
        self.first.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return pb.FramesPort(port=1)


class AnswersSecond(rpc.NodeServicer):
    """A peer whose first answer with its frames port fails, never coming (``silent``) or as an error; the later
    ones give ``port``."""

    def __init__(self, port: int, silent: bool) -> None:
        self.port, self.silent, self.asked = port, silent, 0
        self.first = asyncio.Event()

    async def Frames(self, request: pb.Empty, context: Any) -> pb.FramesPort:
        self.asked += 1
        if self.asked == 1:
            self.first.set()
            if self.silent:
                await asyncio.sleep(60)
            await context.abort(grpc.StatusCode.INTERNAL, "not yet")
        return pb.FramesPort(port=self.port)


@pytest.mark.parametrize("queued", [True, False], ids=["write queued behind the warm", "write after the warm"])
def test_a_write_connects_on_its_own_after_a_failed_warm(queued: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing was written, so nothing is lost: the first write connects again, whether it came after the warm's
    failed connect or waited for it.  A warm connect can fail where a write's would not: a node whose own event loop
    a slow graph function blocked past ``CONNECT_WAIT`` took its peer's late answer for none, and the write queued
    behind it, given that failure, stopped the node (a fresh-clone CI run's
    ``test_credit_backpressure_refuses_then_the_sdk_retries``)."""
    monkeypatch.setattr(frames, "CONNECT_WAIT", 0.3)

    async def scenario() -> None:
        receiver = Collecting()
        listener = FrameServer({EXCHANGE: receiver.Exchange}.get, None)
        node = AnswersSecond(await listener.start("127.0.0.1"), silent=queued)
        server, address = await start_server(lambda s: rpc.add_NodeServicer_to_server(node, s))
        channels, broken = warming(address)
        try:
            async with asyncio.timeout(10):
                await node.first.wait()  # the warm is connecting: a write now waits for it
                while not queued and channels._warming:  # the warm's connect failed and is over
                    await asyncio.sleep(0.01)
            assert node.asked == 1
            await channels.write(address, EXCHANGE, pb.ItemBatch(sender=5))
        finally:
            await channels.close()
            await stop_server(server)
            await listener.close()
        assert node.asked == 2 and receiver.got == [5] and receiver.ends == ["end"] and broken == []

    asyncio.run(scenario())


def test_close_cancels_a_warm_still_connecting_and_leaves_no_connection() -> None:
    """A tick replaced while its streams connect: ``close`` must not wait for the connect, nor leave one behind."""
    async def scenario() -> None:
        node = SilentNode()
        server, address = await start_server(lambda s: rpc.add_NodeServicer_to_server(node, s))
        channels, _broken = warming(address)
        stream = channels.stream(address, EXCHANGE)
        try:
            async with asyncio.timeout(10):
                await node.first.wait()
            await channels.close()
            connecting = [task for task in asyncio.all_tasks() if task.get_coro().__name__ == "_connect_quietly"]
            assert connecting == []  # cancelled and awaited by close, not left to run on
            async with asyncio.timeout(10):
                await node.cancelled.wait()  # the peer saw its call go
            assert isinstance(stream, frames.FrameStream) and stream._writer is None
        finally:
            await stop_server(server)

    asyncio.run(scenario())
