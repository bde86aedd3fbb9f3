"""Requests that do not parse end their own call with INVALID_ARGUMENT, once the caller is checked (issue #12).

Found by the fuzz test (``tests/test_fuzz.py``).  The generated
``add_*Servicer_to_server`` parse a request before its call starts, so bytes
that are not a request message ended with gRPC's UNKNOWN ("Unexpected <class
DecodeError>"), the status of an exception no handler turned into one — and on
a ``--tls`` node before ``AuthInterceptor`` had looked at the caller.  The
health service answered a Check of a service the node does not serve with
NOT_FOUND and no message; given a message naming the service, that message
has to stay bounded, or a client refuses the status itself (gRPC caps
metadata at 16 KB: RESOURCE_EXHAUSTED).  ``codec.add_servicer`` registers
every service of a node (and ``runtime.node`` the health service) so that
requests are parsed inside the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from flamestream.runtime import tls
from flamestream.runtime.node import _Health
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.security import AuthInterceptor, Credentials

GARBAGE = b"\x0a\xff\xff"  # field 1, length-delimited, a length running past the end
BARRIER = pb.DESCRIPTOR.services_by_name["Barrier"]


class Recorder(rpc.BarrierServicer):
    """A barrier that records what reached its handlers."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def Commit(self, request: pb.CommitRequest, context: Any) -> pb.Empty:
        self.seen.append(request)
        return pb.Empty()

    async def Deliver(self, request_iterator: AsyncIterator[pb.ItemBatch], context: Any) -> pb.Empty:
        async for batch in request_iterator:
            self.seen.append(batch)
        return pb.Empty()

    async def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> AsyncIterator[pb.RecordBatch]:
        self.seen.append(request)
        yield pb.RecordBatch(records=[pb.Record(offset=request.from_offset)])


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        reply = await call
        if hasattr(reply, "__aiter__"):
            async for _ in reply:
                pass
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _drained(call: Any) -> list[bytes]:
    return [reply async for reply in call]


def test_garbage_ends_its_own_call_with_invalid_argument_naming_the_method() -> None:
    async def run() -> None:
        servicer = Recorder()
        server = grpc.aio.server()
        codec.add_servicer(server, servicer, BARRIER)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                commit = channel.unary_unary("/flamestream.Barrier/Commit")
                code, details = await _status(commit(GARBAGE, timeout=10))
                assert code == grpc.StatusCode.INVALID_ARGUMENT
                assert details.startswith("/flamestream.Barrier/Commit: the request is not a "
                                          "flamestream.CommitRequest message"), details
                # A stream: the message that parses reaches the handler, the one after it ends the call.
                deliver = channel.stream_unary(transport.DELIVER)
                code, details = await _status(deliver(iter([pb.ItemBatch(sender=7).SerializeToString(), GARBAGE]),
                                                      timeout=10))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "flamestream.ItemBatch" in details, details
                subscribe = channel.unary_stream("/flamestream.Barrier/Subscribe")
                with_garbage = subscribe(GARBAGE, timeout=10)
                code, details = await _status(_drained(with_garbage))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "flamestream.SubscribeRequest" in details
                # What parses is served as before, with the same messages.
                assert await commit(pb.CommitRequest(group="g", offset=3).SerializeToString(), timeout=10) == b""
                replies = await _drained(subscribe(pb.SubscribeRequest(from_offset=5).SerializeToString(),
                                                   timeout=10))
                assert [pb.RecordBatch.FromString(r).records[0].offset for r in replies] == [5]
            assert servicer.seen == [pb.ItemBatch(sender=7), pb.CommitRequest(group="g", offset=3),
                                     pb.SubscribeRequest(from_offset=5)]
        finally:
            await server.stop(grace=None)

    asyncio.run(run())


def test_a_caller_is_checked_before_its_request_is_parsed(tmp_path: Path) -> None:
    directory = tls.init(tmp_path / "tls", [("node0", "127.0.0.1")])
    node, client = Credentials.load(directory, node="node0"), Credentials.load(directory)

    async def run() -> None:
        servicer = Recorder()
        server = grpc.aio.server(interceptors=[AuthInterceptor(node.tokens)])
        codec.add_servicer(server, servicer, BARRIER)
        port = server.add_secure_port("127.0.0.1:0", node.server_credentials())
        await server.start()
        try:
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}",
                                               client.channel_credentials(with_tokens=False)) as channel:
                commit = channel.unary_unary("/flamestream.Barrier/Commit")
                code, details = await _status(commit(GARBAGE, timeout=10))
                assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
                token = (("authorization", f"Bearer {client.tokens['consume']}"),)
                code, details = await _status(commit(GARBAGE, timeout=10, metadata=token))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "flamestream.CommitRequest" in details
                deliver = channel.stream_unary(transport.DELIVER)  # internal: the clients' certificate is refused
                code, details = await _status(deliver(iter([GARBAGE]), timeout=10, metadata=token))
                assert code == grpc.StatusCode.PERMISSION_DENIED, (code, details)
            assert servicer.seen == []
        finally:
            await server.stop(grace=None)

    asyncio.run(run())


def test_health_names_an_unknown_service_in_a_bounded_message() -> None:
    async def run() -> None:
        servicer = _Health()
        await servicer.set("worker0", health_pb2.HealthCheckResponse.SERVING)
        server = grpc.aio.server()
        codec.add_servicer(server, servicer, health_pb2.DESCRIPTOR.services_by_name["Health"])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                            response_deserializer=health_pb2.HealthCheckResponse.FromString)
                for service in ("worker9", "w" * 100_000):
                    code, details = await _status(check(health_pb2.HealthCheckRequest(service=service), timeout=10))
                    assert code == grpc.StatusCode.NOT_FOUND, (code, details[:200])
                    assert details.startswith("this node serves no service 'w") and len(details) < 100, details
                for service in ("", "worker0"):
                    reply = await check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(grace=None)

    asyncio.run(run())
