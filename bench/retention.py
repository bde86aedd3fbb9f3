"""What retention leaves on disk: the inverted index at a steady rate with snapshots every second, retention 2.

Prints JSON: at the end of the run, the bytes and files of the fronts' input
logs (``DIR/input``) and of the snapshots (``DIR/snapshots``), the log's start
and end offsets, and — sampled every half second over the run — the most
either ever held and an estimate of what the input log would hold without
retention (every segment's largest size seen, summed).  The output topic is
not trimmed by anything yet; its size is printed for scale.

    python bench/retention.py [--duration 300] [--rate 20] [--segment-bytes 1048576] [--work DIR]

Not a test: numbers for the README.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ is part of the source tree, not of the installed package

from bench.rescale import PAGES, cli  # noqa: E402
from examples import inverted_index  # noqa: E402
from flamestream.client import Client  # noqa: E402
from flamestream.storage.input_log import truncation  # noqa: E402
from flamestream.storage.log import SegmentedLog  # noqa: E402


def usage(directory: Path, pattern: str = "**/*") -> tuple[int, int]:
    """(bytes, files) under ``directory``; files that vanish while counted (retention) are skipped."""
    total = files = 0
    for path in directory.glob(pattern):
        try:
            if path.is_file():
                total += path.stat().st_size
                files += 1
        except FileNotFoundError:
            continue
    return total, files


class Sampler(threading.Thread):
    """Every ``every`` s: the largest size seen of each input-log segment, and the peaks of both directories."""

    def __init__(self, data: Path, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.data, self.every = data, every
        self.segments: dict[str, int] = {}
        self.snapshot_dirs: set[str] = set()
        self.peak_input = self.peak_snapshots = 0
        self.stop = threading.Event()

    def sample(self) -> None:
        for path in (self.data / "input").glob("front-*/*"):
            if path.suffix in (".log", ".index"):
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue
                key = f"{path.parent.name}/{path.name}"
                self.segments[key] = max(self.segments.get(key, 0), size)
        self.snapshot_dirs.update(p.name for p in (self.data / "snapshots").glob("*") if p.is_dir())
        self.peak_input = max(self.peak_input, usage(self.data / "input")[0])
        self.peak_snapshots = max(self.peak_snapshots, usage(self.data / "snapshots")[0])

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(self.every)


def push(zookeeper: str, cluster: str, rate: float, duration: float) -> int:
    corpus = list(inverted_index.read_input(str(PAGES)))
    with Client(zookeeper, cluster) as client:
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < duration:
            page = corpus[i % len(corpus)]
            client.push([{**page, "id": f"{page['id']}~{i // len(corpus)}"}], producer="bench")
            i += 1
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
    return i


def log_state(directory: Path) -> dict[str, Any]:
    last = truncation(directory).last
    with SegmentedLog(directory, readonly=True) as log:
        return {"start_offset": log.start_offset, "end_offset": log.end_offset, "segments": len(log.segment_bases),
                "deleted_up_to": None if last is None else f"{last.ts}:{last.front}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of pushing (default 300)")
    parser.add_argument("--rate", type=float, default=20.0, help="pages per second (default 20)")
    parser.add_argument("--segment-bytes", type=int, default=1 << 20,
                        help="the fronts' input-log segment size: retention deletes whole segments (default 1 MiB)")
    parser.add_argument("--work", type=Path, help="data directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="flamestream-retention-"))
    data = work / "cluster"
    cli("up", "--nodes", "2", "--data-dir", str(data), "--snapshot-interval-ms", "1000",
        "--log-segment-bytes", str(args.segment_bytes))
    sampler = Sampler(data)
    try:
        state = json.loads((data / "cluster.json").read_text())
        cli("deploy", "examples/inverted_index.py", "--data-dir", str(data))
        sampler.start()
        began = time.monotonic()
        pages = push(state["zookeeper"], state["cluster"], args.rate, args.duration)
        pushed_s = time.monotonic() - began
        time.sleep(3)  # the last snapshots and retention rounds
        sampler.stop.set()
        sampler.join()
        sampler.sample()
        input_bytes, input_files = usage(data / "input", "front-*/*")
        snapshot_bytes, snapshot_files = usage(data / "snapshots")
        topic_bytes, _ = usage(data / "topic")
        snapshot_dirs = [p.name for p in (data / "snapshots").glob("*") if p.is_dir()]
        logs = {p.name: log_state(p) for p in sorted((data / "input").glob("front-*")) if p.is_dir()}
        print(json.dumps({
            "duration_s": round(pushed_s, 1), "rate_pages_per_s": args.rate, "pages": pages,
            "snapshot_interval_ms": 1000, "snapshot_retention": 2, "segment_bytes": args.segment_bytes,
            "input": {"bytes": input_bytes, "files": input_files, "logs": logs,
                      "peak_bytes": sampler.peak_input,
                      "written_bytes_estimate": sum(sampler.segments.values())},
            "snapshots": {"bytes": snapshot_bytes, "files": snapshot_files, "snapshots": len(snapshot_dirs),
                          "peak_bytes": sampler.peak_snapshots, "written": len(sampler.snapshot_dirs)},
            "topic_bytes": topic_bytes,
        }, indent=2))
    finally:
        sampler.stop.set()
        cli("down", "--data-dir", str(data))


if __name__ == "__main__":
    main()
