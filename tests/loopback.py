"""In-test gRPC servers standing in for cluster members, on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable

import grpc


async def start_server(register: Callable[[grpc.aio.Server], None]) -> tuple[grpc.aio.Server, str]:
    """A started grpc.aio server with ``register``'s servicers and its "127.0.0.1:PORT" address."""
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
