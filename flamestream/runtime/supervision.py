"""Supervision of a node's long-lived tasks: no failure is silent.

Every task a role runs for its whole life (a worker's processing loop, its
min-time watch, a front's reports, a barrier's releases, the tick follower)
is started here.  A task that raises — or simply returns while the node is
not stopping — is logged with its traceback and turns its role, and with it
the node's overall health, NOT_SERVING: a broken acker stream that stops
state trimming, or a release loop that died, shows in the gRPC health check
and the log instead of as output that quietly stops.
An *essential* task's failure also stops the node with a non-zero exit code:
the role cannot go on, and a supervisor (``up``, docker's ``restart``) sees a
dead process.

A task that fails because its stream to another node broke (``StreamBroken``:
a peer that died or a connection that was cut) gets ``stream_timeout`` seconds
to come back — the role turning SERVING again (``recovered``) — and then stops
the node too, naming the peer (issue #11): nothing reopens a broken stream
(what it carried is unknown), so waiting longer would only leave the role
NOT_SERVING for good while the cluster's restart-and-recover path stands idle.
If the peer's address refuses connections, its process is gone and the node
stops at once: the recovery needs every node of the tick restarted, and
starting alongside the dead peer halves the time to it (two start-ups in
parallel instead of one after the other).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from grpc_health.v1 import health, health_pb2

from flamestream.runtime.hosting import StreamBroken, refuses
from flamestream.runtime.logs import role_logger

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

STREAM_TIMEOUT = 10.0
"""Default ``--stream-timeout``: seconds a role may stay NOT_SERVING after a stream to a peer broke."""


PROBES = 5
PROBE_INTERVAL = 0.2
"""A broken stream's peer is probed this many times, this many seconds apart: the kernel closes a killed
process's sockets one by one, so its listener can still accept just after the stream to it broke."""


