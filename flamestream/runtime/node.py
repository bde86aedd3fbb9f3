"""``flamestream node``: the one process type, hosting any combination of roles.

Like the Java FlameStream's node or a Flink task manager, a node is one
process with one gRPC server, one ZooKeeper session and one event loop that
hosts whichever roles it is given: workers (hash ranges), fronts, barrier
partitions, the acker.  Its roles talk to each other through in-process
streams (``flamestream.runtime.channels``) and to other nodes over gRPC, so
``up --nodes 2`` runs two processes on two cores instead of six, and the
hops between co-located roles cost no serialization.

The node registers each role as a ZooKeeper member under the node's address,
hands every tick to its roles in order, supervises their tasks
(``flamestream.runtime.supervision``) and serves the standard gRPC health
check: overall (service ``""``) and per role (service = member name, e.g.
``worker0``).  SIGTERM/SIGINT stop it cleanly (exit 0); an essential task's
failure stops it with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from flamestream.cluster import ClusterStore
from flamestream.core.tick import Tick
from flamestream.runtime import logs
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.supervision import Supervisor
from flamestream.wire.transport import GRPC_OPTIONS

log = logs.role_logger("node")


class Role(Protocol):
    """One role hosted by a node; the service packages (``flamestream.workers`` ...) implement it."""

    kind: str
    """The member role in ZooKeeper: worker, front, barrier or acker."""
    name: str
    """The member name, unique per role in the cluster: worker0, front1, ..."""

    def info(self) -> dict[str, Any]:
        """What the member registers besides its address (index, id, partitions)."""
        ...

    def register(self, server: grpc.aio.Server, local: LocalEndpoints) -> None:
        """Add the role's servicer to the node's server and its stream handlers to ``local``."""
        ...

    def start(self, supervisor: Supervisor) -> None:
        """Start the role's long-lived tasks under ``supervisor``."""
        ...

    async def deploy(self, tick: Tick) -> None: ...

    async def close(self) -> None: ...


class Node:
    def __init__(self, name: str, roles: list[Role], store: ClusterStore, local: LocalEndpoints, *,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        """``roles`` were built around ``local`` (their in-process peers) and ``store`` (the node's session)."""
        self.name = name
        self.roles = roles
        self.host = host
        self.port = port
        self.store = store
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        self.health = health.aio.HealthServicer()
        self.supervisor = Supervisor(self.health)
        self.local = local
        self._ticks: asyncio.Queue[Tick] = asyncio.Queue()
        self._stopped = asyncio.Event()

    async def start(self) -> str:
        """Serve, register every role in ZooKeeper, start following ticks; returns the advertised address."""
        if not self.roles:
            raise ValueError("a node needs at least one role (--worker, --front, --barrier or --acker)")
        # The session first: a barrier's offset RPCs use it as soon as the server answers.
        await asyncio.to_thread(self.store.start)
        for role in self.roles:
            role.register(self.server, self.local)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port(f"{self.host}:{self.port}")
        if port == 0:
            raise SystemExit(f"node {self.name}: cannot bind {self.host}:{self.port}")
        self.local.address = f"{self.host}:{port}"
        await self.server.start()
        await self.supervisor.serving([role.name for role in self.roles])
        for role in self.roles:
            await asyncio.to_thread(self.store.register, role.kind, role.name,
                                    {"address": self.local.address, "node": self.name, **role.info()})
        loop = asyncio.get_running_loop()

        def on_tick(number: int, data: dict[str, Any]) -> None:  # kazoo's thread
            try:
                tick = Tick.from_dict({**data, "number": number})
            except ValueError as exc:
                loop.call_soon_threadsafe(log.error, "ignoring tick %d: %s", number, exc)
                return
            loop.call_soon_threadsafe(self._ticks.put_nowait, tick)

        await asyncio.to_thread(self.store.watch_ticks, on_tick)
        for role in self.roles:
            role.start(self.supervisor)
        self.supervisor.spawn("node", "tick follower", self._follow_ticks(), essential=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        log.info("serving %s at %s", ", ".join(role.name for role in self.roles), self.local.address)
        print(f"ready {self.name} {self.local.address}", flush=True)  # the launcher's and tests' start signal
        return self.local.address

    async def _follow_ticks(self) -> None:
        """Hand every tick to every role, in order; a role that cannot take a tick is NOT_SERVING, not the node."""
        while True:
            tick = await self._ticks.get()
            for role in self.roles:
                try:
                    await role.deploy(tick)
                except Exception as exc:
                    self.supervisor.fail(role.name, f"cannot deploy tick {tick.number}", exc)

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT or an essential failure, stop; returns the exit code."""
        try:
            await self.start()
            stopped = asyncio.create_task(self._stopped.wait())
            fatal = asyncio.create_task(self.supervisor.fatal.wait())
            await asyncio.wait([stopped, fatal], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            fatal.cancel()
        finally:
            await self.stop()
        return 1 if self.supervisor.fatal.is_set() else 0

    async def stop(self) -> None:
        """Fronts first (no new input), then every other role; the server and the session last."""
        await self.supervisor.stop()
        for role in sorted(self.roles, key=lambda r: r.kind != "front"):
            try:
                await role.close()
            except Exception:
                logs.role_logger(role.name).exception("closing %s failed", role.name)
        await self.server.stop(grace=1.0)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.stop)
        log.info("stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The node's own options; each service package adds its role's (``add_role_arguments``)."""
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string, HOST:PORT")
    parser.add_argument("--cluster", default="default", help="cluster name (ZooKeeper namespace), default 'default'")
    parser.add_argument("--name", help="node name, for logs and health (default: node-<first role>)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and advertise, default 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to bind, 0 = any free port (default)")
    parser.add_argument("--data-dir", type=Path, help="input logs, topics and snapshots (DIR/input, DIR/topic, "
                        "DIR/snapshots); nodes of one cluster share it")
    parser.add_argument("--log-file", type=Path, help="append the log here (default: stderr)")
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text", help="text (default) or json lines")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="default INFO")
