"""The front's stamping lease: no global time at or after a tick's start is stamped before the tick is known.

A hand-over tick takes over the previous tick's state at its start T, so
every event stamped at or after T must go to the new tick's workers: a front
that stamped one under the old tick (because it learned of the new tick a
moment too late) would lose it.  Fronts therefore stamp only below a lease
they hold in ZooKeeper (``ClusterStore.renew_lease``), renewed a little ahead
of the clock, and read the published ticks after every renewal before using
the new bound; deploy publishes a hand-over tick past every lease in one
transaction that fails if any lease moved meanwhile.  Either the tick was
published before a renewal — and the front reads it before stamping past the
old bound — or the renewal came first and the publication is retried with a
later start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from flamestream.cluster import ClusterStore
from flamestream.core.tick import Tick
from flamestream.runtime.logs import role_logger

LEASE_MS = 1000
"""How far ahead of the clock a front may stamp on one renewal."""
RENEW_EVERY = 0.25
"""Seconds between renewals: a lease never runs out while ZooKeeper answers."""


class StampingLease:
    def __init__(self, store: ClusterStore, front: int, clock: Callable[[], int], known: Callable[[], int],
                 take: Callable[[Tick], Awaitable[None]]) -> None:
        self.store = store
        self.front = front
        self.clock = clock
        """The timestamp the front would stamp now (its clock can run ahead of the wall clock)."""
        self.known = known
        """The newest tick number the front has taken."""
        self.take = take
        """Applies a tick the front has not seen yet."""
        self.until = 0
        """Stamps must stay below this timestamp."""
        self.log = role_logger(f"front{front}")
        self._renewed = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self._renew()
            except Exception:  # ZooKeeper away or slow: the lease runs out and pushes wait; keep trying
                self.log.warning("cannot renew the stamping lease", exc_info=True)
            await asyncio.sleep(RENEW_EVERY)

    async def _renew(self) -> None:
        until = self.clock() + LEASE_MS
        await asyncio.to_thread(self.store.renew_lease, self.front, until)
        for number, data in await asyncio.to_thread(self.store.ticks, self.known()):
            await self.take(Tick.from_dict({**data, "number": number}))
        self.until = until
        renewed, self._renewed = self._renewed, asyncio.Event()
        renewed.set()

    async def covering(self, ts: int, timeout: float) -> bool:
        """Wait until stamping ``ts`` is allowed; False if the lease was not renewed that far within ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                while ts >= self.until:
                    await self._renewed.wait()
        except TimeoutError:
            return False
        return True
