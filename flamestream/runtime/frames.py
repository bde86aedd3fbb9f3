"""Frames: the streams between nodes (``Worker.Exchange``, ``Barrier.Deliver``, ``Acker.Ack``) as length-prefixed
protobuf messages, one TCP connection (TLS on a secured cluster) per stream.

Why not gRPC calls, as every other RPC is: these streams carry every batch and
ack between nodes, and a grpc.aio message costs each end 80-100 us of CPU (it
is handed between gRPC's poller thread and the event loop) against 7-13 us for
a frame over an asyncio socket, and an idle hand-off waits for a sleeping
thread (one-way 0.7 ms against 0.36 ms); measured between two processes in
README *Performance*.  The contract is the one gRPC gave them and the
in-process ``LocalStream`` keeps: FIFO per stream, the receiver's own handler
run on a task of its own, a full socket makes the writer wait (TCP's window is
the flow control), an abort ends the stream and the next write raises
``StreamBroken``.

One connection is one client-streaming call:

- client to server: a frame holding the method path, then one frame per
  message (the bytes gRPC would carry), then ``END``;
- server to client: one status frame when the call ends: ``OK`` once the
  handler has taken everything up to ``END``, or ``CODE`` newline details when
  it aborted (or refused the caller, or failed);
- a frame is a 4-byte big-endian length and that many bytes; ``END`` is the
  length 0xFFFFFFFF.  Frames longer than the gRPC limit are refused.

The port is learned from the peer itself, over gRPC (``Node.Frames``), when a
stream opens: the answer is current even after the peer restarted on another
port.  Who may call: the same mTLS as gRPC (a certificate the cluster CA
signed), and only node certificates, since all three methods are internal
(``flamestream.wire.security``).  A vanished peer: TCP keepalive with gRPC's
keepalive timings, so a stream to a cut host breaks within ~15 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from flamestream.cluster import host_port
from flamestream.runtime.hosting import (
    CLOSE_TIMEOUT,
    CONNECT_WAIT,
    LocalAbort,
    LocalContext,
    StreamBroken,
    StreamHandler,
    describe,
    never_connected,
)
from flamestream.wire import codec, security, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc

log = logging.getLogger("flamestream.frames")

_LENGTH = struct.Struct(">I")
END = 0xFFFFFFFF
"""The length that ends a stream: the writer closed it (an empty message is a frame of length 0)."""
MAX_METHOD = 256
"""Bytes a method path may take: the first frame is read before anything is known of the caller's intent."""
METHOD_WAIT = 10.0
"""Seconds a connection may take to name its method: one that never does holds a socket and a task for nothing."""
OK = b"OK"
STATUS_BYTES = 4096
"""Bytes a call's status frame may take.  gRPC carries a status in trailers of at most 8 KiB; a writer reads the
status before anything else of its receiver, so a longer one is cut by the receiver and refused by the writer."""
REQUESTS: dict[str, type[Message]] = {transport.EXCHANGE: pb.ItemBatch, transport.DELIVER: pb.ItemBatch,
                                      transport.ACK: pb.AckBatch}
