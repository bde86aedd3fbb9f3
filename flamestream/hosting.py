"""What every service process shares: arguments, gRPC server, ZooKeeper membership, ticks, shutdown.

Each service package (fronts, workers, acker, barrier) is a thin shell: it
builds its servicer around a core class and hands it to ``Host``, which binds a
grpc.aio server on a loopback port (port 0 picks a free one), serves the
standard gRPC health check, registers the address as an ephemeral ZooKeeper
member, delivers every tick published in ZooKeeper to the service in order on
the event loop, and stops cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Generic, TypeVar

import grpc
import uvloop
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from flamestream.cluster import ClusterStore
from flamestream.heap import tune_gc
from flamestream.tick import Tick
from flamestream.wire import flamestream_pb2 as pb

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


def add_host_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string, HOST:PORT")
    parser.add_argument("--cluster", default="default", help="cluster name (ZooKeeper namespace), default 'default'")
    parser.add_argument("--name", default=role, help=f"member name, unique per role (default {role!r})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and advertise, default 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to bind, 0 = any free port (default)")


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)


class Host:
    def __init__(self, role: str, args: argparse.Namespace) -> None:
        self.role = role
        self.name: str = args.name
        self.args = args
        self.store = ClusterStore(args.zookeeper, cluster=args.cluster)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        self.address = ""
        self._ticks: asyncio.Queue[Tick] = asyncio.Queue()
        self._stopped = asyncio.Event()

    async def start(self, register: Callable[[grpc.aio.Server], None], info: dict[str, Any] | None = None) -> str:
        """Serve, register in ZooKeeper, start receiving ticks; returns the advertised address."""
        register(self.server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        port = self.server.add_insecure_port(f"{self.args.host}:{self.args.port}")
        if port == 0:
            raise SystemExit(f"{self.role}: cannot bind {self.args.host}:{self.args.port}")
        await self.server.start()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self.address = f"{self.args.host}:{port}"
        await asyncio.to_thread(self.store.start)
        await asyncio.to_thread(self.store.register, self.role, self.name, {"address": self.address, **(info or {})})
        loop = asyncio.get_running_loop()

        def on_tick(number: int, data: dict[str, Any]) -> None:  # kazoo's thread
            try:
                tick = Tick.from_dict({**data, "number": number})
            except ValueError as exc:
                print(f"{self.role} {self.name}: ignoring tick {number}: {exc}", file=sys.stderr, flush=True)
                return
            loop.call_soon_threadsafe(self._ticks.put_nowait, tick)

        await asyncio.to_thread(self.store.watch_ticks, on_tick)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        print(f"ready {self.role} {self.name} {self.address}", flush=True)
        return self.address

    async def ticks(self) -> AsyncIterator[Tick]:
        while True:
            yield await self._ticks.get()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        await self.server.stop(grace=1.0)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.stop)


EXCHANGE = "/flamestream.Worker/Exchange"
DELIVER = "/flamestream.Barrier/Deliver"
ACK = "/flamestream.Acker/Ack"
"""Method paths of the client-streaming calls between cluster members."""

CLOSE_TIMEOUT = 2.0
"""Seconds a closing stream waits for its receiver to confirm the end, so shutdown cannot hang on a dead peer."""

_M = TypeVar("_M", bound=Message)


class StreamBroken(Exception):
    """A long-lived call failed; how much of what it carried arrived is unknown."""


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

    def __init__(self, channel: grpc.aio.Channel, method: str, label: str) -> None:
        self.label = label
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
            raise StreamBroken(f"stream to {self.label} broke ({describe(exc)})") from exc

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
