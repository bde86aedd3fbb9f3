"""Batch replay on Spark vs the embedded local runtime, and the audit, over growing input logs (issue 14).

The inverted index over the shared Wikipedia pages repeated x1, x10, x40 with fresh page ids, written straight
into a front's input log with the log writer.  For each size, in fresh processes: ``replay`` on Spark (default
``local[2]``) and the local runtime (1 worker) over the same events.  While each runs, the process tree is sampled
for the peak RSS of the driver's Python process, of its JVM (in local mode the JVM hosts the executors too) and of
the Python workers that run the stages.  For the largest size, the local runtime's output is written as the topic
(what barriers would hold) and ``flamestream audit`` compares it with the Spark replay (must say EQUAL).

    python bench/replay.py [--sizes 1,10,40] [--partitions 8] [--master local[2]] [--no-local] [--work DIR]

Prints JSON (and writes it to ``--json`` if given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples import inverted_index  # noqa: E402
from flamestream.core.front import stamp_inputs  # noqa: E402
from flamestream.core.payload import encode_payload  # noqa: E402
from flamestream.storage.input_log import encode_record, front_log_dir  # noqa: E402
from flamestream.storage.log import SegmentedLog  # noqa: E402

PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"
GRAPH = ROOT / "examples" / "inverted_index.py"


def write_log(directory: Path, size: int, pages: int | None = None) -> int:
    """The pages ``size`` times with fresh ids, stamped by one front (one page a millisecond), as its input log.

    One front, like the earlier benchmark: the local runtime's best case (no race between fronts, so its
    groupings never replay), which isolates the cost of each engine.  Returns the number of events."""
    corpus = list(inverted_index.read_input(str(PAGES)))[:pages]
    events: list[object] = [dict(page, id=f"{page['id']}-{r}") for r in range(size) for page in corpus]
    logs: dict[int, SegmentedLog] = {}
    try:
        for front, gt, trace, payload in stamp_inputs(events, fronts=1, per_ms=1):
            if front not in logs:
                logs[front] = SegmentedLog(front_log_dir(directory, front), fsync=False)
            logs[front].append(encode_record(gt, trace[0], payload))
    finally:
        for log in logs.values():
            log.close()
    return len(events)


class TreeSampler:
    """Peak RSS of a process tree, by part: the root (driver Python), java processes, other Python processes."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.peak = {"driver_python": 0, "jvm": 0, "workers_python": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                now = {"driver_python": self.root.memory_info().rss, "jvm": 0, "workers_python": 0}
                for child in self.root.children(recursive=True):
                    try:
                        name = "jvm" if "java" in child.name() else "workers_python"
                        now[name] += child.memory_info().rss
                    except psutil.Error:
                        continue
            except psutil.Error:
                return
            for key, value in now.items():
                self.peak[key] = max(self.peak[key], value)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {f"{key}_peak_mb": round(value / 2**20, 1) for key, value in self.peak.items()}


def run_child(args: list[str]) -> tuple[dict[str, Any], dict[str, float]]:
    process = subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sampler = TreeSampler(process.pid)
    out, _ = process.communicate()
    rss = sampler.stop()
    if process.returncode != 0:
        raise SystemExit(f"{args[0]} failed with exit code {process.returncode}")
    return json.loads(out.strip().splitlines()[-1]), rss


def child_spark(data: str, out: str, master: str, partitions: int) -> None:
    from flamestream.loader import load_graph
    from flamestream.spark.replay import replay, spark_session

    graph, _ = load_graph(str(GRAPH))
    spark = spark_session(master, "flamestream-bench-replay")
    try:
        with tempfile.TemporaryDirectory() as warm:  # start-up (JVM, Python workers) is not replay time
            write_log(Path(warm), 1, pages=20)
            replay(spark, warm, str(Path(warm) / "out"), graph=graph, partitions=partitions, progress=lambda line: None)
        start = time.perf_counter()
        result = replay(spark, data, out, graph=graph, partitions=partitions, progress=lambda line: None)
        seconds = time.perf_counter() - start
    finally:
        spark.stop()
    print(json.dumps({"seconds": seconds, "events": result.events, "released": result.released}))


