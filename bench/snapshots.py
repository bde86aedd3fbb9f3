"""What a worker's periodic snapshot of the inverted index costs, by phase, as the index grows (issues #11, #13).

The chaos runs' index only grows (every page a new id), and so did what its
snapshots cost: this says which part.  One worker core over the whole hash
space takes the bench's inverted-index pages one at a time, trims at each, and
every ``--every`` pages (a second at 20 pages/s) takes a periodic snapshot the
way a worker does: ``snapshot_changes`` (on the event loop in a node), the
``SnapshotImage`` update (encoding each changed bucket: in the writer's
thread) and the file's write (join, checksum, write and fsync).  Every
``--report`` pages it prints one JSON line: those three in milliseconds of
this thread's CPU, how many buckets changed, the file's size and the encoded
size of the changed buckets.  A node's worker holds its share of the hash
space, so a 2-worker cluster's snapshots are about half of each figure.

    python bench/snapshots.py [--pages 3000] [--every 20] [--report 500]
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

from flamestream.bench.workloads import workload
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, WorkerState, front_envelopes
from flamestream.runtime.heap import tune_gc
from flamestream.storage.snapshots import SnapshotImage


def _encoded_size(changes: WorkerState, path: Path) -> int:
    """Bytes the changed buckets take encoded, as ``SnapshotImage`` encodes them: the body of a snapshot of those
    buckets alone, written to ``path`` (untimed)."""
    changed = SnapshotImage()
    changed.update(changes)  # a removed bucket removes nothing from an empty image
    return changed.write(path, boundary=GlobalTime(0, 0), worker=0, tick=0).body_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--every", type=int, default=20, help="pages between snapshots")
    parser.add_argument("--report", type=int, default=500, help="pages between printed lines")
    args = parser.parse_args()
    tune_gc()
    bench = workload("inverted-index")
    plan = compile_graph(bench.graph())
    whole = Layout.even(1)
    core = Worker(plan, 0, whole)
    image = SnapshotImage()
    pages = [page for _i, page in itertools.islice(bench.events(1), args.pages)]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "worker-0.snap"
        for i, page in enumerate(pages, 1):
            at = GlobalTime(1000 + i, 0)
            for envelopes in front_envelopes(plan, whole, [(plan.entry_balance(page), (page, at, (), False))]).values():
                for _outboxes in core.run(envelopes):
                    pass
            core.on_min_time(at)
            if i % args.every:
                continue
            boundary = GlobalTime(1001 + i, 0)
            started = time.thread_time()
            changes = core.snapshot_changes(boundary)
            changed = time.thread_time()
            image.update(changes)
            encoded = time.thread_time()
            info = image.write(path, boundary=boundary, worker=0, tick=0)
            written = time.thread_time()
            if i % args.report == 0 or i == len(pages):
                print(json.dumps({
                    "pages": i, "changes_ms": round((changed - started) * 1e3, 1),
                    "encode_ms": round((encoded - changed) * 1e3, 1), "write_ms": round((written - encoded) * 1e3, 1),
                    "changed_buckets": sum(map(len, changes.values())), "keys": info.keys,
                    "file_mb": round(info.body_bytes / 1e6, 1),
                    "changed_mb": round(_encoded_size(changes, path.with_name("changed.snap")) / 1e6, 2)}), flush=True)


if __name__ == "__main__":
    main()
