"""gRPC streams between nodes, and the event loop every node runs on.

``ClientStream`` is one long-lived client-streaming call to another node (the
in-process counterpart for roles of the same node is
``flamestream.runtime.channels.LocalStream``); ``run`` starts a node's main
coroutine on uvloop with the collector tuned for stream state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

import grpc
import uvloop
from google.protobuf.message import Message

from flamestream.runtime.heap import tune_gc
from flamestream.wire import flamestream_pb2 as pb

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
    """

    def __init__(self, channel: grpc.aio.Channel, method: str, label: str, address: str = "") -> None:
        self.label = label
        self.address = address
        self._open: grpc.aio.StreamUnaryMultiCallable[_M, Message] = channel.stream_unary(
            method, request_serializer=_serialize, response_deserializer=pb.Empty.FromString)
        self._call: grpc.aio.StreamUnaryCall[_M, Message] | None = None

    async def write(self, message: _M) -> None:
        call = self._call
        if call is None:
            call = self._call = self._open()
        try:
            await call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            raise StreamBroken(f"stream to {self.label} broke ({describe(exc)})", self.address) from exc

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
    """Run a service's main coroutine on uvloop, with the collector tuned for a growing heap."""
    tune_gc()
    uvloop.run(main())