def child_local(data: str, topic: str) -> None:
    from flamestream.core.local import LocalRuntime
    from flamestream.runtime.heap import tune_gc
    from flamestream.storage.input_log import read_input_logs
    from flamestream.wire import flamestream_pb2 as pb

    stamped = sorted(read_input_logs(Path(data)), key=lambda s: s[1])
    tune_gc()
    start = time.perf_counter()
    output = LocalRuntime(inverted_index.graph(), workers=1, fronts=1).run_stamped(stamped).output
    seconds = time.perf_counter() - start
    if topic:
        for front in sorted({gt.front for gt, _trace, _p in output}):
            with SegmentedLog(Path(topic) / "topic" / str(front), fsync=False) as log:
                batch = [pb.Record(time=pb.GlobalTime(ts=gt.ts, front=gt.front),
                                   payload=encode_payload(p)).SerializeToString()
                         for gt, _trace, p in output if gt.front == front]
                for i in range(0, len(batch), 100_000):
                    log.append_many(batch[i:i + 100_000])
    print(json.dumps({"seconds": seconds, "events": len(stamped), "released": len(output)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-spark":
        child_spark(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-local":
        child_local(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,40", help="repetitions of the 268 pages (default 1,10,40)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]",
                        help="Spark master URL, or 'standalone': start a standalone master and worker (2 cores) here")
    parser.add_argument("--no-local", action="store_true", help="skip the local runtime (and the audit)")
    parser.add_argument("--work", default="/tmp/flamestream-bench-replay", help="input logs and outputs")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.work)
    runs: list[dict[str, Any]] = []
    cluster = None
    if args.master == "standalone":  # a real cluster: the executors run under its worker, outside the driver's tree
        from flamestream.spark.standalone import StandaloneCluster

        cluster = StandaloneCluster(work / "standalone", cores=2, memory="4g")
        args.master = cluster.start()
    try:
        for size in sizes:
            runs.append(measure(args, work, size, max(sizes)))
    finally:
        if cluster is not None:
            cluster.stop()
    master = "standalone: 1 worker, 2 cores" if cluster else args.master
    result = {"benchmark": "inverted-index-replay", "master": master, "partitions": args.partitions,
              "machine": {"cores": os.cpu_count(), "python": platform.python_version()}, "runs": runs}
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


def measure(args: argparse.Namespace, work: Path, size: int, largest: int) -> dict[str, Any]:
    """Spark, then (unless --no-local) the local runtime, over the log of ``size``; the audit at the largest."""
    data = work / f"x{size}"
    if not (data / "input").is_dir():
        shutil.rmtree(data, ignore_errors=True)
        write_log(data, size)
    run: dict[str, Any] = {"size": size}
    spark, rss = run_child(["--child-spark", str(data), str(data / "replayed"), args.master,
                            str(args.partitions)])
    run["spark"] = {"events": spark["events"], "records": spark["released"], "seconds": round(spark["seconds"], 1),
                    "events_per_s": round(spark["events"] / spark["seconds"], 1),
                    "records_per_s": round(spark["released"] / spark["seconds"]), **rss}
    print(json.dumps(run["spark"]), file=sys.stderr, flush=True)
    if not args.no_local:
        topic = str(data / "topic-dir") if size == largest else ""
        if topic:
            shutil.rmtree(topic, ignore_errors=True)
        local, rss = run_child(["--child-local", str(data), topic])
        run["local_runtime"] = {"seconds": round(local["seconds"], 1),
                                "events_per_s": round(local["events"] / local["seconds"], 1),
                                "records_per_s": round(local["released"] / local["seconds"]),
                                "peak_rss_mb": rss["driver_python_peak_mb"]}
        if local["released"] != spark["released"]:
            raise SystemExit(f"x{size}: Spark released {spark['released']}, the local runtime {local['released']}")
        run["spark_to_local_runtime"] = round(run["spark"]["events_per_s"] / run["local_runtime"]["events_per_s"],
                                              3)
        print(json.dumps(run["local_runtime"]), file=sys.stderr, flush=True)
        if topic:
            audit = subprocess.Popen([sys.executable, "-m", "flamestream", "audit", "--topic", topic,
                                      "--replay", str(data / "replayed"), "--master", args.master], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
            started = time.perf_counter()
            sampler = TreeSampler(audit.pid)
            verdict, _ = audit.communicate()
            run["audit"] = {"seconds": round(time.perf_counter() - started, 1), "exit": audit.returncode,
                            "verdict": verdict.strip().splitlines()[0], **sampler.stop()}
            print(json.dumps(run["audit"]), file=sys.stderr, flush=True)
    return run


if __name__ == "__main__":
    main()
