"""Word-count throughput of the oracle and the embedded local runtime (issue 2 benchmark).

Prints one JSON object.  The machine's speed drifts, so systems are measured
interleaved, round after round, and every figure is also given as a ratio to a
plain-Python dict loop measured in the same rounds (the physical limit of
one CPython core).  Items are input words.  Simulated fronts inject one event per
scheduler step; ``local_4_workers_burst64`` injects bursts of up to 64 to show
what out-of-order arrivals cost (replay overhead = items reaching the barrier
per item released).

    python bench/local.py [--lines 10000] [--rounds 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import wordcount
from flamestream import LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs


def zipf_corpus(lines: int, vocabulary: int, words_per_line: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    weights = [1 / (rank + 1) for rank in range(vocabulary)]
    return [" ".join(rng.choices(words, weights, k=words_per_line)) for _ in range(lines)]


def plain_python(corpus: list[str]) -> int:
    counts: dict[str, int] = {}
    out = []
    for line in corpus:
        for word in wordcount.split_words(line):
            counts[word] = counts.get(word, 0) + 1
            out.append({"word": word, "count": counts[word]})
    return len(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    corpus = zipf_corpus(args.lines, 10_000, 10, args.seed)
    words = sum(len(wordcount.split_words(line)) for line in corpus)
    graph = wordcount.graph()
    stamped = stamp_inputs(corpus)
    overhead: dict[str, float] = {}

    def runtime(name: str, workers: int, batch: int) -> Callable[[], int]:
        def run() -> int:
            result = LocalRuntime(graph, workers=workers, seed=args.seed, batch=batch).run(corpus)
            overhead[name] = result.stats.replay_overhead
            return len(result.output)
        return run

    local = {"local_1_worker": (1, 1), "local_4_workers": (4, 1), "local_4_workers_burst64": (4, 64)}
    systems: dict[str, Callable[[], int]] = {
        "plain_python": lambda: plain_python(corpus),
        "oracle": lambda: len(run_oracle(graph, stamped)[0]),
        **{name: runtime(name, workers, batch) for name, (workers, batch) in local.items()},
    }
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, run in systems.items():
            start = time.perf_counter()
            released = run()
            seconds[name].append(time.perf_counter() - start)
            if released != words:
                raise SystemExit(f"{name} released {released} records for {words} words")
    rate = {name: words / statistics.median(s) for name, s in seconds.items()}
    report: dict[str, Any] = {
        "benchmark": "wordcount-local",
        "words": words, "lines": args.lines, "vocabulary": 10_000, "rounds": args.rounds, "seed": args.seed,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "words_per_s": {k: round(v) for k, v in rate.items()},
        "ratio_to_plain_python": {k: round(v / rate["plain_python"], 4) for k, v in rate.items()},
        "local_to_oracle": {k: round(rate[k] / rate["oracle"], 3) for k in local},
        "replay_overhead": overhead,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
