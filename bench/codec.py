"""Item batches on the wire: pickle (before issue #12) vs the column codec, encode + decode (issue #13).

The traffic is real: the examples' graphs run on the worker core over two
workers, and every batch that would cross a process boundary — front ->
worker, worker -> worker, worker -> barrier (payloads already turned into
records, as ``to_records`` does) — is kept, in chunks of ``--batch-items``
(256, the worker's default).  Word count: Zipf-distributed lines; the
inverted index: the shared Wikipedia pages (synthetic pages if the file is
missing).

What is timed per item, as a cross-node stream pays it: the sender builds the
``ItemBatch`` and serializes it, the receiver parses it and decodes it —
``pickle.loads`` for the old way (no checks at all), the receivers' own
decoder with every check for the new one (``decode_envelopes`` /
``decode_items``).  No acks (they cost both the same).  The collector is
tuned as in a node (``tune_gc``: the captured traffic is frozen, young
collections are rare), or walking the traffic held for the benchmark would
dominate both.  Times are CPU seconds of this process, since the machine is
shared; its speed still drifts, so both codecs are timed in every round,
channel by channel, taking turns at going first, and figures are medians over
the rounds.  Prints one JSON object; ``ratio`` is new / pickle (below 1: the
new codec is faster).

    python bench/codec.py [--rounds 7] [--lines 3000] [--pages 60] [--batch-items 256]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import inverted_index, wordcount  # noqa: E402
from flamestream.core.front import stamp_inputs  # noqa: E402
from flamestream.core.graph import Graph  # noqa: E402
from flamestream.core.plan import compile_graph  # noqa: E402
from flamestream.core.tick import Layout  # noqa: E402
from flamestream.core.worker import Worker, front_envelopes  # noqa: E402
from flamestream.runtime.heap import tune_gc  # noqa: E402
from flamestream.wire import codec  # noqa: E402
from flamestream.wire import flamestream_pb2 as pb  # noqa: E402

PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"

Batches = list[list[Any]]


def traffic(graph: Graph, events: list[Any], batch_items: int, workers: int = 2) -> dict[str, Batches]:
    """Every batch that crosses a process boundary while ``workers`` worker cores run ``events``, by channel."""
    plan = compile_graph(graph)
    layout = Layout.even(workers)
    cores = [Worker(plan, i, layout) for i in range(workers)]
    inputs = [(plan.entry_balance(payload), (payload, gt, trace, False)) for _f, gt, trace, payload in
              stamp_inputs(events)]
    queues = front_envelopes(plan, layout, inputs)
    channels: dict[str, Batches] = {"front->worker": [], "worker->worker": [], "worker->barrier": []}

    def chunks(entries: list[Any]) -> Batches:
        return [entries[i:i + batch_items] for i in range(0, len(entries), batch_items)]

    for envelopes in queues.values():
        channels["front->worker"] += chunks(envelopes)
    while any(queues.values()):
        for index, core in enumerate(cores):
            pending, queues[index] = queues.get(index, []), []
            for batch in chunks(pending):
                remote, to_barrier = core.process(batch)
                for worker, envelopes in remote.items():
                    queues.setdefault(worker, []).extend(envelopes)
                    channels["worker->worker"] += chunks(envelopes)
                channels["worker->barrier"] += chunks(codec.to_records(to_barrier))
    return {channel: batches for channel, batches in channels.items() if batches}


def zipf_lines(lines: int, seed: int, vocabulary: int = 10_000, words_per_line: int = 10) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    weights = [1 / (rank + 1) for rank in range(vocabulary)]
    return [" ".join(rng.choices(words, weights, k=words_per_line)) for _ in range(lines)]


def pages(count: int, seed: int) -> list[dict[str, str]]:
    if PAGES.exists():
        return list(inverted_index.read_input(str(PAGES)))[:count]
    return [{"id": str(i), "title": f"page {i}", "text": line}  # the shared data is missing: synthetic pages
            for i, line in enumerate(zipf_lines(count, seed, words_per_line=2000))]


def pickle_round_trip(batches: Batches) -> Callable[[], None]:
    def run() -> None:
        for entries in batches:
            data = pb.ItemBatch(items=pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL), sender=0)
            pickle.loads(pb.ItemBatch.FromString(data.SerializeToString()).items)
    return run


def codec_round_trip(batches: Batches, decode: Callable[[pb.ItemBatch], Any]) -> Callable[[], None]:
    def run() -> None:
        for entries in batches:
            decode(pb.ItemBatch.FromString(codec.encode_batch(entries, {}, sender=0, tick=0).SerializeToString()))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--lines", type=int, default=3000, help="word count: input lines (10 words each)")
    parser.add_argument("--pages", type=int, default=60, help="inverted index: input pages")
    parser.add_argument("--batch-items", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    workloads = {"wordcount": traffic(wordcount.graph(), zipf_lines(args.lines, args.seed), args.batch_items),
                 "inverted_index": traffic(inverted_index.graph(), pages(args.pages, args.seed), args.batch_items)}
    runs: dict[tuple[str, str], dict[str, Callable[[], None]]] = {}
    items: dict[tuple[str, str], int] = {}
    sizes: dict[tuple[str, str], dict[str, float]] = {}
    for workload, channels in workloads.items():
        for channel, batches in channels.items():
            decode = codec.decode_items if channel == "worker->barrier" else codec.decode_envelopes
            for entries in batches:  # exact, or the timing means nothing
                if decode(codec.encode_batch(entries, {}, sender=0, tick=0))[0] != entries:
                    raise SystemExit(f"{workload} {channel}: the codec changed a batch")
            key = (workload, channel)
            items[key] = sum(map(len, batches))
            runs[key] = {"pickle": pickle_round_trip(batches), "new": codec_round_trip(batches, decode)}
            sizes[key] = {"pickle": sum(len(pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)) for b in batches),
                          "new": sum(len(codec.encode_batch(b, {}, sender=0, tick=0).items) for b in batches)}

    tune_gc()
    seconds: dict[tuple[str, str], dict[str, list[float]]] = {key: {"pickle": [], "new": []} for key in runs}
    for round_number in range(args.rounds):
        for key, codecs in runs.items():
            order = ["pickle", "new"] if round_number % 2 == 0 else ["new", "pickle"]
            for name in order:
                started = time.process_time()
                codecs[name]()
                seconds[key][name].append(time.process_time() - started)

    def us_per_item(keys: list[tuple[str, str]], name: str) -> float:
        # Per round, the workload's channels summed: a channel's share weighs as its traffic does.
        totals = [sum(seconds[key][name][r] for key in keys) for r in range(args.rounds)]
        return statistics.median(totals) / sum(items[key] for key in keys) * 1e6

    def figures(keys: list[tuple[str, str]]) -> dict[str, Any]:
        old, new = us_per_item(keys, "pickle"), us_per_item(keys, "new")
        count = sum(items[key] for key in keys)
        return {"items": count, "pickle_us_per_item": round(old, 3), "new_us_per_item": round(new, 3),
                "ratio": round(new / old, 3),
                "pickle_bytes_per_item": round(sum(sizes[key]["pickle"] for key in keys) / count, 1),
                "new_bytes_per_item": round(sum(sizes[key]["new"] for key in keys) / count, 1)}

    report: dict[str, Any] = {
        "benchmark": "wire-codec",
        "measure": "CPU time of encode (ItemBatch built, serialized) + decode (parsed, decoded, checked), median "
                   "of rounds",
        "rounds": args.rounds, "batch_items": args.batch_items, "seed": args.seed,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "workloads": {workload: {"total": figures([k for k in runs if k[0] == workload]),
                                 **{k[1]: figures([k]) for k in runs if k[0] == workload}}
                      for workload in workloads},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
