"""In-test gRPC servers standing in for cluster members, on free loopback ports; connections to a port."""

from __future__ import annotations

import contextlib
import glob
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from flamestream.runtime.frames import FrameServer, NodeServicer
from flamestream.runtime.hosting import StreamHandler
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc


async def start_server(register: Callable[[grpc.aio.Server], None],
                       streams: Mapping[str, StreamHandler] | None = None) -> tuple[grpc.aio.Server, str]:
    """A started grpc.aio server with ``register``'s servicers and its "127.0.0.1:PORT" address; with ``streams``
    (method path -> handler), it also serves those streams over frames, as a node does (stop it with
    ``stop_server``)."""
    server = grpc.aio.server()
    register(server)
    if streams is not None:
        frames = FrameServer(streams.get, None)
        rpc.add_NodeServicer_to_server(NodeServicer(frames), server)
        await frames.start("127.0.0.1")
        _FRAMES[server] = frames
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


_FRAMES: dict[grpc.aio.Server, FrameServer] = {}


class FramesAt(rpc.NodeServicer):
    """``Node.Frames`` answering with a frames listener of the test's own (a sync method: it serves on a
    ``grpc.server`` and on a ``grpc.aio`` one alike)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def Frames(self, request: pb.Empty, context: Any) -> pb.FramesPort:
        return pb.FramesPort(port=self.port)


async def stop_server(server: grpc.aio.Server) -> None:
    """Stop a server ``start_server`` started, and its frames listener."""
    frames = _FRAMES.pop(server, None)
    if frames is not None:
        await frames.close()
    await server.stop(None)


def free_port() -> int:
    """A loopback port nothing listens on now (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def connections_to(port: int, *, own: bool = False) -> int:
    """How many TCP connections to ``port`` are established, from any process of this network namespace or, with
    ``own``, from this process only (/proc/net/tcp and tcp6: state 01; gRPC may open an IPv4 connection as
    IPv4-mapped IPv6)."""
    inodes = _own_socket_inodes() if own else None
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            established = fields[3] == "01" and int(fields[2].rpartition(":")[2], 16) == port
            if established and (inodes is None or fields[9] in inodes):
                count += 1
    return count


def _own_socket_inodes() -> set[str]:
    """The inodes of this process's sockets: /proc/self/fd links read "socket:[INODE]" (an fd closed since it was
    listed is skipped)."""
    inodes = set()
    for fd in glob.glob("/proc/self/fd/*"):
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    return inodes