class Supervisor:
    def __init__(self, health_servicer: health.aio.HealthServicer, stream_timeout: float = STREAM_TIMEOUT) -> None:
        """``stream_timeout``: seconds before a broken stream that did not come back stops the node (0: never)."""
        self.health = health_servicer
        self.stream_timeout = stream_timeout
        self.failures: dict[str, str] = {}
        """Role name -> why it turned NOT_SERVING (the first failure)."""
        self.fatal = asyncio.Event()
        """Set when an essential task failed: the node stops and exits non-zero."""
        self.stopping = False
        self._tasks: dict[asyncio.Task[Any], tuple[str, str, bool, bool]] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        """Health updates and peer probes started from synchronous callbacks: held so they are not collected
        mid-way (the loop keeps only weak references), awaited at ``stop``."""
        self._broken: dict[str, asyncio.TimerHandle] = {}
        """Role -> the timer that stops the node unless the role recovers from its broken stream first."""

    async def serving(self, roles: list[str]) -> None:
        """Declare the node and each of ``roles`` SERVING (each role is also a health service name)."""
        for role in ["", *roles]:
            await self.health.set(role, SERVING)

    def spawn(self, role: str, what: str, coro: Coroutine[Any, Any, Any], essential: bool = False,
              finite: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` as ``role``'s task ``what``; an exception is a failure of ``role``, and so is its end
        outside shutdown unless the task is ``finite`` (a job such as writing a snapshot, not a loop)."""
        task = asyncio.create_task(coro, name=f"{role}: {what}")
        self._tasks[task] = (role, what, essential, finite)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        role, what, essential, finite = self._tasks.pop(task)
        if task.cancelled() or self.stopping:
            return
        error = task.exception()
        if error is None and finite:
            return
        if isinstance(error, StreamBroken) and not essential:
            self.stream_broke(role, what, error)
        else:
            self.fail(role, f"{what} {'failed' if error is not None else 'ended unexpectedly'}", error, essential)

    def stream_broke(self, role: str, what: str, error: StreamBroken) -> None:
        """``role``'s stream broke (its task failed on it, or ``Channels`` saw it end): NOT_SERVING, and the node
        stops unless the role recovers within ``stream_timeout`` (at once if the peer is gone, ``peer_lost``).
        Every report is logged; the timer and the probe start once per role (a dead peer breaks all its streams,
        each seen by its own writer or watch)."""
        if self.stopping:
            return
        self.fail(role, f"{what} failed", error)
        if self.stream_timeout > 0 and role not in self._broken:
            self._broken[role] = asyncio.get_running_loop().call_later(
                self.stream_timeout, self._not_back, role, f"{what}: {error}")
            self.peer_lost(role, f"{what}: {error}", error)

    def peer_lost(self, role: str, broken: str, error: StreamBroken,
                  still_broken: Callable[[], bool] | None = None) -> None:
        """Stop the node at once if nothing listens at the broken stream's peer any more: that process died, and
        the stream cannot come back.  Waiting out ``stream_timeout`` would only delay the recovery, which needs
        this node restarted too; exiting now lets it start alongside the dead peer's restart, not after it.

        ``still_broken``: for a role that does not fail over a broken stream (a front marks its route broken and
        waits for a new tick), whether it still is; if it is ``stream_timeout`` seconds later, the node stops.
        Without it, a front whose stream broke against a peer that went on listening (a restarted node's
        handshake) waited for the acker's stall watch, 30 s, with the log promising 10."""
        if error.peer and self.stream_timeout > 0:
            probe = asyncio.create_task(self._exit_if_gone(role, broken, error.peer, still_broken))
            self._side_tasks.add(probe)
            probe.add_done_callback(self._side_tasks.discard)

    async def _exit_if_gone(self, role: str, broken: str, peer: str,
                            still_broken: Callable[[], bool] | None = None) -> None:
        gone = False
        try:
            for _ in range(PROBES):  # a dying process's listener may still accept for a moment after its streams broke
                if gone := await refuses(peer):
                    break
                await asyncio.sleep(PROBE_INTERVAL)
        except Exception:
            role_logger(role).exception("cannot probe %s", peer)
            return
        if not gone:
            role_logger(role).warning("%s still accepts connections: waiting up to %gs for the stream to come back",
                                      peer, self.stream_timeout)
            if still_broken is not None and role not in self._broken:
                self._broken[role] = asyncio.get_running_loop().call_later(
                    self.stream_timeout, self._not_back, role, broken, still_broken)
        elif not self.stopping:
            self.fail(role, f"{broken}; {peer} refuses connections: the process there is gone", essential=True)

    def _not_back(self, role: str, broken: str, still_broken: Callable[[], bool] | None = None) -> None:
        """``stream_timeout`` after ``role``'s stream broke: stop the node if the role still failed — or, for a
        role that does not fail over it (``peer_lost``), if ``still_broken`` says so."""
        del self._broken[role]
        if (still_broken() if still_broken is not None else role in self.failures) and not self.stopping:
            self.fail(role, f"{broken}; it did not come back within {self.stream_timeout:g}s", essential=True)

    def fail(self, role: str, reason: str, error: BaseException | None = None, essential: bool = False) -> None:
        """Log ``reason`` (with ``error``'s traceback) and turn ``role`` and the node NOT_SERVING."""
        role_logger(role).log(logging.CRITICAL if essential else logging.ERROR,
                              "%s; %s is NOT_SERVING%s", reason, role, " and the node stops" if essential else "",
                              exc_info=error)
        self.failures.setdefault(role, f"{reason}: {error!r}" if error is not None else reason)
        for service in (role, ""):
            update = asyncio.create_task(self.health.set(service, NOT_SERVING))
            self._side_tasks.add(update)
            update.add_done_callback(self._side_tasks.discard)
        if essential:
            self.fatal.set()

    async def recovered(self, role: str, reason: str) -> None:
        """``role`` is SERVING again if its only failure started with ``reason`` (one that a later success ends,
        such as a tick it could not deploy); the node too, once no role has failed."""
        failure = self.failures.get(role)
        if failure is None or not failure.startswith(reason):
            return
        del self.failures[role]
        timer = self._broken.pop(role, None)
        if timer is not None:
            timer.cancel()
        role_logger(role).info("%s is SERVING again", role)
        await self.health.set(role, SERVING)
        if not self.failures:
            await self.health.set("", SERVING)

    async def stop(self) -> None:
        """Cancel every task still running and wait for them: the node is shutting down."""
        self.stopping = True
        for timer in self._broken.values():
            timer.cancel()
        self._broken.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._side_tasks, return_exceptions=True)
