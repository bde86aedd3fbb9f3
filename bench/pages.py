"""A large page's critical path: the inverted index's largest pages pushed one at a time into an idle cluster.

Why: the index's p99 at 20 pages/s is the latency of one of its largest pages
(the largest 5 % start at about 1,300 changelog records), and a bench run mixes
that with queueing behind other pages.  Pushed alone, a page shows where its own
time goes: the push's round trip, the wait until its first record is consumed
(all of a page's records share its global time, so the barrier releases them
together once the page's whole fan-out is done on every worker) and the tail
until its last one is (the release, the topic and the consumer).  Each page goes
``--rounds`` times under fresh ids, after a warm-up of small pages, with a pause
between pushes so the cluster is idle again; it prints one JSON object: per
page, its records and the median and range of each figure over the rounds.

    python bench/pages.py [--pages 6] [--rounds 3] [--snapshot-interval-ms 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from flamestream.bench.workloads import InvertedIndex
from flamestream.client import AsyncClient, Client
from flamestream.runtime import launcher

WARM_UP = 30
"""Small pages pushed first, so that the measured pushes find the connections, the code and the caches warm."""
PAUSE = 0.5
"""Seconds between a page's last record and the next push, so that its snapshot and trims are behind it."""


async def _measure(client: AsyncClient, pages: list[dict[str, str]], records: list[int],
                   warm_up: list[tuple[dict[str, str], int]], rounds: int) -> list[list[dict[str, float]]]:
    """Per page, per round: the push's round trip and when its first and last record were consumed, in ms from the
    push's start.  ``warm_up``: pages with their records, pushed and consumed first."""
    arrivals: list[float] = []
    counted = asyncio.Event()
    consumed = 0

    async def consume() -> None:
        nonlocal consumed
        async for batch in client.consume_batches(group="pages", from_committed=False):
            arrivals.append(time.perf_counter())
            consumed += len(batch)
            counted.set()

    async def pushed(page: dict[str, str], expected: int) -> tuple[float, float]:
        """Push ``page`` once its predecessors' records are all in; (seconds the push took, when it began)."""
        nonlocal consumed
        arrivals.clear()
        consumed = 0
        started = time.perf_counter()
        await client.push([page])
        took = time.perf_counter() - started
        while consumed < expected:
            counted.clear()
            await counted.wait()
        return took, started

    consumer = asyncio.create_task(consume())
    try:
        for i, (page, expected) in enumerate(warm_up):
            await pushed({**page, "id": f"{page['id']}~warm{i}"}, expected)
        timings: list[list[dict[str, float]]] = [[] for _ in pages]
        for round_ in range(rounds):
            for i, (page, expected) in enumerate(zip(pages, records, strict=True)):
                await asyncio.sleep(PAUSE)
                took, started = await pushed({**page, "id": f"{page['id']}~{round_}"}, expected)
                first, last = arrivals[0] - started, arrivals[-1] - started
                timings[i].append({"push_ms": 1e3 * took, "first_ms": 1e3 * first, "last_ms": 1e3 * last,
                                   "tail_ms": 1e3 * (last - first)})
        return timings
    finally:
        consumer.cancel()


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each figure's median, min and max over the rounds."""
    summary = {}
    for name in runs[0]:
        values = sorted(run[name] for run in runs)
        summary[name] = {"median": round(statistics.median(values), 2), "min": round(values[0], 2),
                         "max": round(values[-1], 2)}
    return summary


def run(pages: int, rounds: int, snapshot_interval_ms: int) -> dict[str, Any]:
    workload = InvertedIndex()
    corpus = sorted(workload.pages, key=workload.records_of, reverse=True)
    chosen = corpus[:pages]
    records = [workload.records_of(page) for page in chosen]
    work = Path(tempfile.mkdtemp(prefix="flamestream-pages-"))
    data_dir = work / "cluster"
    data_dir.mkdir()
    state = launcher.start_cluster(launcher.UpOptions(
        data_dir=data_dir, nodes=2, fronts=1, cluster="pages", placement="nodes", exactly_once=True,
        snapshot_interval_ms=snapshot_interval_ms, tls_dir=None, spares=False))
    try:
        with Client(state.zookeeper, state.cluster) as client:
            client.deploy(workload.graph())

        async def measure() -> list[list[dict[str, float]]]:
            async with AsyncClient(state.zookeeper, state.cluster) as client:
                await client.connect()
                warm_up = [(page, workload.records_of(page)) for page in corpus[-WARM_UP:]]
                return await _measure(client, chosen, records, warm_up, rounds)

        timings = uvloop.run(measure())
    finally:
        launcher.stop_cluster(state, data_dir)
        shutil.rmtree(work, ignore_errors=True)
    return {"benchmark": "inverted-index-large-pages", "rounds": rounds, "snapshot_interval_ms": snapshot_interval_ms,
            "pages": [{"records": n, **_summary(runs)} for n, runs in zip(records, timings, strict=True)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=6, help="how many of the largest pages (default 6)")
    parser.add_argument("--rounds", type=int, default=3, help="pushes of each page (default 3)")
    parser.add_argument("--snapshot-interval-ms", type=int, default=1000, help="the cluster's (default 1000)")
    args = parser.parse_args()
    print(json.dumps(run(args.pages, args.rounds, args.snapshot_interval_ms), indent=2))


if __name__ == "__main__":
    main()
