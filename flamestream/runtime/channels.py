"""Streams between cluster members: in-process between roles of one node, frames between nodes.

A node hosts several roles (worker, front, barrier, acker) behind one gRPC
server, so every role of a node advertises the node's address.  A stream to
that address needs no socket: ``Channels`` hands the message objects to the
local servicer's own handler through a bounded queue.  A stream to another
node is a frames connection (``flamestream.runtime.frames``) to the same
handler there (``Worker.Exchange``, ``Barrier.Deliver``, ``Acker.Ack``), run
on a task of its own, so both paths have the same semantics: FIFO per stream,
one message at a time, a full queue makes the writer wait (as a full socket
does), an ``abort`` ends the stream and the next write raises
``StreamBroken``.  What the in-process path saves is serialization, the socket
and the event-loop work on both ends.  Everything else between members (the
acker's min-time stream, the clients' RPCs) is gRPC.

Messages handed over in-process are shared, not copied: senders build a new
message for every write and never touch it afterwards.  A worker's items for
its own node's barrier go as they are, not as a message (``LocalItems``).

A broken stream, either way, raises ``StreamBroken`` naming the peer — also
the acker's min-time stream — so the supervisor can tell a lost peer from a
bug (``flamestream.runtime.supervision``: the node exits once it is not back
within ``--stream-timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from flamestream.core.item import Item
from flamestream.core.meta import GlobalTime
from flamestream.runtime.frames import FrameStream
from flamestream.runtime.hosting import CLOSE_TIMEOUT, LocalContext, StreamBroken, StreamHandler, describe
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire import transport

LOCAL_QUEUE = 64
"""Messages an in-process stream holds before its writer waits: bounded, like a gRPC stream's flow-control window."""

_M = TypeVar("_M", bound=Message)
_M_contra = TypeVar("_M_contra", bound=Message, contravariant=True)


MinTimeWatch = Callable[[pb.Empty, Any], AsyncIterator[pb.GlobalTime]]
"""The acker servicer's ``WatchMinTime``."""

LOSE_EXCHANGE = "FLAMESTREAM_TEST_LOSE_EXCHANGE"
"""Test-only fault injection, an environment variable naming a file PATH: once PATH exists, the next ``Exchange``
batch the process sends to another node is silently dropped — a lost packet, which only the acker's stall watch can
notice — and PATH is renamed to PATH.lost (the rename decides which process loses it: one batch per file, however
many nodes inherit the variable).  Read from the process's environment once, at import: nothing that arrives over
the network or from ZooKeeper can enable it."""


class LocalEndpoints:
    """The servicers of this node's roles, by method path: what an in-process stream delivers to."""

    def __init__(self, address: str = "") -> None:
        self.address = address
        """The node's advertised address; set once its server is bound."""
        self.streams: dict[str, StreamHandler] = {}
        self.min_time: MinTimeWatch | None = None

    def serves(self, address: str, method: str) -> StreamHandler | None:
        return self.streams.get(method) if address == self.address else None


@dataclass(frozen=True, slots=True)
class LocalItems:
    """What an ``ItemBatch`` to a barrier carries, handed to the barrier of the sender's own node as it is.

    Why: every batch a worker sent its own node's barrier was encoded into
    an ``ItemBatch`` (``codec.encode_batch``) and decoded again at once
    (``codec.decode_items``, with the checks a batch from the network
    needs): the issue's "barrier that re-parses what a worker already
    encoded".  Only this process builds one; nothing from the network can
    become one (frames and gRPC decode to ``ItemBatch``).
    """

    items: list[Item]
    """Items whose payloads are serialized topic records (``codec.to_records``): what ``decode_items`` would give
    back."""
    acks: dict[GlobalTime, int]
    sender: int
    tick: int


_END = object()


class LocalStream(Generic[_M]):
    """One in-process client-streaming call: the same contract as ``FrameStream``, without the socket."""

    def __init__(self, handler: StreamHandler, label: str,
                 on_broken: Callable[[StreamBroken], None] | None = None) -> None:
        self.label = label
        self._handler = handler
        self._queue: asyncio.Queue[Any] = asyncio.Queue(LOCAL_QUEUE)
        self._call: asyncio.Task[Any] | None = None
        self._on_broken = on_broken

    async def _requests(self) -> AsyncIterator[Any]:
        while (message := await self._queue.get()) is not _END:
            yield message

    async def write(self, message: _M) -> None:
        call = self._call
        if call is None:
            call = self._call = asyncio.create_task(self._handler(self._requests(), LocalContext()))
            if self._on_broken is not None:
                call.add_done_callback(self._ended)
        if call.done():
            raise StreamBroken(f"stream to {self.label} broke ({_ended(call)})")
        await self._queue.put(message)

    def _ended(self, call: asyncio.Task[Any]) -> None:
        # Not closed by its writer (nor cancelled: only a writer's close or the loop's end cancels a handler).
        if call is self._call and not call.cancelled() and self._on_broken is not None:
            self._on_broken(StreamBroken.seen(f"stream to {self.label} broke ({_ended(call)})", cause=call.exception()))

    async def close(self) -> None:
        """End the stream and wait (bounded) until the handler has taken everything written."""
        call, self._call = self._call, None
        if call is None or call.done():
            return
        with contextlib.suppress(TimeoutError, asyncio.QueueFull):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._queue.put(_END)
                await asyncio.wait([call])
        if not call.done():
            call.cancel()
        await asyncio.gather(call, return_exceptions=True)


