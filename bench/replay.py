"""Batch replay throughput on Spark vs the embedded local runtime (issue 4 benchmark).

The inverted index over the shared Wikipedia pages (repeated as new revisions to
the requested count), stamped like one front would; replay on Spark local[2]
and the local runtime (1 worker) on the same input, interleaved over rounds
because this machine's speed drifts.  Prints JSON with input events/s.

    python bench/replay.py [--pages 536] [--rounds 2] [--partitions 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import inverted_index  # noqa: E402
from flamestream import LocalRuntime  # noqa: E402
from flamestream.core.front import stamp_inputs  # noqa: E402
from flamestream.spark.replay import replay, spark_session  # noqa: E402

PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=536, help="input events (pages, repeated as revisions)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    corpus = list(inverted_index.read_input(str(PAGES)))
    pages = [corpus[i % len(corpus)] for i in range(args.pages)]
    stamped = stamp_inputs(pages)
    graph = inverted_index.graph()
    spark = spark_session("local[2]", "flamestream-bench")
    seconds: dict[str, list[float]] = {"spark_replay_local2": [], "local_runtime_1_worker": []}
    released: dict[str, int] = {}
    try:
        replay(spark, graph, stamped[:20], partitions=args.partitions, progress=lambda line: None)  # warm-up
        for _ in range(args.rounds):
            start = time.perf_counter()
            released["spark_replay_local2"] = len(replay(spark, graph, stamped, partitions=args.partitions,
                                                         progress=lambda line: None))
            seconds["spark_replay_local2"].append(time.perf_counter() - start)
            start = time.perf_counter()
            released["local_runtime_1_worker"] = len(LocalRuntime(graph, workers=1).run_stamped(stamped).output)
            seconds["local_runtime_1_worker"].append(time.perf_counter() - start)
    finally:
        spark.stop()
    if len(set(released.values())) != 1:
        raise SystemExit(f"systems disagree on the output size: {released}")
    rate = {name: args.pages / statistics.median(s) for name, s in seconds.items()}
    print(json.dumps({
        "benchmark": "inverted-index-replay", "input_events": args.pages, "released": released["spark_replay_local2"],
        "rounds": args.rounds, "partitions": args.partitions,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "events_per_s": {k: round(v, 1) for k, v in rate.items()},
        "spark_to_local_runtime": round(rate["spark_replay_local2"] / rate["local_runtime_1_worker"], 3),
    }, indent=2))


if __name__ == "__main__":
    main()
