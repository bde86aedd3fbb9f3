"""In-test gRPC servers standing in for cluster members, on free loopback ports; connections to a port."""

from __future__ import annotations

import glob
import os
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


def connections_to(port: int, *, own: bool = False) -> int:
    """How many TCP connections to ``port`` are established, from any process of this network namespace or, with
    ``own``, from this process only (/proc/net/tcp and tcp6: state 01, the socket's inode one of /proc/self/fd's;
    gRPC may open an IPv4 connection as IPv4-mapped IPv6)."""
    mine = {link for fd in glob.glob("/proc/self/fd/*") if (link := _link(fd)).startswith("socket:")} if own else None
    return sum(1 for table in ("/proc/net/tcp", "/proc/net/tcp6")
               for fields in (line.split() for line in Path(table).read_text().splitlines()[1:])
               if fields[3] == "01" and int(fields[2].rpartition(":")[2], 16) == port
               and (mine is None or f"socket:[{fields[9]}]" in mine))


def _link(fd: str) -> str:
    """Where an fd of /proc/self/fd points, or "" if it closed since it was listed."""
    try:
        return os.readlink(fd)
    except OSError:
        return ""
