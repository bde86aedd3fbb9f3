"""Word-count throughput of the oracle and the embedded local runtime (issue 2 benchmark).

Prints one JSON object.  Times are CPU seconds of the process (the machine is
shared).  Its speed still drifts, so systems are measured interleaved, round
after round, and every figure is also given as a ratio to a plain-Python dict
loop measured in the same rounds (the physical limit of one CPython core).
Items are input words.  Simulated fronts inject one event per scheduler step;
``local_4_workers_burst64`` injects bursts of up to 64 to show what
out-of-order arrivals cost (replay overhead = items reaching the barrier per
item released).

``--builds compiled,pure`` compares the two builds of the core (setup.py: the
hot path compiled by mypyc, or the same sources interpreted): each round runs
this benchmark once per build, in a child process each (``FLAMESTREAM_PURE=1``
for the pure one, see ``flamestream.core.compiled``), taking turns.

    python bench/local.py [--lines 10000] [--rounds 3] [--seed 1] [--builds compiled,pure]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import wordcount
from flamestream import LocalRuntime, run_oracle
from flamestream.core import BUILD
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


LOCAL = {"local_1_worker": (1, 1), "local_4_workers": (4, 1), "local_4_workers_burst64": (4, 64)}
"""Local runtime variants: (workers, largest burst a front injects)."""


def measure(args: argparse.Namespace) -> tuple[int, dict[str, list[float]], dict[str, float]]:
    """Words, seconds per round of each system, replay overheads: every system in this process, interleaved."""
    corpus = zipf_corpus(args.lines, 10_000, 10, args.seed)
    words = sum(len(wordcount.split_words(line)) for line in corpus)
    graph = wordcount.graph()
    events: list[object] = list(corpus)
    stamped = stamp_inputs(events)
    overhead: dict[str, float] = {}

    def runtime(name: str, workers: int, batch: int) -> Callable[[], int]:
        def run() -> int:
            result = LocalRuntime(graph, workers=workers, seed=args.seed, batch=batch).run(corpus)
            overhead[name] = result.stats.replay_overhead
            return len(result.output)
        return run

    systems: dict[str, Callable[[], int]] = {
        "plain_python": lambda: plain_python(corpus),
        "oracle": lambda: len(run_oracle(graph, stamped)[0]),
        **{name: runtime(name, workers, batch) for name, (workers, batch) in LOCAL.items()},
    }
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, run in systems.items():
            start = time.process_time()  # CPU seconds: the machine is shared, other processes' load stays out
            released = run()
            seconds[name].append(time.process_time() - start)
            if released != words:
                raise SystemExit(f"{name} released {released} records for {words} words")
    return words, seconds, overhead


def figures(words: int, seconds: dict[str, list[float]]) -> dict[str, Any]:
    rate = {name: words / statistics.median(s) for name, s in seconds.items()}
    return {
        "words_per_s": {k: round(v) for k, v in rate.items()},
        "ratio_to_plain_python": {k: round(v / rate["plain_python"], 4) for k, v in rate.items()},
        "local_to_oracle": {k: round(rate[k] / rate["oracle"], 3) for k in LOCAL},
    }


def by_build(args: argparse.Namespace, builds: list[str]) -> dict[str, Any]:
    """Each round runs the benchmark once per build in a child process, the builds taking turns at going first."""
    seconds: dict[str, dict[str, list[float]]] = {build: {} for build in builds}
    words, overhead = 0, {}
    for round_ in range(args.rounds):
        for build in builds[round_ % len(builds):] + builds[: round_ % len(builds)]:
            env = {**os.environ, "FLAMESTREAM_PURE": "1" if build == "pure" else "0"}
            child = subprocess.run([sys.executable, __file__, "--lines", str(args.lines), "--rounds", "1", "--seed",
                                    str(args.seed), "--raw"], env=env, check=True, capture_output=True, text=True)
            raw = json.loads(child.stdout)
            if raw["build"] != build:
                raise SystemExit(f"asked for the {build} build, the child ran the {raw['build']} one (not built?)")
            words, overhead = raw["words"], raw["replay_overhead"]
            for name, s in raw["seconds"].items():
                seconds[build].setdefault(name, []).extend(s)
    per_build = {build: figures(words, s) for build, s in seconds.items()}
    rates = {build: f["words_per_s"] for build, f in per_build.items()}
    report: dict[str, Any] = {"words": words, "builds": per_build, "replay_overhead": overhead}
    if "compiled" in rates and "pure" in rates:
        report["compiled_over_pure"] = {k: round(v / rates["pure"][k], 2) for k, v in rates["compiled"].items()}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--builds", help="comma-separated builds of the core to compare: compiled, pure")
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # a --builds child: raw seconds
    args = parser.parse_args()
    if args.raw:
        words, seconds, overhead = measure(args)
        print(json.dumps({"build": BUILD, "words": words, "seconds": seconds, "replay_overhead": overhead}))
        return
    header = {"benchmark": "wordcount-local", "lines": args.lines, "vocabulary": 10_000, "rounds": args.rounds,
              "seed": args.seed, "machine": {"cores": os.cpu_count(), "python": platform.python_version()}}
    if args.builds:
        report = {**header, **by_build(args, args.builds.split(","))}
    else:
        words, seconds, overhead = measure(args)
        report = {**header, "build": BUILD, "words": words, **figures(words, seconds), "replay_overhead": overhead}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
