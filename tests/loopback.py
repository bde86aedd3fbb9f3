"""In-test gRPC servers standing in for cluster members, on free loopback ports; connections to a port."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc


async def start_server(register: Callable[[grpc.aio.Server], None]) -> tuple[grpc.aio.Server, str]:
    """A started grpc.aio server with ``register``'s servicers and its "127.0.0.1:PORT" address."""
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def connections_to(port: int) -> int:
    """How many TCP connections to ``port`` are established, from any process of this network namespace
    (/proc/net/tcp and tcp6: state 01; gRPC may open an IPv4 connection as IPv4-mapped IPv6)."""
    return sum(1 for table in ("/proc/net/tcp", "/proc/net/tcp6")
               for fields in (line.split() for line in Path(table).read_text().splitlines()[1:])
               if fields[3] == "01" and int(fields[2].rpartition(":")[2], 16) == port)
