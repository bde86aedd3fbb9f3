"""gRPC streams between nodes, and the event loop every node runs on.

``ClientStream`` is one long-lived client-streaming call to another node (the
in-process counterpart for roles of the same node is
``flamestream.runtime.channels.LocalStream``); ``run`` starts a node's main
coroutine on uvloop with the collector and the GIL's switch interval tuned for stream state.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

import grpc
import uvloop
from google.protobuf.message import Message

from flamestream.runtime.heap import tune_gc
from flamestream.wire import flamestream_pb2 as pb

SWITCH_INTERVAL = 0.001
"""Seconds a thread may keep the GIL while another waits for it (``sys.setswitchinterval``; CPython's default 0.005).

Why shorter: a node's disk writes run in threads (the input log's and the
topic's appends with their fsyncs, snapshot files), and each needs the GIL
back once its syscall returns.  While the event loop was busy, that took up
to the whole interval, on every record's path (input log, then topic).
Interleaved 20-30 s benches on this 2-core machine, default against 1 ms:
inverted index at 20 pages/s p50 68 / 72 -> 49 / 46 ms and 99 / 90 / 95 ->
70 / 89 / 69 ms; word count at 1,000 lines/s 41 / 37 -> 31 / 32 ms and
46 / 48 / 48 -> 30 / 40 / 46 ms.  0.5 ms was no better than the default, and
2 ms came between."""

CLOSE_TIMEOUT = 2.0
"""Seconds a closing stream waits for its receiver to confirm the end, so shutdown cannot hang on a dead peer."""

_M = TypeVar("_M", bound=Message)


class StreamBroken(Exception):
    """A long-lived call failed; how much of what it carried arrived is unknown.

    ``peer``: the address of the other node ("" for an in-process stream), so the supervisor can ask whether
    anything still listens there (``refuses``).
    """

    def __init__(self, message: str, peer: str = "") -> None:
        super().__init__(message)
        self.peer = peer

    @classmethod
    def seen(cls, message: str, peer: str = "", cause: BaseException | None = None) -> StreamBroken:
        """A break seen by a watch rather than by a write, raised here so it carries a traceback like any logged
        failure (the point of detection, and ``cause``'s own below it: a local handler's exception)."""
        try:
            raise cls(message, peer) from cause
        except cls as error:
            return error


PROBE_TIMEOUT = 1.0
"""Seconds ``refuses`` waits for a connection: no answer at all (a cut network) is not a refusal."""


async def refuses(address: str) -> bool:
    """Whether ``address`` (``host:port``) actively refuses a TCP connection: nothing listens there, so the
    process that served it is gone (the kernel of its host answered for it).  A connection that is accepted, or
    a timeout, or no route, is not proof of anything."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


CONNECT_WAIT = 2.0
"""Seconds a stream's first write waits for a connection that could not be made (``ClientStream._first``)."""


def _never_connected(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call failed before it was sent, no connection to the peer having been made, while something
    listens there.  A refused connection is left out: nothing listens, so the process there is gone, and the
    stream breaks at once (the supervisor's probe then stops this node for the recovery)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = exc.details() or ""
    return "failed to connect to all addresses" in details and "Connection refused" not in details


def describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class ClientStream(Generic[_M]):
    """One long-lived client-streaming call (``Worker.Exchange``, ``Barrier.Deliver``, ``Acker.Ack``): FIFO.

    Opened on the first write, so the ticks a restarting process replays from
    ZooKeeper cost no connections to the processes of superseded deployments.
    Never reopened: messages after a lost one may be lost too, so a broken
    stream is reported (``StreamBroken``) rather than silently replaced.

    Reported when it breaks, not only at the next write (``on_broken``): a
    write returns once gRPC took the message, so a connection that dies just
    after loses it without a word, and a sender with nothing more to write (a
    recovery's re-send waiting for the min time to pass the very batch that
    was lost) would otherwise wait for the acker's stall watch.
    """

    def __init__(self, channel: grpc.aio.Channel, method: str, label: str, address: str = "",
                 on_broken: Callable[[StreamBroken], None] | None = None) -> None:
        self.label = label
        self.address = address
        self._channel = channel
        self._open: grpc.aio.StreamUnaryMultiCallable[_M, Message] = channel.stream_unary(
            method, request_serializer=_serialize, response_deserializer=pb.Empty.FromString)
        self._call: grpc.aio.StreamUnaryCall[_M, Message] | None = None
        self._opening = False
        """The first write is under way: it reports a failure itself (raising), or opens the call again."""
        self._on_broken = on_broken
        self._telling: set[asyncio.Task[None]] = set()
        self._cancelled = False
        """A write was cancelled midway, which cancels the call: its writer is going away, nothing broke."""

    async def write(self, message: _M) -> None:
        try:
            if self._call is None:
                await self._first(message)
            else:
                await self._call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            raise StreamBroken(f"stream to {self.label} broke ({describe(exc)})", self.address) from exc
        except asyncio.CancelledError:
            self._cancelled = True
            raise

    async def _first(self, message: _M) -> None:
        """Open the call with ``message``; if the connection could not be made, wait up to ``CONNECT_WAIT`` for
        the channel and open it again (raising the last attempt's error if it does not connect).

        Why only then: a call that failed to connect never left this process
        (gRPC fails it while picking a connection), so nothing of the stream
        can have been lost, unlike a stream that broke after its first write.
        Under load a loopback TLS handshake can fail once ("Handshake write
        failed"), and as a break it restarted the whole cluster for a
        recovery.  A refused connection still breaks the stream at once.
        """
        deadline = time.monotonic() + CONNECT_WAIT
        self._opening = True
        try:
            while True:
                call = self._call = self._open()
                if self._on_broken is not None:
                    call.add_done_callback(self._ended)
                try:
                    await call.write(message)
                    return
                except grpc.aio.AioRpcError as exc:
                    if not _never_connected(exc) or not await self._ready_by(deadline):
                        raise
        finally:
            self._opening = False

    async def _ready_by(self, deadline: float) -> bool:
        """Whether the channel connects before ``deadline``."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._channel.channel_ready()
        except TimeoutError:
            return False
        return True

    def _ended(self, call: grpc.aio.StreamUnaryCall[_M, Message]) -> None:
        """The call ended: unless its writer closed it, it broke (the receiver never ends a stream by itself)."""
        if call is self._call:
            task = asyncio.get_running_loop().create_task(self._tell(call))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def _tell(self, call: grpc.aio.StreamUnaryCall[_M, Message]) -> None:
        # grpc.aio gives a call's status only to a coroutine; the call is over, so it answers at once.
        code, details = await call.code(), await call.details()
        if call is not self._call or self._cancelled or self._opening:  # closed, cancelled, or its writer reports
            return
        assert self._on_broken is not None
        self._on_broken(StreamBroken.seen(f"stream to {self.label} broke ({code.name}: {details})", self.address))

    async def close(self) -> None:
        """Half-close and wait for the receiver's reply, so it sees a clean end of the stream."""
        call, self._call = self._call, None
        if call is None or call.done():  # never opened, or already ended (a failed or cut-short write said so)
            return
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await call.done_writing()
                await call


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service's main coroutine on uvloop, with the collector tuned for a growing heap and the GIL handed
    to waiting threads sooner (``SWITCH_INTERVAL``)."""
    tune_gc()
    sys.setswitchinterval(SWITCH_INTERVAL)
    uvloop.run(main())
