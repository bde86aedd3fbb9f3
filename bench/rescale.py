"""What a rescale costs the stream: the inverted index at a steady rate through `scale` 2 -> 3 -> 2 workers.

Prints JSON: per rescale step, how long `flamestream scale` took, the hand-over
tick's start, the output stall (the longest gap between consecutive released
records from 2 s before to 5 s after the start) and the p99 latency of the
pages pushed within 2 s of it; and the whole run's p50/p99 and record count,
checked against the oracle over the fronts' input logs (exact multiset).

    python bench/rescale.py [--rate 20] [--before 10] [--between 15] [--after 10] [--work DIR]

A page is done when its last changelog record (one per distinct word) is
consumed; latency is push to done.  Not a test: numbers for the README.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ is part of the source tree, not of the installed package

from examples import inverted_index  # noqa: E402
from flamestream import run_oracle  # noqa: E402
from flamestream.client import Client  # noqa: E402
from flamestream.cluster import ClusterStore  # noqa: E402
from flamestream.storage.input_log import read_input_logs  # noqa: E402

PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"flamestream {' '.join(args)} failed: {done.stderr}")
    return done


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


class Run:
    def __init__(self, zookeeper: str, cluster: str, rate: float) -> None:
        self.zookeeper, self.cluster, self.rate = zookeeper, cluster, rate
        corpus = list(inverted_index.read_input(str(PAGES)))
        self.corpus = corpus
        self.pushed: dict[str, float] = {}
        self.words: dict[str, int] = {}
        self.seen: Counter[str] = Counter()
        self.done: dict[str, float] = {}
        self.arrivals: list[float] = []
        self.records = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def push(self) -> None:
        with Client(self.zookeeper, self.cluster) as client:
            i = 0
            start = time.monotonic()
            while not self.stop.is_set():
                page = self.corpus[i % len(self.corpus)]
                page = {**page, "id": f"{page['id']}~{i // len(self.corpus)}"}
                with self.lock:
                    self.words[page["id"]] = len(inverted_index.positions(page))
                    self.pushed[page["id"]] = time.time()
                client.push([page])
                i += 1
                time.sleep(max(0.0, start + i / self.rate - time.monotonic()))

    def consume(self) -> None:
        with Client(self.zookeeper, self.cluster) as client:
            for batch in client.consume_batches(group="rescale", from_committed=False, timeout=30):
                now = time.time()
                with self.lock:
                    for record in batch:
                        self.records += 1
                        self.arrivals.append(now)
                        page = record.payload["page"]
                        self.seen[page] += 1
                        if self.seen[page] == self.words.get(page):
                            self.done[page] = now
                if self.stop.is_set() and len(self.done) == len(self.pushed):
                    return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="pages per second (default 20)")
    parser.add_argument("--before", type=float, default=10.0, help="seconds before the first rescale")
    parser.add_argument("--between", type=float, default=15.0, help="seconds between the two rescales")
    parser.add_argument("--after", type=float, default=10.0, help="seconds after the second rescale")
    parser.add_argument("--work", type=Path, help="data directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="flamestream-rescale-"))
    data = work / "cluster"
    cli("up", "--nodes", "2", "--data-dir", str(data))
    try:
        state = json.loads((data / "cluster.json").read_text())
        run = Run(state["zookeeper"], state["cluster"], args.rate)
        cli("deploy", "examples/inverted_index.py", "--data-dir", str(data))
        threads = [threading.Thread(target=run.push), threading.Thread(target=run.consume)]
        for thread in threads:
            thread.start()
        steps: list[dict[str, Any]] = []
        for workers, wait in ((3, args.before), (2, args.between)):
            time.sleep(wait)
            began = time.time()
            tick = int(cli("scale", "--workers", str(workers), "--data-dir", str(data)).stdout.split()[0])
            steps.append({"workers": workers, "tick": tick, "scale_s": round(time.time() - began, 2)})
        time.sleep(args.after)
        run.stop.set()
        for thread in threads:
            thread.join(180)
        with ClusterStore(state["zookeeper"], cluster=state["cluster"]) as store:
            starts = {n: t["start"][0] / 1000 for n, t in store.ticks()}
        latencies = {page: (run.done[page] - pushed) * 1000 for page, pushed in run.pushed.items() if page in run.done}
        for step in steps:
            switch = starts[step["tick"]]
            window = [t for t in run.arrivals if switch - 2 <= t <= switch + 5]
            gaps = [b - a for a, b in pairwise(window)]
            near = [lat for page, lat in latencies.items() if abs(run.pushed[page] - switch) <= 2]
            step.update(stall_ms=round(max(gaps, default=0) * 1000, 1), p99_near_switch_ms=percentile(near, 0.99),
                        p50_near_switch_ms=percentile(near, 0.5), pages_near_switch=len(near))
        expected = run_oracle(inverted_index.graph(), read_input_logs(data))[0]
        steady = [lat for page, lat in latencies.items()
                  if all(abs(run.pushed[page] - starts[s["tick"]]) > 2 for s in steps)]
        print(json.dumps({
            "rate_pages_per_s": args.rate, "pages": len(run.pushed), "pages_done": len(run.done),
            "records": run.records, "oracle_records": len(expected), "steps": steps,
            "p50_ms": percentile(list(latencies.values()), 0.5), "p99_ms": percentile(list(latencies.values()), 0.99),
            "steady_p50_ms": percentile(steady, 0.5), "steady_p99_ms": percentile(steady, 0.99),
            "mean_ms": round(statistics.fmean(latencies.values()), 1) if latencies else None,
        }, indent=2))
    finally:
        cli("down", "--data-dir", str(data))


if __name__ == "__main__":
    main()
