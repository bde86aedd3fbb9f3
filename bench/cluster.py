"""Inverted-index latency on a real local cluster (issue 3 benchmark).

Starts `flamestream up` (2 workers, 1 front by default) on a fresh data dir,
deploys examples/inverted_index.py and pushes the shared Wikipedia pages at a
seeded Poisson rate, each with a fresh page id so it triggers a changelog of
one record per distinct word.  A page's latency runs from just before its push
to the moment its last changelog record is consumed (as FlameStream measured
it).  Rates are tried in increasing order; the max sustainable rate is the
highest whose p99 stays under 100 ms.  Prints JSON.

    python bench/cluster.py [--rates 20,40,80] [--duration 15] [--workers 2] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import inverted_index  # noqa: E402
from flamestream.client import AsyncClient  # noqa: E402

PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"flamestream {args[0]} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_rate(client: AsyncClient, pages: list[dict[str, str]], words: list[int], rate: float,
                   duration: float, rng: random.Random, tag: str) -> dict[str, Any]:
    expected: dict[str, int] = {}
    pushed_at: dict[str, float] = {}
    remaining: dict[str, int] = {}
    done_at: dict[str, float] = {}

    async def consume() -> None:
        async for batch in client.consume_batches(group=f"bench-{tag}", timeout=None):
            now = time.perf_counter()
            for record in batch:
                page = record.payload["page"]
                if page in remaining:
                    remaining[page] -= 1
                    if remaining[page] == 0:
                        done_at[page] = now

    consumer = asyncio.create_task(consume())
    start = time.perf_counter()
    due = start
    k = 0
    while due - start < duration:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        page = pages[k % len(pages)]
        pid = f"{page['id']}-{tag}-{k}"
        remaining[pid] = expected[pid] = words[k % len(pages)]
        pushed_at[pid] = time.perf_counter()
        await client.push([{**page, "id": pid}])
        k += 1
    deadline = time.perf_counter() + 30
    while len(done_at) < len(pushed_at) and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    consumer.cancel()
    latencies = [(done_at[p] - pushed_at[p]) * 1000 for p in pushed_at if p in done_at]
    return {
        "rate_pages_per_s": rate, "pages": len(pushed_at), "completed": len(latencies),
        "records": sum(expected.values()),
        "achieved_pages_per_s": round(len(pushed_at) / (time.perf_counter() - start), 2),
        "p50_ms": round(percentile(latencies, 0.50), 2) if latencies else None,
        "p90_ms": round(percentile(latencies, 0.90), 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        "max_ms": round(max(latencies), 2) if latencies else None,
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
    }


async def bench(args: argparse.Namespace, zookeeper: str, cluster: str) -> list[dict[str, Any]]:
    pages = list(inverted_index.read_input(str(PAGES)))
    words = [len(inverted_index.positions(page)) for page in pages]  # records per page: one per distinct word
    rng = random.Random(args.seed)
    results = []
    async with AsyncClient(zookeeper, cluster) as client:
        for rate in args.rates:
            results.append(await run_rate(client, pages, words, rate, args.duration, rng, f"r{rate:g}"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[20.0, 40.0, 80.0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of pushing per rate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fronts", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flamestream-bench-") as tmp:
        data = Path(tmp) / "cluster"
        cli("up", "--workers", str(args.workers), "--fronts", str(args.fronts), "--data-dir", str(data),
            "--cluster", "bench")
        try:
            state = json.loads((data / "cluster.json").read_text())
            cli("deploy", "examples/inverted_index.py", "--data-dir", str(data))
            results = asyncio.run(bench(args, state["zookeeper"], state["cluster"]))
        finally:
            cli("down", "--data-dir", str(data))
    sustainable = [r["rate_pages_per_s"] for r in results
                   if r["p99_ms"] is not None and r["p99_ms"] < 100 and r["completed"] == r["pages"]]
    print(json.dumps({
        "benchmark": "inverted-index-cluster", "workers": args.workers, "fronts": args.fronts, "seed": args.seed,
        "duration_s": args.duration, "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "exactly_once": True, "results": results,
        "max_sustainable_pages_per_s": max(sustainable) if sustainable else None,
    }, indent=2))


if __name__ == "__main__":
    main()
