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
failure ends it at once with exit code 1, as a crash would: every role
survives kill -9 (durable logs, torn writes repaired, the cluster's
recovery), and the clean stop only delayed the restart the recovery waits
for (0.2 s and more: streams closed, the server's grace, the session).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import fcntl
import io
import logging
import math
import os
import reprlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2

from flamestream.cluster import ClusterStore, Unauthorized, placement
from flamestream.core.functions import check_module_name
from flamestream.core.tick import Tick
from flamestream.runtime import frames, logs, recovery
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.frames import FrameServer, NodeServicer
from flamestream.runtime.supervision import STREAM_TIMEOUT, Supervisor
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.security import ADVERTISED, AuthInterceptor, Credentials
from flamestream.wire.transport import GRPC_OPTIONS

log = logs.role_logger("node")


RECOVERY_POLL = 1.0
"""Seconds between looks for restarted peers when the members cannot be watched, or the last look failed."""
RECOVERY_RECHECK = 10.0
"""Seconds between looks for restarted peers while the members are watched: only a safety net, since every change
a look can act on wakes it (a member registering, a tick applied).  A look reads the latest tick and every member
(4.6 ms of CPU); once a second it was a third of an idle node's ZooKeeper traffic."""
SESSION_CLOSE_WAIT = 2.0
"""Seconds a stop waits for ZooKeeper to close the session (``Node._close_session``)."""
STOP_LIMIT = 8.0
"""Seconds a clean stop may take (it takes 0.1-0.3 s; its waits are bounded: streams 2 s, the server's grace 1 s,
the session close 2 s).
Past it the node logs what it is still waiting for (every task's and thread's stack) and exits 1: a stop that
hangs must be seen, and the launcher would SIGKILL it without a word at ``SERVICE_GRACE`` (10 s)."""


class PeerRestarted(Exception):
    """A process of the running tick restarted: this node's state is of a stream that no longer exists."""


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

    def warm(self) -> None:
        """Connect the streams of the latest tick deployed (``Channels.warm``).  Not called for a tick a newer one
        already waits behind: a restart replays every tick, and the superseded ones' peers may be long gone."""
        ...

    def skip_through(self, tick: int) -> None:
        """Never take ticks up to ``tick``: this process started after them and waits for the recovery tick
        (only roles that learn of ticks outside ``deploy`` need to do anything)."""
        ...

    async def close(self) -> None: ...


class _Health(health.aio.HealthServicer):
    """The standard health service, whose ``Check`` of a service the node does not serve says so: the library's
    NOT_FOUND has no message, and every error this node answers with carries one."""

    def __init__(self) -> None:
        super().__init__()
        self._served = {""}

    async def set(self, service: str, status: int) -> None:
        self._served.add(service)
        await super().set(service, status)

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[Any, Any]) -> health_pb2.HealthCheckResponse:
        if request.service not in self._served:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"this node serves no service {reprlib.repr(request.service)}")  # bounded
        return await super().Check(request, context)


