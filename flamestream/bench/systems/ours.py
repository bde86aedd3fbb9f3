"""flamestream itself: a real local cluster (ZooKeeper and node processes), driven over gRPC.

The pusher awaits each push before the next, so global time follows push
order and the oracle sees the stream as pushed; events that fell due while a
push was in flight go out together in the next one.  The consumer is a topic
subscription in the same client: an event is done when its records were
*consumed*, i.e. released by the barrier, appended (fsynced) to the output
topic and streamed back.
"""

from __future__ import annotations

import asyncio
import contextlib
from importlib.metadata import version
from typing import Any

import uvloop

from flamestream.bench.harness import Pacer, RunSpec, Tracker
from flamestream.bench.workloads import Workload
from flamestream.client import AsyncClient, Client
from flamestream.runtime import launcher


class Flamestream:
    check_method = "changelog"
    placement = "nodes"
    """Co-located roles, one node per worker (``FlamestreamSeparate``: a process per role, for comparison)."""
    tls = False
    """``FlamestreamTLS``: the same cluster started as ``up --tls``, to show what transport security costs."""

    def setup(self, spec: RunSpec, workload: Workload) -> None:
        self._spec = spec
        self.guarantees = "exactly-once" if spec.exactly_once else "off (barrier releases on arrival)"
        data_dir = spec.workdir / "cluster"
        data_dir.mkdir(parents=True, exist_ok=True)
        self._state = launcher.start_cluster(launcher.UpOptions(
            data_dir=data_dir, nodes=spec.workers, fronts=1, cluster="bench", placement=self.placement,
            exactly_once=spec.exactly_once, snapshot_interval_ms=spec.snapshot_interval_ms,
            tls_dir=data_dir / "tls" if self.tls else None,
            spares=False))  # nothing is killed here: a spare's imports would only add CPU to what is measured
        self._credentials = self._state.tls_dir or None
        try:
            with Client(self._state.zookeeper, self._state.cluster, credentials=self._credentials) as client:
                client.deploy(workload.graph())
        except BaseException:
            launcher.stop_cluster(self._state, data_dir)  # the runner only closes a system whose set-up succeeded
            raise

    def run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        return uvloop.run(self._run(pacer, tracker))

    async def _run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        async with AsyncClient(self._state.zookeeper, self._state.cluster, credentials=self._credentials) as client:
            await client.connect()  # before the clock: a producer connects once, not with its first event
            consumer = asyncio.create_task(self._consume(client, tracker))
            async for batch in pacer.abatches():
                await client.push([payload for _event_id, payload in batch])
            deadline = asyncio.get_running_loop().time() + self._spec.drain_timeout
            while tracker.pending and asyncio.get_running_loop().time() < deadline and not consumer.done():
                await asyncio.sleep(0.005)
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            stats = await client.barrier_stats()
        return {"version": f"flamestream {version('flamestream')}", "workers": self._spec.workers,
                "placement": self.placement, "tls": self.tls,
                "replay_overhead": None if stats.replay_overhead is None else round(stats.replay_overhead, 4),
                "retractions": stats.retractions}

    @staticmethod
    async def _consume(client: AsyncClient, tracker: Tracker) -> None:
        async for batch in client.consume_batches(group="bench", from_committed=False):
            tracker.observe([record.payload for record in batch])

    def close(self) -> None:
        launcher.stop_cluster(self._state, self._spec.workdir / "cluster")


class FlamestreamSeparate(Flamestream):
    """The same cluster with every role in a process of its own: what co-locating roles on nodes saves."""

    placement = "separate"


class FlamestreamTLS(Flamestream):
    """The default cluster with ``--tls``: mTLS between nodes, TLS and tokens for the client (``bench --tls``)."""

    tls = True
