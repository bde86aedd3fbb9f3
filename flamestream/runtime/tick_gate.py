"""Which tick a message belongs to, for the roles whose state a fresh tick replaces (acker, barrier).

Senders and receivers see a new tick at different moments, so a message names
its sender's tick.  One of a tick the receiver has not deployed yet waits for
it: taken at once, it would land in the state the tick is about to replace and
be dropped with it.  One of a tick older than the receiver's state is void:
a fresh tick dropped what it belonged to (in-flight global times, buffered
items), and taken into the new state it could never complete.  The wait is
bounded: a tick that is never deployed here (a crafted message, or a sender
that runs ahead of a tick this role is left out of) must not hold a call for
ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import NoReturn, Protocol

import grpc

TICK_WAIT = 10.0
"""Seconds a message may wait for its tick to be deployed here before it is refused."""


class TickNotDeployed(Exception):
    """A message named a tick that did not reach this role within ``TICK_WAIT``."""


class Aborting(Protocol):
    """What ``admitted`` needs of a call's context: a gRPC one, or a node's ``LocalContext``."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...


class TickGate:
    def __init__(self) -> None:
        self.latest: int | None = None
        """The latest tick deployed here (None before the first)."""
        self._since = 0
        """The tick that started the current state: a hand-over carries the state on, a fresh tick replaces it."""
        self._deployed = asyncio.Event()
        """Set, and replaced by a fresh event, at every deployment: messages of a newer tick wait on it."""

    def deploy(self, tick: int, fresh: bool) -> None:
        """Tick ``tick`` is deployed: with new state (``fresh``), or carrying the current state on."""
        self.latest = tick
        if fresh:
            self._since = tick
        deployed, self._deployed = self._deployed, asyncio.Event()
        deployed.set()

    async def admit(self, tick: int, timeout: float = TICK_WAIT) -> bool:
        """Wait until tick ``tick`` is deployed here; then whether its messages belong to the current state.

        ``TickNotDeployed`` if it is not deployed within ``timeout`` seconds.
        """
        if self.latest is not None and tick <= self.latest:  # the usual case, on every batch: no clock read
            return tick >= self._since
        deadline = time.monotonic() + timeout
        while self.latest is None or tick > self.latest:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TickNotDeployed(f"tick {tick} was not deployed here within {timeout:g}s "
                                      f"(the latest is {self.latest})")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for, which may swallow a cancellation (3.11)
                    await self._deployed.wait()
        return tick >= self._since

    async def admitted(self, tick: int, context: Aborting, timeout: float = TICK_WAIT) -> bool:
        """``admit`` for a streaming handler: a tick that never comes ends the call with FAILED_PRECONDITION."""
        try:
            return await self.admit(tick, timeout)
        except TickNotDeployed as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