"""The methods frames carry, and the type of each one's messages."""
KEEPALIVE = ((socket.TCP_KEEPIDLE, transport.KEEPALIVE_MS[0] // 1000),
             (socket.TCP_KEEPINTVL, transport.KEEPALIVE_MS[1] // 1000),
             (socket.TCP_KEEPCNT, 1),
             (socket.TCP_USER_TIMEOUT, sum(transport.KEEPALIVE_MS)))
"""gRPC's keepalive as TCP options: probe after 10 s idle, give up 5 s later; unacknowledged writes 15 s."""

_M = TypeVar("_M", bound=Message)


class _Refused(Exception):
    """The call ends with this status (``code``, ``details``) before or instead of its handler."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _PeerGone(Exception):
    """The connection ended without ``END``: the writer is gone, its call is cancelled, as gRPC cancels it."""


def _keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _frame(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next frame's bytes, None at ``END``; ``_Refused`` if it is longer than ``limit``."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length == END:
        return None
    if length > limit:
        raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a frame of {length} bytes (at most {limit})")
    return await reader.readexactly(length)


def _lost(exc: BaseException) -> str:
    """A connection that ended without a status, told as gRPC tells one (UNAVAILABLE)."""
    why = "" if isinstance(exc, asyncio.IncompleteReadError) else f" ({describe(exc)})"
    return f"{grpc.StatusCode.UNAVAILABLE.name}: connection lost{why}"


def _status(code: grpc.StatusCode, details: str) -> bytes:
    """The status frame; details cut to ``STATUS_BYTES`` (a cut UTF-8 character is replaced when read)."""
    return _frame(OK if code == grpc.StatusCode.OK else f"{code.name}\n{details}".encode()[:STATUS_BYTES])


def _is_node(writer: asyncio.StreamWriter) -> bool:
    """Whether the TLS peer presented a node certificate (the handshake already checked the CA signed it)."""
    cert = writer.get_extra_info("peercert") or {}
    return any(key == "commonName" and str(value).startswith(security.NODE_PREFIX)
               for rdn in cert.get("subject", ()) for key, value in rdn)


class FrameServer:
    """A node's frames listener: each connection runs one call of the handler ``handlers`` names for its method."""

    def __init__(self, handlers: Callable[[str], StreamHandler | None], tls: ssl.SSLContext | None) -> None:
        self._handlers = handlers
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, ssl=self._tls)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        """Stop listening and cancel the calls under way, as a gRPC server's stop cancels its calls."""
        if self._server is not None:
            self._server.close()
        calls = list(self._calls)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        _keepalive(writer)
        try:
            status = await self._call(reader, writer)
            writer.write(status)
            await writer.drain()
        except (_PeerGone, OSError, asyncio.IncompleteReadError):  # OSError: also a failed handshake, a timeout
            pass  # nobody left to tell
        except asyncio.CancelledError:
            pass  # the listener closes; the connection's own task ends here (asyncio logs a cancelled one as an error)
        finally:
            self._calls.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _call(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        """Run one call; its status frame."""
        try:
            if self._tls is not None and not _is_node(writer):
                raise _Refused(grpc.StatusCode.PERMISSION_DENIED, "frames carry internal streams: only cluster "
                                                                  "nodes may open one")
            try:
                async with asyncio.timeout(METHOD_WAIT):
                    method = await self._frame(reader, MAX_METHOD)
            except TimeoutError:
                raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, f"no method within {METHOD_WAIT:g} s") from None
            path = method.decode(errors="replace") if method is not None else ""
            kind, handler = REQUESTS.get(path), self._handlers(path)
            if kind is None or handler is None:
                raise _Refused(grpc.StatusCode.UNIMPLEMENTED, f"no stream {method!r:.80} here")
            await handler(self._requests(reader, kind, path), LocalContext())
        except (_Refused, LocalAbort) as exc:  # refused here, or the handler aborted its call
            return _status(exc.code, exc.details)
        except (_PeerGone, asyncio.CancelledError):
            raise
        except Exception as exc:  # the handler's bug: its caller hears of it, as gRPC tells UNKNOWN
            log.exception("a frames call failed")
            return _status(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
        return _status(grpc.StatusCode.OK, "")

    @staticmethod
    async def _frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
        """The caller's next frame; ``_PeerGone`` if the connection ended or failed (a keepalive's timeout, too)."""
        try:
            return await _read_frame(reader, limit)
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise _PeerGone(describe(exc)) from None

    @staticmethod
    async def _requests(reader: asyncio.StreamReader, kind: type[Message], path: str) -> AsyncIterator[Message]:
        while True:
            data = await FrameServer._frame(reader, transport.MAX_MESSAGE_BYTES)
            if data is None:
                return
            try:
                message = kind.FromString(data)
            except DecodeError as exc:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                               codec.not_a_message(path, kind.DESCRIPTOR.full_name, exc)) from None
            yield message


class NodeServicer(rpc.NodeServicer):
    """``Node.Frames``: where this node's frames listener is."""

    def __init__(self, server: FrameServer) -> None:
        self._server = server

    async def Frames(self, request: pb.Empty, context: Any) -> pb.FramesPort:
        return pb.FramesPort(port=self._server.port)


_client_tls: ssl.SSLContext | None = None
"""The node's TLS identity for the frames it opens (``use_tls``); None: plaintext."""


def use_tls(context: ssl.SSLContext | None) -> None:
    """Open every frames connection with ``context`` (a secured node sets its node certificate once)."""
    global _client_tls
    _client_tls = context


class FrameStream(Generic[_M]):
    """One long-lived stream to another node: the client end of a frames call.

    Opened on the first write, or before it by ``open`` (``Channels.warm``,
    which the node calls for the latest tick only), so the ticks a restarting
    process replays from ZooKeeper cost no connections to the processes of
    superseded deployments.
    Never reopened: messages after a lost one may be lost too, so a broken
    stream is reported (``StreamBroken``) rather than silently replaced.

    Reported when it breaks, not only at the next write (``on_broken``): a
    write returns once the socket took the message, so a connection that dies
    just after loses it without a word, and a sender with nothing more to write
    (a recovery's re-send waiting for the min time to pass the very batch that
    was lost) would otherwise wait for the acker's stall watch.
    """

    def __init__(self, channel: grpc.aio.Channel, method: str, label: str, address: str,
                 on_broken: Callable[[StreamBroken], None] | None = None) -> None:
        self.label = label
        self.address = address
        self._channel = channel
        self._method = method
        self._on_broken = on_broken
        self._writer: asyncio.StreamWriter | None = None
        self._status: asyncio.Task[str] | None = None
        self._closing = False
        self._opening = asyncio.Lock()

    async def open(self) -> asyncio.StreamWriter:
        """Connect now, unless connected already (the first write connects otherwise).

        A caller that waited while another caller's connect failed tries again rather than taking that failure:
        ``Channels.warm``'s connect can fail where a write's would not, e.g. when this node's own event loop was
        blocked past ``CONNECT_WAIT`` (a slow graph function) while it waited for the peer's answer.  So a write
        queued behind a warm connect to a peer that is really gone waits ``CONNECT_WAIT`` twice before it reports.
        """
        async with self._opening:  # one connection: writes racing the first must not open a second
            return self._writer or await self._open()

    async def write(self, message: _M) -> None:
        writer = self._writer
        if writer is None:
            writer = await self.open()
        elif self._status is not None and self._status.done():
            raise StreamBroken(f"stream to {self.label} broke ({self._ended()})", self.address)
        try:
            writer.write(_frame(message.SerializeToString()))
            await writer.drain()
        except OSError as exc:  # a reset, a keepalive's timeout, TLS
            raise StreamBroken(f"stream to {self.label} broke ({_lost(exc)})", self.address) from exc
        except asyncio.CancelledError:
            self._closing = True  # its writer is going away, nothing broke; a frame may be cut short: end it
            writer.transport.abort()
            raise

    async def _open(self) -> asyncio.StreamWriter:
        """Connect and send the method; a peer that cannot be reached yet is waited for up to ``CONNECT_WAIT``.

        Why wait only then: nothing of the stream has left this process, so
        nothing can have been lost, unlike a stream that broke after its first
        write.  Under load a loopback TLS handshake can fail once, and as a
        break it restarted the whole cluster for a recovery.  A refused
        connection still breaks the stream at once: nothing listens there, so
        the process is gone (the supervisor's probe then stops this node).
        """
        deadline = time.monotonic() + CONNECT_WAIT
        try:
            host, _port = host_port(self.address)  # the frames port is the node's answer to Node.Frames
        except ValueError as exc:  # an address in a tick is ZooKeeper's word: a bad one breaks this stream only
            raise StreamBroken(f"stream to {self.label} broke ({exc})", self.address) from exc
        while True:
            try:
                port = await self._port(deadline)
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=_client_tls, server_hostname=host if _client_tls is not None else None)
                break
            except grpc.aio.AioRpcError as exc:
                raise StreamBroken(f"stream to {self.label} broke ({describe(exc)})", self.address) from exc
            except OSError as exc:  # refused, or a failed TLS handshake (ssl.SSLError is one)
                if isinstance(exc, ConnectionRefusedError) or time.monotonic() >= deadline:
                    raise StreamBroken(f"stream to {self.label} broke ({_lost(exc)})", self.address) from exc
                await asyncio.sleep(0.05)
        _keepalive(writer)
        writer.write(_frame(self._method.encode()))
        self._writer = writer
        self._status = asyncio.get_running_loop().create_task(self._watch(reader))
        return writer

    async def _port(self, deadline: float) -> int:
        """The peer's frames port (``Node.Frames``), waiting for its gRPC channel until ``deadline``."""
        while True:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    answer = await rpc.NodeStub(self._channel).Frames(pb.Empty())
                return int(answer.port)
            except grpc.aio.AioRpcError as exc:
                if not never_connected(exc) or not await self._ready_by(deadline):
                    raise
            except TimeoutError:
                raise StreamBroken(f"stream to {self.label} broke (no answer within {CONNECT_WAIT} s)",
                                   self.address) from None

    async def _ready_by(self, deadline: float) -> bool:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._channel.channel_ready()
        except TimeoutError:
            return False
        return True

    async def _watch(self, reader: asyncio.StreamReader) -> str:
        """Wait for the call's status; report a status its writer did not ask for (by closing) as a break."""
        try:
            data = await _read_frame(reader, STATUS_BYTES)
            ended = "the receiver ended it" if data in (None, OK) else data.decode(errors="replace").replace(
                "\n", ": ", 1)
        except (asyncio.IncompleteReadError, OSError, _Refused) as exc:  # OSError: a reset, a keepalive's timeout
            ended = _lost(exc)
        if not self._closing and self._on_broken is not None:
            self._on_broken(StreamBroken.seen(f"stream to {self.label} broke ({ended})", self.address))
        return ended

    def _ended(self) -> str:
        assert self._status is not None
        return self._status.result()

    async def close(self) -> None:
        """End the stream and wait (bounded) for the receiver's status, so it has taken everything written."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._closing = True
        status = self._status
        with contextlib.suppress(OSError):  # TimeoutError is one
            if status is not None and not status.done():
                writer.write(_LENGTH.pack(END))
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await writer.drain()
                    await asyncio.wait([status])
        if status is not None and not status.done():
            status.cancel()
        writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await writer.wait_closed()
        if status is not None:
            await asyncio.gather(status, return_exceptions=True)