class Node:
    def __init__(self, name: str, roles: list[Role], store: ClusterStore, local: LocalEndpoints, *,
                 host: str = "127.0.0.1", port: int = 0, frames_port: int = 0, data_dir: Path | None = None,
                 credentials: Credentials | None = None, stream_timeout: float = STREAM_TIMEOUT) -> None:
        """``roles`` were built around ``local`` (their in-process peers) and ``store`` (the node's session).

        ``stream_timeout``: seconds a role may stay NOT_SERVING after its stream to a peer broke before the node
        exits 1 (``Supervisor``); 0 = never.

        ``credentials`` (a ``--tls`` node): serve mTLS, check every call (``AuthInterceptor``) and present the
        node certificate on every channel to a peer; None serves plaintext, as an insecure cluster does.
        """
        self.credentials = credentials
        self.data_dir = data_dir
        self._lock_fd = -1
        self.name = name
        self.roles = roles
        self.host = host
        self.port = port
        self.frames_port = frames_port
        self.store = store
        self.server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=[AuthInterceptor(credentials.tokens)]
                                      if credentials is not None else None)
        self.frames = FrameServer(local.streams.get, credentials.ssl_context(server=True) if credentials else None)
        if credentials is not None:
            transport.use_tls(credentials.channel_credentials(with_tokens=False))
            frames.use_tls(credentials.ssl_context(server=False))
        self.health = _Health()
        self.supervisor = Supervisor(self.health, stream_timeout)
        self.local = local
        self._ticks: asyncio.Queue[Tick] = asyncio.Queue()
        self._roster_changed = asyncio.Event()
        """Wakes the recovery watch: the members changed, or this node applied a tick."""
        self._stopped = asyncio.Event()
        self.recovering: int | None = None
        """The latest tick when this process started, if it is one of that tick's (so it waits for recovery)."""
        self.applied: int | None = None
        """The latest tick this node's roles took."""

    async def start(self) -> str:
        """Serve, register every role in ZooKeeper, start following ticks; returns the advertised address."""
        if not self.roles:
            raise ValueError("a node needs at least one role (--worker, --front, --barrier or --acker)")
        # The session first: a barrier adopts the offsets its partitions kept in ZooKeeper in ``register``.
        await asyncio.to_thread(self.store.start)
        for role in self.roles:
            role.register(self.server, self.local)
        codec.add_servicer(self.server, self.health, health_pb2.DESCRIPTOR.services_by_name["Health"])
        codec.add_servicer(self.server, NodeServicer(self.frames), pb.DESCRIPTOR.services_by_name["Node"])
        try:
            await self.frames.start(self.host, self.frames_port)
        except OSError as exc:
            raise SystemExit(f"node {self.name}: cannot bind {self.host}:{self.frames_port} for frames ({exc})") \
                from None
        bind = f"{self.host}:{self.port}"
        port = (self.server.add_secure_port(bind, self.credentials.server_credentials()) if self.credentials
                else self.server.add_insecure_port(bind))
        if port == 0:
            raise SystemExit(f"node {self.name}: cannot bind {self.host}:{self.port}")
        self.local.address = f"{self.host}:{port}"
        await self.server.start()
        await self.supervisor.serving([role.name for role in self.roles])
        await self._register()
        loop = asyncio.get_running_loop()

        def on_tick(number: int, data: dict[str, Any]) -> None:  # kazoo's thread
            if self.recovering is not None and number <= self.recovering:
                loop.call_soon_threadsafe(log.info, "not taking tick %d over: this process started after it, so "
                                          "it waits for the recovery tick", number)
                return
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
        self.supervisor.spawn("node", "recovery watch", self._watch_recovery(), essential=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        log.info("serving %s at %s", ", ".join(role.name for role in self.roles), self.local.address)
        if self.credentials is None:
            log.warning("INSECURE: plaintext gRPC, no authentication, open ZooKeeper ACLs: whoever reaches %s or "
                        "ZooKeeper may push, read the topic, forge exchanges and acks, or deploy code (this node has "
                        "no --tls-dir: `flamestream up --insecure`)", self.local.address)
        print(f"ready {self.name} {self.local.address}", flush=True)  # the launcher's and tests' start signal
        return self.local.address

    async def _register(self) -> None:
        """Register every role; a member left by a dead incarnation of this node is replaced.

        Dead means: this node holds its data dir's node lock (``_lock``), so no
        other live process of this name and data dir exists, and the member's
        session simply has not expired yet (kill -9, then a restart within the
        session timeout).  Without a data dir there is no lock: wait for the old
        session to expire instead.
        """
        identity = {"node": self.name, **placement(self.data_dir)}
        ran_before = self.data_dir is not None and self._lock_path().exists()
        locked = self._lock()
        latest = await asyncio.to_thread(self.store.latest_tick) if ran_before else None
        if latest is not None:
            tick = Tick.from_dict({**latest[1], "number": latest[0]})
            if any(recovery.in_roster(tick, role.kind, role.info()) for role in self.roles):
                self.recovering = latest[0]
                for role in self.roles:
                    role.skip_through(latest[0])
                log.warning("tick %d runs with this node's roles: this is a restart, so the cluster recovers",
                            latest[0])

        def stale(held: dict[str, Any]) -> bool:
            return locked and all(held.get(key) == value for key, value in identity.items())

        deadline = time.monotonic() + self.store.timeout + 5
        for role in self.roles:
            # The pid tells this incarnation's members from a dead one's that still match ``identity``
            # (the launcher waits for the process it started, not for its predecessor's address).
            info = {"address": self.local.address, **identity, **role.info(), ADVERTISED: self._advertised(),
                    "pid": os.getpid()}
            if self.recovering is not None:
                info[recovery.RECOVERING] = self.recovering
            while True:
                try:
                    await asyncio.to_thread(self.store.register, role.kind, role.name, info, stale=stale)
                    break
                except Unauthorized as exc:
                    raise SystemExit(f"node {self.name}: {exc}: start it with --tls-dir DIR, the credentials "
                                     "directory of the cluster (DIR/tls of its `up`, or `flamestream tls-init`)") \
                        from None
                except ValueError as exc:
                    if time.monotonic() >= deadline:
                        raise SystemExit(f"node {self.name}: {exc}") from None
                    log.warning("%s; waiting for its session to expire", exc)
                    await asyncio.sleep(0.5)

    def _advertised(self) -> str:
        """Where clients without credentials may find them if they can read it (``security.discover``: a path is
        no secret); "" says this node serves plaintext."""
        return str(self.credentials.directory.resolve()) if self.credentials is not None else ""

    def _lock_path(self) -> Path:
        """The node lock; that it exists at all says this node ran on this data dir before (a restart)."""
        assert self.data_dir is not None
        return self.data_dir / "nodes" / f"{self.name}.lock"

    def _lock(self) -> bool:
        """Hold ``DIR/nodes/<name>.lock`` for the process's life; exit if a live node of this name holds it."""
        if self.data_dir is None:
            return False
        path = self._lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SystemExit(f"node {self.name} already runs on data dir {self.data_dir}") from None
        self._lock_fd = fd  # released by the kernel when the process ends, however it ends
        return True

    async def _follow_ticks(self) -> None:
        """Hand every tick to every role, in order; a role that cannot take a tick is NOT_SERVING, not the node."""
        while True:
            tick = await self._ticks.get()
            for role in self.roles:
                try:
                    await role.deploy(tick)
                except Exception as exc:
                    self.supervisor.fail(role.name, f"cannot deploy tick {tick.number}", exc)
                else:
                    # A bad tick (a graph that cannot be loaded) is over once a good one is deployed.
                    await self.supervisor.recovered(role.name, "cannot deploy tick")
            self.applied = tick.number
            self._roster_changed.set()
            if self._ticks.empty():  # the latest tick: connect its streams now, not on its first events
                for role in self.roles:
                    role.warm()

    async def _watch_recovery(self) -> None:
        """Restart (exit 1) when a peer of the running tick restarted; publish the recovery tick once all did
        (``flamestream.runtime.recovery``).  ZooKeeper away: look again later, the stream does not need it.

        A look follows every change of the members (a restarted process registering), woken by ZooKeeper
        watches, so recovery starts as soon as the last process is back instead of a polling interval later,
        and every tick this node applies; otherwise it looks every ``RECOVERY_RECHECK`` s, or every
        ``RECOVERY_POLL`` s while it cannot watch or its last look failed.
        """
        loop = asyncio.get_running_loop()
        changed = self._roster_changed

        def wake() -> None:  # kazoo's thread
            loop.call_soon_threadsafe(changed.set)

        wait = RECOVERY_RECHECK
        try:
            await asyncio.to_thread(self.store.watch_members, wake)
        except Exception:
            log.warning("cannot watch the members; looking for restarted peers every %gs", RECOVERY_POLL,
                        exc_info=True)
            wait = RECOVERY_POLL
        failed = False
        while True:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as the wait ends (the
            # members changing as the node stops), and this loop then ran on and held the stop for good.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECOVERY_POLL if failed else wait):
                    await changed.wait()
            changed.clear()
            try:
                restarted = await asyncio.to_thread(recovery.check, self.store, self.applied)
            except Exception:
                log.warning("cannot check for restarted peers", exc_info=True)
                failed = True
                continue
            failed = False
            if restarted is not None:
                raise PeerRestarted(f"{restarted} of tick {self.applied} restarted and lost its state: "
                                    "this node restarts too, for the recovery from the last complete snapshot")

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT or an essential failure, stop; returns the exit code."""
        try:
            await self.start()
            stopped = asyncio.create_task(self._stopped.wait())
            fatal = asyncio.create_task(self.supervisor.fatal.wait())
            await asyncio.wait([stopped, fatal], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            fatal.cancel()
            if self.supervisor.fatal.is_set() and not self._stopped.is_set():
                log.critical("exiting at once (exit code 1), as a crash would: the cluster recovers")
                logging.shutdown()  # the log file is complete before the process goes
                os._exit(1)
        finally:
            await self.stop()
        return 1 if self.supervisor.fatal.is_set() else 0

    async def stop(self) -> None:
        """Fronts first (no new input), then every other role; the server and the session last (``STOP_LIMIT``)."""
        async with stop_limit(STOP_LIMIT):
            await self._stop()

    async def _stop(self) -> None:
        await self.supervisor.stop()
        for role in sorted(self.roles, key=lambda r: r.kind != "front"):
            try:
                await role.close()
            except Exception:
                logs.role_logger(role.name).exception("closing %s failed", role.name)
        await self.frames.close()
        await self.server.stop(grace=1.0)
        await self._close_session()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("stopped")

    async def _close_session(self) -> None:
        """Close the ZooKeeper session, waiting at most ``SESSION_CLOSE_WAIT``.

        With ZooKeeper away kazoo's close waits for its heartbeat to fail (6.3 s
        measured); the session then expires on its own, its members with it, so
        a stop does not wait for that.  The close left running does not hold the
        process: it exits once the node has stopped (``roles.main``).
        """
        try:
            async with asyncio.timeout(SESSION_CLOSE_WAIT):
                await asyncio.to_thread(self.store.stop)
        except TimeoutError:
            log.warning("ZooKeeper did not answer the session close within %g s: this node's members go when the "
                        "session expires", SESSION_CLOSE_WAIT)
        except Exception:  # a session that cannot close cleanly expires all the same
            pass


@contextlib.asynccontextmanager
async def stop_limit(seconds: float) -> AsyncIterator[None]:
    """Exit 1 if the body has not ended within ``seconds``, logging every task's and thread's stack first.

    Two watchdogs: a timer on the event loop names the tasks still awaited;
    if the loop itself is blocked that timer cannot run, and faulthandler's
    thread dumps the threads and exits a second later.
    """
    def hung() -> None:
        tasks = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(file=tasks)
        log.critical("the stop did not end within %g s; exiting 1. Still running:\n%s", seconds, tasks.getvalue())
        with contextlib.suppress(OSError, ValueError):
            faulthandler.dump_traceback(all_threads=True)
        logging.shutdown()
        os._exit(1)

    watchdog = asyncio.get_running_loop().call_later(seconds, hung)
    with contextlib.suppress(RuntimeError, ValueError):  # no stderr to write to: the loop's watchdog only
        faulthandler.dump_traceback_later(seconds + 1, exit=True)
    try:
        yield
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The node's own options; each service package adds its role's (``add_role_arguments``)."""
    parser.add_argument("--zookeeper", required=True, help="ZooKeeper connect string, HOST:PORT")
    parser.add_argument("--cluster", default="default", help="cluster name (ZooKeeper namespace), default 'default'")
    parser.add_argument("--name", help="node name, for logs and health (default: node-<first role>)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and advertise, default 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to bind, 0 = any free port (default)")
    parser.add_argument("--frames-port", type=int, default=0, help="port of the streams from other nodes (exchange, "
                        "acks, delivery; peers learn it over --port), 0 = any free port (default): set it where a "
                        "firewall must name the ports")
    parser.add_argument("--data-dir", type=Path, help="input logs, topics and snapshots (DIR/input, DIR/topic, "
                        "DIR/snapshots); nodes of one cluster share it")
    parser.add_argument("--log-file", type=Path, help="append the log here (default: stderr)")
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text", help="text (default) or json lines")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="default INFO")
    parser.add_argument("--stream-timeout", type=timeout_seconds, default=STREAM_TIMEOUT, metavar="S",
                        help="exit 1 (so a supervisor restarts the node and the cluster recovers) when a stream to "
                             "another node broke and its role is not serving again within S seconds; 0 = never "
                             f"(default {STREAM_TIMEOUT:g})")
    parser.add_argument("--tls-dir", type=Path, help="serve mTLS with the credentials here (`up --tls` makes "
                        "DIR/tls); the node's certificate nodes/<name>.pem is issued for --host if missing")
    add_allow_module_argument(parser)


def timeout_seconds(text: str) -> float:
    """An argparse type: a failure-detection timeout in seconds, 0 meaning off."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (0 = off), got {text}")
    return value


def allow_module(text: str) -> str:
    """An argparse type: a dotted module name (``--allow-module``)."""
    try:
        return check_module_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_allow_module_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-module``, shared by ``node``/``up`` (what a node executes) and ``deploy``/``run`` (checked early).

    Each process checks graphs with its own list: a node never trusts the
    list of whoever deployed, since anyone who can write a tick could claim one.
    """
    parser.add_argument("--allow-module", action="append", default=[], type=allow_module, metavar="PREFIX",
                        help="graph functions may also come from this module and its submodules (repeatable); by "
                             "default only the graph's own package and flamestream.core.hashing. A standard-library "
                             "module is allowed only when named exactly (e.g. --allow-module math)")
