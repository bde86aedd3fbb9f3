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

A lease reaches ``LEASE_MS`` ahead so that the stream does not stop while
ZooKeeper is away for a few seconds (a pause, a leader election): at 1 s, a
5-second ZooKeeper pause held every push for 4 s, and the queue that built up
took as long again to drain.  A hand-over cannot wait that long for the leases
to run out, so its publisher first raises a fence (``ClusterStore.fence``):
every front cuts its lease back to the fence's time at its next renewal and
stops extending it until it knows a newer tick; the publisher waits for that
and starts the tick just past it.  The cut is made in memory, under the
front's lock (so no push between its lease check and its stamp sees it
change), before ZooKeeper hears of it: a lease in ZooKeeper is never below
what the front may stamp.  A front that ZooKeeper cannot reach does not see
the fence; the publisher then waits its lease out, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from flamestream.cluster import ClusterStore
from flamestream.core.tick import Tick
from flamestream.runtime.logs import role_logger

LEASE_MS = 7000
"""How far ahead of the clock a front may stamp on one renewal: renewed every ``RENEW_EVERY``, at least 6 s are left
when ZooKeeper goes away, the outage it rides out.  It must stay well below the session timeout (``ClusterStore``'s
10 s): a front cut off from ZooKeeper loses its ephemeral lease when its session expires, and by then the lease must
have run out."""
RENEW_EVERY = 1.0
"""Seconds between renewals: a lease never runs out while ZooKeeper answers (it reaches ``LEASE_MS`` ahead).  A fence
does not wait for the next one: the front watches the fences and renews as one goes up.

Why not renew more often: each renewal is three ZooKeeper requests (the fences, the lease, the ticks), 0.4-0.8 ms
of ZooKeeper's CPU each and a few thread hand-offs in the front's node.  Every 0.25 s, polling for
fences, they were most of an idle cluster's ZooKeeper load and a third of its front node's CPU (README,
*Performance*)."""


class StampingLease:
    def __init__(self, store: ClusterStore, front: int, clock: Callable[[], int], known: Callable[[], int],
                 take: Callable[[Tick], Awaitable[None]], lock: asyncio.Lock) -> None:
        self.store = store
        self.front = front
        self.clock = clock
        """The timestamp the front would stamp now (its clock can run ahead of the wall clock)."""
        self.known = known
        """The newest tick number the front has taken."""
        self.take = take
        """Applies a tick the front has not seen yet."""
        self.lock = lock
        """The front's push lock: held from a push's lease check to its stamps."""
        self.until = 0
        """Stamps must stay below this timestamp."""
        self._written = -1
        """The lease last written to ZooKeeper."""
        self.log = role_logger(f"front{front}")
        self._renewed = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        fenced = asyncio.Event()

        def fences_changed() -> None:  # kazoo's thread
            loop.call_soon_threadsafe(fenced.set)

        watching = False
        while True:
            fenced.clear()
            try:
                if not watching:  # set once ZooKeeper answers; kazoo keeps it across reconnections
                    await asyncio.to_thread(self.store.watch_fences, fences_changed)
                    watching = True
                await self._renew()
            except Exception:  # ZooKeeper away or slow: the lease runs out and pushes wait; keep trying
                self.log.warning("cannot renew the stamping lease", exc_info=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RENEW_EVERY):
                    await fenced.wait()

    async def _renew(self) -> None:
        known = self.known()
        fenced = [until for after, until in await asyncio.to_thread(self.store.fences) if after >= known]
        if fenced:
            async with self.lock:  # cut in memory first, so ZooKeeper's lease stays >= it; and cut once: the
                # cut lease stays put while the fence is up (a moved lease would fail the fencer's publication)
                until = self.until = min(self.until, max(min(fenced), self.clock()))
        else:
            until = self.clock() + LEASE_MS
        if until != self._written:
            await asyncio.to_thread(self.store.renew_lease, self.front, until)
            self._written = until
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