def _ended(call: asyncio.Task[Any]) -> str:
    if call.cancelled():
        return "cancelled"
    exc = call.exception()
    return str(exc) if exc is not None else "the receiver ended it"


class Stream(Protocol[_M_contra]):
    """What a role writes to: a long-lived, FIFO stream of messages to one member."""

    label: str

    async def write(self, message: _M_contra) -> None: ...

    async def close(self) -> None: ...


class _Loss:
    """When to lose an outgoing ``Exchange`` batch (``LOSE_EXCHANGE``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def loses_next(self) -> bool:
        try:
            os.rename(self.path, f"{self.path}.lost")
        except FileNotFoundError:
            return False
        return True


_LOSS = _Loss(os.environ[LOSE_EXCHANGE]) if os.environ.get(LOSE_EXCHANGE) else None


class _Lossy(Generic[_M]):
    """A stream to another node that may lose a message (test-only, ``LOSE_EXCHANGE``)."""

    def __init__(self, stream: Stream[_M], loss: _Loss) -> None:
        self.label = stream.label
        self.inner, self._loss = stream, loss

    async def write(self, message: _M) -> None:
        if not self._loss.loses_next():
            await self.inner.write(message)

    async def close(self) -> None:
        await self.inner.close()


async def _min_times(call: Any, acker: str) -> AsyncIterator[pb.GlobalTime]:
    """The acker's ``WatchMinTime`` call, whose failure is a broken stream naming the acker."""
    try:
        async for value in call:
            yield value
    except grpc.aio.AioRpcError as exc:
        raise StreamBroken(f"min-time stream from the acker at {acker} broke ({describe(exc)})", acker) from exc
    finally:
        call.cancel()


async def _connect_quietly(stream: FrameStream[Any]) -> None:
    with contextlib.suppress(StreamBroken):
        await stream.open()


class Channels:
    """One role's outgoing streams and channels; in-process where the address is this node's own.

    A role keeps one ``Channels`` per tick and closes it when the tick is
    replaced, so streams of superseded deployments end cleanly.
    """

    def __init__(self, local: LocalEndpoints, on_broken: Callable[[StreamBroken], None] | None = None) -> None:
        """``on_broken``: told (on the event loop) when a stream breaks, whether or not anything is written to it
        after: the writer's next write would raise too, but a writer with nothing more to write must learn it."""
        self._local = local
        self._on_broken = on_broken
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[tuple[str, str], Stream[Any]] = {}
        self._warming: set[asyncio.Task[None]] = set()
        """``warm``'s connects in progress, cancelled by ``close``."""

    def warm(self) -> None:
        """Connect every stream opened so far to another node now, each on a task of its own.

        Why: a frames stream connects on its first write, and that write waits
        for a gRPC call (the peer's frames port), a TCP handshake and TLS's.  On
        a new deployment the first event paid for every stream on its path, one
        after another: the bench's first word-count push took 24.5 ms with the
        client connected, 3.3-7.2 ms with this.  A connect that fails here is
        left to the first write, which connects again and reports a failure
        as before (``FrameStream.open``); nothing was written, so nothing is
        lost.
        """
        for stream in self._streams.values():
            if isinstance(stream, _Lossy):
                stream = stream.inner  # test-only loss: its connection is the same as any other's
            if isinstance(stream, FrameStream):
                task = asyncio.get_running_loop().create_task(_connect_quietly(stream))
                self._warming.add(task)
                task.add_done_callback(self._warming.discard)

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = transport.channel(address)
        return self._channels[address]

    def stream(self, address: str, method: str, label: str = "") -> Stream[Any]:
        """The stream to ``method`` at ``address``, opened on first use and then reused (FIFO per stream)."""
        stream = self._streams.get((address, method))
        if stream is None:
            label = label or address
            handler = self._local.serves(address, method)
            stream = (LocalStream[Any](handler, f"{label} (in-process)", self._on_broken) if handler is not None
                      else FrameStream[Any](self.channel(address), method, label, address, self._on_broken))
            if _LOSS is not None and handler is None and method == transport.EXCHANGE:
                stream = _Lossy[Any](stream, _LOSS)
            self._streams[(address, method)] = stream
        return stream

    async def write(self, address: str, method: str, message: Message | LocalItems) -> None:
        """Write ``message`` to ``method`` at ``address``: a ``LocalItems`` only where ``is_local`` says so."""
        await self.stream(address, method).write(message)

    def is_local(self, address: str, method: str) -> bool:
        """Whether ``method`` at ``address`` is served by this node, in-process (a ``LocalStream``)."""
        return self._local.serves(address, method) is not None

    def watch_min_time(self, acker: str) -> AsyncIterator[pb.GlobalTime]:
        """The acker's min-time stream: the acker's own generator when it runs on this node."""
        if acker == self._local.address and self._local.min_time is not None:
            return self._local.min_time(pb.Empty(), LocalContext())
        return _min_times(rpc.AckerStub(self.channel(acker)).WatchMinTime(pb.Empty(), wait_for_ready=True), acker)

    async def close(self) -> None:
        """Half-close every stream and wait (bounded) for its receiver, so nothing written is cancelled in flight."""
        for task in list(self._warming):
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        streams, channels = list(self._streams.values()), list(self._channels.values())
        self._streams.clear()
        self._channels.clear()
        await asyncio.gather(*(stream.close() for stream in streams))
        for channel in channels:
            await channel.close()
