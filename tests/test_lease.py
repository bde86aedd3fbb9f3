"""The stamping lease and the hand-over's fence, against a real ZooKeeper (``fronts/lease.py``).

The lease reaches ``LEASE_MS`` ahead so a ZooKeeper pause does not stop the
stream; a hand-over publisher's fence cuts it back so the new tick can start
at once.  What must hold: ZooKeeper's lease is never below what the front may
stamp, the cut happens under the front's push lock, a cut lease does not move
while the fence is up, and a tick never starts before a lease a front may
still stamp under.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from flamestream import client as sdk
from flamestream.cluster import ClusterStore
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick
from flamestream.fronts import lease as lease_module
from flamestream.fronts.lease import LEASE_MS, StampingLease

CLOCK = 1_700_000_000_000


@pytest.fixture
def store(zookeeper: str, cluster_name: str) -> Iterator[ClusterStore]:
    with ClusterStore(zookeeper, cluster=cluster_name) as opened:
        yield opened


class WatchedLock(asyncio.Lock):
    """The push lock, saying when someone asks for it (a positive signal to wait for instead of a sleep)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        self.asked.set()
        return await super().acquire()


class Front:
    """What a front gives its lease: a clock, the newest tick taken, the tick taker and the push lock."""

    def __init__(self, store: ClusterStore) -> None:
        self.now = CLOCK
        self.known = -1
        self.lock = WatchedLock()
        self.lease = StampingLease(store, 0, lambda: self.now, lambda: self.known, self.take, self.lock)

    async def take(self, tick: Tick) -> None:
        self.known = tick.number


def _zookeeper_lease(store: ClusterStore) -> tuple[int, int]:
    return store.leases()[0]


async def _fenced(store: ClusterStore) -> Front:
    """A front that renewed its lease once, and then a fence up to ``CLOCK + 400`` for tick 0's hand-over."""
    front = Front(store)
    await front.lease._renew()
    store.fence(0, CLOCK + 400)
    return front


def test_a_fence_cuts_the_lease_once_and_a_newer_tick_lifts_it(store: ClusterStore) -> None:
    async def scenario() -> None:
        front = Front(store)
        await front.lease._renew()
        assert front.lease.until == _zookeeper_lease(store)[0] == CLOCK + LEASE_MS
        fence = store.fence(0, CLOCK + 400)
        await front.lease._renew()
        assert front.lease.until == _zookeeper_lease(store)[0] == CLOCK + 400
        version = _zookeeper_lease(store)[1]
        front.now = CLOCK + 1000  # past the fence: the cut lease stays put, unwritten (a write fails publication)
        await front.lease._renew()
        assert front.lease.until == CLOCK + 400
        assert _zookeeper_lease(store)[1] == version
        front.known = 1  # a tick newer than the fence's: the fence no longer applies
        await front.lease._renew()
        assert front.lease.until == _zookeeper_lease(store)[0] == CLOCK + 1000 + LEASE_MS
        front.known = 0
        store.unfence(fence)
        front.now = CLOCK + 2000
        await front.lease._renew()
        assert front.lease.until == CLOCK + 2000 + LEASE_MS

    asyncio.run(scenario())


def test_a_front_that_sees_the_fence_late_cuts_at_its_clock(store: ClusterStore) -> None:
    async def scenario() -> None:
        front = await _fenced(store)
        front.now = CLOCK + 900  # stamps up to here may be out already: the lease cannot go below them
        await front.lease._renew()
        assert front.lease.until == _zookeeper_lease(store)[0] == CLOCK + 900

    asyncio.run(scenario())


def test_the_cut_waits_for_the_push_holding_the_front_lock(store: ClusterStore) -> None:
    async def scenario() -> None:
        front = await _fenced(store)
        async with front.lock:  # a push between its lease check and its stamps
            front.lock.asked.clear()
            renewal = asyncio.create_task(front.lease._renew())
            await asyncio.wait_for(front.lock.asked.wait(), 10)  # the renewal read the fence and wants the lock
            await asyncio.sleep(0)
            assert not renewal.done()
            assert front.lease.until == CLOCK + LEASE_MS
        await renewal
        assert front.lease.until == CLOCK + 400

    asyncio.run(scenario())


def test_a_running_lease_cuts_to_a_fence_as_it_goes_up_not_at_its_next_renewal(
        store: ClusterStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front watches the fences (``ClusterStore.watch_fences``) and renews at once; renewals are otherwise a
    second apart, here a minute, so only the watch can make the cut within the test's wait."""
    monkeypatch.setattr(lease_module, "RENEW_EVERY", 60.0)

    async def scenario() -> None:
        front = Front(store)
        renewing = asyncio.create_task(front.lease.run())
        try:
            await _until(lambda: store.leases().get(0, (0, 0))[0] == CLOCK + LEASE_MS)
            fence = store.fence(0, CLOCK + 400)
            await _until(lambda: _zookeeper_lease(store)[0] == CLOCK + 400)
            assert front.lease.until == CLOCK + 400
            front.now = CLOCK + 100
            store.unfence(fence)  # down again: the lease reaches ahead again at once too
            await _until(lambda: _zookeeper_lease(store)[0] == CLOCK + 100 + LEASE_MS)
        finally:
            renewing.cancel()

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait for ``condition`` (read from ZooKeeper, off the loop) to hold; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(condition):
            await asyncio.sleep(0.01)


def _tick(number: int) -> Tick:
    return Tick(number=number, start=GlobalTime(1000, 0), graph={}, layout=Layout.even(1), workers=("w:1",),
                fronts=(0,), acker="a:1", barriers=((0, "b:1"),))


def test_a_handover_starts_at_once_past_a_lease_that_reached_seconds_ahead(store: ClusterStore) -> None:
    store.publish_tick(_tick(0).to_dict())

    async def scenario() -> tuple[int, int, int]:
        front = Front(store)
        front.now = time.time_ns() // 1_000_000
        await front.lease._renew()
        front.known = 0
        renewing = asyncio.create_task(front.lease.run())
        asked = time.time_ns() // 1_000_000
        number = await asyncio.to_thread(sdk._publish_handover, store, dataclasses.replace(_tick(0), previous=0))
        renewing.cancel()
        return asked, number, front.lease.until

    asked, number, cut = asyncio.run(scenario())
    start = store.ticks(0)[0][1]["start"][0]
    assert number == 1
    assert start > cut  # past the lease the front cut to
    assert start < asked + LEASE_MS // 2  # not past the uncut lease, 6 s ahead


def test_a_handover_waits_out_the_lease_of_a_front_that_does_not_see_the_fence(
        store: ClusterStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.publish_tick(_tick(0).to_dict())
    held = time.time_ns() // 1_000_000 + 1500
    store.renew_lease(0, held)  # a front cut off from ZooKeeper keeps this lease and may stamp under it
    monkeypatch.setattr(sdk, "FENCE_WAIT", 0.3)
    sdk._publish_handover(store, dataclasses.replace(_tick(0), previous=0))
    assert store.ticks(0)[0][1]["start"][0] > held
    assert store.fences() == []


def test_a_handover_waits_for_fences_longer_than_a_lease_reaches() -> None:
    """The SDK cannot import the front's ``LEASE_MS``: this keeps its ``FENCE_WAIT`` past it, so a front that
    never saw the fence has run out of lease by the time the publisher stops waiting."""
    assert sdk.FENCE_WAIT * 1000 > LEASE_MS
