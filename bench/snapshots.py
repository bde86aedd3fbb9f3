"""What a worker's periodic snapshot of the inverted index costs, by phase, as the index grows (issues #11, #13).

The chaos runs' index only grows (every page a new id), and so did what its
snapshots cost: this says which part.  One worker core over the whole hash
space takes the bench's inverted-index pages one at a time, trims at each, and
every ``--every`` pages (a second at 20 pages/s) takes a periodic snapshot the
way a worker does: ``snapshot_changes`` (on the event loop in a node), the
``SnapshotImage`` update (encoding each changed bucket: in the writer's
thread) and the file's write (join, checksum, write and fsync).  Every
``--report`` pages it prints one JSON line: those three in milliseconds of
this thread's CPU, how many buckets changed, the file's size and whether it
is a delta on the one before (``SnapshotImage.write``), the encoded
size of the changed buckets and how much of it the update copied from the
buckets' earlier encodings (``flamestream.core.splice``).  A node's worker
holds its share of the hash space, so a 2-worker cluster's snapshots are
about half of each figure.

Each line also says what the whole loop cost since the line before: the
process's CPU seconds, of which the pages' processing and the trims (this
thread's CPU), and the cyclic collector's collections (how many, their
milliseconds, the longest: each one stops the event loop of a node that long),
with the process's peak RSS, and the encoding and writing of all its snapshots
(``all_encode_ms``, ``all_write_ms``: deltas and whole files take turns).
``--every 0`` takes no snapshots, for the core's own figures.

    python bench/snapshots.py [--pages 3000] [--every 20] [--report 500]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from flamestream.bench.workloads import workload
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, WorkerState, front_envelopes
from flamestream.runtime.heap import tune_gc
from flamestream.storage.snapshots import SnapshotImage, snapshot_path


def _encoded_size(changes: WorkerState, path: Path) -> int:
    """Bytes the changed buckets take encoded, as ``SnapshotImage`` encodes them: the body of a snapshot of those
    buckets alone, written to ``path`` (untimed)."""
    changed = SnapshotImage()
    changed.update(changes)  # a removed bucket removes nothing from an empty image
    return changed.write(path, boundary=GlobalTime(0, 0), worker=0, tick=0).body_bytes


class Collections:
    """The cyclic collector's collections since the last ``take``, timed through ``gc.callbacks``."""

    def __init__(self) -> None:
        self._started = 0.0
        self._times: list[float] = []
        gc.callbacks.append(self._note)

    def _note(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._times.append(time.perf_counter() - self._started)

    def take(self) -> dict[str, Any]:
        times, self._times = self._times, []
        return {"count": len(times), "ms": round(sum(times) * 1e3, 1),
                "longest_ms": round(max(times, default=0.0) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--every", type=int, default=20, help="pages between snapshots (0: none)")
    parser.add_argument("--report", type=int, default=500, help="pages between printed lines")
    args = parser.parse_args()
    tune_gc()
    bench = workload("inverted-index")
    plan = compile_graph(bench.graph())
    whole = Layout.even(1)
    core = Worker(plan, 0, whole)
    image = SnapshotImage()
    pages = [page for _i, page in itertools.islice(bench.events(1), args.pages)]
    collections = Collections()
    cpu = time.process_time()
    processing = trimming = 0.0
    totals = {"encode_ms": 0.0, "write_ms": 0.0}
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        for i, page in enumerate(pages, 1):
            at = GlobalTime(1000 + i, 0)
            started = time.thread_time()
            for envelopes in front_envelopes(plan, whole, [(plan.entry_balance(page), (page, at, (), False))]).values():
                for _outboxes in core.run(envelopes):
                    pass
            processed = time.thread_time()
            core.on_min_time(at)
            processing += processed - started
            trimming += time.thread_time() - processed
            line: dict[str, Any] = {"pages": i}
            changes: WorkerState = {}
            if args.every and i % args.every == 0:
                changes = _snapshot(core, image, GlobalTime(1001 + i, 0), data_dir, line)
                for phase in ("encode_ms", "write_ms"):
                    totals[phase] += line[phase]
            if i % args.report == 0 or i == len(pages):
                line.update({f"all_{phase}": round(total) for phase, total in totals.items()})
                totals = dict.fromkeys(totals, 0.0)
                line["cpu_s"] = round(time.process_time() - cpu, 2)
                line["processing_s"], line["trimming_s"] = round(processing, 2), round(trimming, 2)
                line["collections"] = collections.take()
                line["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
                if changes:  # measured outside the stretch's figures: no worker does this
                    line["changed_mb"] = round(_encoded_size(changes, data_dir / "changed.snap") / 1e6, 2)
                    collections.take()
                cpu = time.process_time()
                processing = trimming = 0.0
                print(json.dumps(line), flush=True)


def _snapshot(core: Worker, image: SnapshotImage, boundary: GlobalTime, data_dir: Path,
              line: dict[str, Any]) -> WorkerState:
    """Take a periodic snapshot below ``boundary`` as a worker does, into its file of ``data_dir``, adding to
    ``line`` what each phase cost and how large it was; the changes it took.  Once a file is whole, the older ones
    go (untimed): nothing builds on them any more."""
    path = snapshot_path(data_dir, boundary, 0)
    started = time.thread_time()
    changes = core.snapshot_changes(boundary)
    changed = time.thread_time()
    copied = image.copied
    image.update(changes)
    encoded = time.thread_time()
    info = image.write(path, boundary=boundary, worker=0, tick=0)
    written = time.thread_time()
    if info.base is None:
        for older in (data_dir / "snapshots").iterdir():
            if older != path.parent:
                shutil.rmtree(older)
    line.update({"changes_ms": round((changed - started) * 1e3, 1), "encode_ms": round((encoded - changed) * 1e3, 1),
                 "write_ms": round((written - encoded) * 1e3, 1), "changed_buckets": sum(map(len, changes.values())),
                 "keys": info.keys, "file_mb": round(info.body_bytes / 1e6, 1), "delta": info.base is not None,
                 "copied_mb": round((image.copied - copied) / 1e6, 2)})
    return changes


if __name__ == "__main__":
    main()
