"""Chaos: kill -9 random processes of a cluster under a steady stream, then check the output exactly (issue #11).

Starts a cluster (``flamestream up``, ``--nodes``, ``--placement``), deploys
the workload's graph and pushes its seeded events at a fixed rate as one
idempotent producer while a consumer follows the topic live.  Every
``--interval`` seconds, give or take a quarter of it, one fault, chosen by a
seeded RNG: kill -9 of a process (a node, or with ``--placement separate`` a
worker, front, barrier or acker process), or ZooKeeper stopped (SIGSTOP) for
``--zookeeper-pause`` seconds and continued.  A fault waits for the previous
one's recovery, so each is measured on its own.  Why the quarter: at exact
multiples of the interval every kill of a run fell at one phase of the
workers' snapshot boundaries (every 4 s under load), so every recovery
re-sent about the same backlog (3.2-3.6 s of input in one run, 2.3-2.5 s in
another) and one phase stood for all.  At the end the consumed topic is
checked *exactly* against the oracle over the fronts' input logs: as a
multiset of (global time, record) — lost = missing, duplicated = extra —,
and per workload: word count's counts per word are 1..n, each once; the
inverted index's final index equals the oracle's.

Prints JSON: the faults (what, when, recovery), recovery times p50/max, the
longest output stall, the records checked, lost and duplicated, and the
latency (scheduled push -> done) of events away from faults and near them.
Each event's latency goes to ``latencies.json`` in the work directory.

A kill's recovery time runs from the kill to the first consumed record of an
event stamped after the kill: only the recovered cluster can have released
it, and it comes after the re-sent backlog.  Why not the first record
consumed after the recovery tick was published (``first_record_s``, kept for
comparison with older runs): that can be a record the barrier had released
before the kill and the consumer read late, or one the barrier's restart
completed; it came 0.4 s after a kill, before the worker had loaded its
snapshot.

    python bench/chaos.py [--workload wordcount|inverted-index] [--duration 300] [--interval 20] [--rate R]
                          [--seed 1] [--nodes 2] [--placement nodes|separate] [--work DIR]

Not a test (``tests/test_chaos.py`` runs a short one in CI): numbers for the README.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ is part of the source tree, not of the installed package

from bench.rescale import cli, percentile  # noqa: E402
from flamestream import run_oracle  # noqa: E402
from flamestream.bench.workloads import Progress, Workload, workload  # noqa: E402
from flamestream.client import Client  # noqa: E402
from flamestream.cluster import ClusterStore  # noqa: E402
from flamestream.storage.input_log import read_input_logs  # noqa: E402

ZOOKEEPER = "zookeeper"
PRODUCER = "chaos"
RECOVERY_TIMEOUT = 180.0
"""Seconds a fault may take to recover before the run gives up on it (and reports it unrecovered)."""
SEGMENT_BYTES = 1 << 30
"""The fronts' input-log segment: retention deletes only sealed segments, and the check reads the whole log."""
IDLE = 10.0
"""Seconds without a record after which the consumer looks whether it is done (then subscribes again)."""
NEAR = 2.0
"""Events scheduled within this many seconds of a fault's window count as affected by it."""


@dataclass
class Fault:
    what: str
    """A process name of the state file (kill -9), or ``zookeeper`` (SIGSTOP, a pause, SIGCONT)."""
    at: float
    """Seconds since the stream started."""
    recovered_at: float | None = None
    """When the first record of an event stamped after the kill arrived (seconds since the start); None: never.
    A ZooKeeper pause: of an event stamped after SIGCONT."""
    recovery_s: float | None = None
    first_record_s: float | None = None
    """Kill -> the first record consumed after the recovery tick was published (the older measure)."""
    recovery_tick: int | None = None
    published_s: float | None = None
    """Kill -> the recovery tick seen published (polled every 50 ms): detection, restart and election."""
    backlog_s: float | None = None
    """Seconds of input between the recovery tick's start (its snapshot boundary) and the kill: what the fronts
    re-send before anything stamped after the kill can be released."""


@dataclass
class Stream:
    """The pusher and the consumer, sharing the clock the faults are timed on."""

    zookeeper: str
    cluster: str
    workload: Workload
    rate: float
    seed: int
    start: float = field(default_factory=time.time)
    pushed: int = 0
    obligations: int = 0
    """Records the pushed events must produce (the consumer's target)."""
    scheduled: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    arrivals: list[float] = field(default_factory=list)
    """Arrival time of each consumed batch (one entry per batch, seconds since the start)."""
    newest: list[float] = field(default_factory=list)
    """The newest stamp of each consumed batch's records, on the same clock as ``arrivals``."""
    records: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set: push no more."""
    pushed_all: threading.Event = field(default_factory=threading.Event)
    """Set by the pusher once its last push returned: ``obligations`` is final."""
    give_up: threading.Event = field(default_factory=threading.Event)
    """Set: stop consuming even if records are missing (the drain timed out)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    progress: Progress = field(init=False)

    def __post_init__(self) -> None:
        self.progress = self.workload.progress()

    def now(self) -> float:
        return time.time() - self.start

    def push(self) -> None:
        """Push the events due so far, every 10 ms, as one producer; a push held up by a recovery falls behind
        and catches up (latency counts from the scheduled time)."""
        events: Iterator[tuple[str, Any]] = self.workload.events(self.seed)
        progress = self.progress
        try:
            with Client(self.zookeeper, self.cluster, retries=1000) as client:
                while not self.stop.is_set():
                    due = int(self.now() * self.rate) - self.pushed
                    batch = list(islice(events, min(max(due, 0), 500)))
                    if batch:
                        with self.lock:
                            for k, (event_id, payload) in enumerate(batch):
                                self.scheduled[event_id] = (self.pushed + k) / self.rate
                                self.obligations += progress.expect(event_id, payload)
                        client.push([payload for _, payload in batch], producer=PRODUCER)
                        self.pushed += len(batch)
                    else:
                        time.sleep(0.01)
        except Exception as exc:
            self.errors.append(f"pusher: {exc!r}")
        finally:
            self.pushed_all.set()

    def consume(self) -> None:
        """Follow the topic live, committing each batch, until every pushed event's records arrived.

        Each subscription ends after ``IDLE`` s without a record, to look
        whether the pushing is over; the next one resumes at the committed
        offsets, so nothing is read twice or skipped.
        """
        progress = self.progress
        try:
            with Client(self.zookeeper, self.cluster, retries=1000) as client:
                while not self.give_up.is_set() and not (self.pushed_all.is_set()
                                                         and self.records.total() >= self.obligations):
                    for batch in client.consume_batches(group="chaos", timeout=IDLE):
                        now = self.now()
                        with self.lock:
                            self.arrivals.append(now)
                            self.newest.append(max(record.time[0] for record in batch) / 1000 - self.start)
                            for record in batch:
                                self.records[_key(record.time, record.payload)] += 1
                                for event in progress.observe(record.payload):
                                    self.done[event] = now
                        for last in {record.partition: record for record in batch}.values():
                            client.commit(last)
                        if self.pushed_all.is_set() and self.records.total() >= self.obligations:
                            return
        except Exception as exc:
            self.errors.append(f"consumer: {exc!r}")

    def first_arrival_after(self, t: float) -> float | None:
        with self.lock:
            return next((a for a in self.arrivals if a > t), None)

    def first_stamped_after(self, t: float) -> float | None:
        """When the first record of an event stamped after ``t`` arrived."""
        with self.lock:
            return next((a for a, newest in zip(self.arrivals, self.newest, strict=True) if newest > t), None)


def _key(time_: Any, payload: Any) -> str:
    return json.dumps([list(time_), payload], sort_keys=True, ensure_ascii=False)


def _state(data: Path) -> dict[str, Any]:
    return json.loads((data / "cluster.json").read_text())  # type: ignore[no-any-return]


def _process(data: Path, name: str) -> dict[str, Any]:
    return next(p for p in _state(data)["processes"] if p["name"] == name)


def _wait(check: Any, timeout: float) -> Any:
    """Poll ``check`` every 50 ms until it returns something true (returned) or ``timeout`` s passed (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    return None


def inflict(data: Path, store: ClusterStore, stream: Stream, fault: Fault, pause: float) -> None:
    """Cause ``fault`` and wait for its positive end: a recovery tick published and a record consumed of an event
    stamped after the kill (ZooKeeper: stamped after SIGCONT, as nothing restarts)."""
    if fault.what == ZOOKEEPER:
        helpers = [pid for pid, _ in _process(data, ZOOKEEPER)["helpers"]] or [_process(data, ZOOKEEPER)["pid"]]
        for pid in helpers:
            os.killpg(pid, signal.SIGSTOP)
        time.sleep(pause)
        for pid in helpers:
            os.killpg(pid, signal.SIGCONT)
        resumed = stream.now()
    else:
        ticks = len(store.ticks())
        restarts = _process(data, fault.what)["restarts"]
        os.kill(_process(data, fault.what)["pid"], signal.SIGKILL)
        fault.at = stream.now()
        if _wait(lambda: _process(data, fault.what)["restarts"] > restarts, RECOVERY_TIMEOUT) is None:
            return

        def recovery_tick() -> tuple[int, dict[str, Any]] | None:
            return next(((n, tick) for n, tick in store.ticks()[ticks:] if tick.get("recovery")), None)

        found = _wait(recovery_tick, RECOVERY_TIMEOUT)
        if found is None:
            return
        fault.recovery_tick, tick = found
        published = stream.now()
        fault.published_s = round(published - fault.at, 3)
        fault.backlog_s = round(fault.at - (tick["start"][0] / 1000 - stream.start), 3)
        first = _wait(lambda: stream.first_arrival_after(published), RECOVERY_TIMEOUT)
        fault.first_record_s = None if first is None else round(first - fault.at, 3)
        resumed = fault.at
    fresh = _wait(lambda: stream.first_stamped_after(resumed), RECOVERY_TIMEOUT)
    if fresh is not None:
        fault.recovered_at = round(fresh, 3)
        fault.recovery_s = round(fresh - fault.at, 3)


def victims(data: Path) -> list[str]:
    """What a fault may hit: every node process (the acker, workers, fronts, barriers), and ZooKeeper if ``up``
    started it."""
    state = _state(data)
    nodes = sorted(p["name"] for p in state["processes"] if p["role"] == "node")
    return nodes + ([ZOOKEEPER] if state["own_zookeeper"] else [])


def check(data: Path, stream: Stream, graph: Any) -> dict[str, Any]:
    """The consumed topic against the oracle over the fronts' input logs, exactly."""
    expected_pairs = run_oracle(graph, read_input_logs(data))[0]
    expected = Counter(_key(gt, payload) for gt, payload in expected_pairs)
    lost, duplicated = expected - stream.records, stream.records - expected
    result: dict[str, Any] = {"records_checked": stream.records.total(), "oracle_records": len(expected_pairs),
                              "lost": lost.total(), "duplicated": duplicated.total(),
                              "examples": sorted(lost)[:3] + sorted(duplicated)[:3]}
    got = [json.loads(key)[1] for key in stream.records.elements()]
    if stream.workload.name == "wordcount":
        counts: dict[str, list[int]] = {}
        for record in got:
            counts.setdefault(record["word"], []).append(record["count"])
        result["counts_1_to_n"] = all(sorted(c) == list(range(1, len(c) + 1)) for c in counts.values())
    else:
        index = {(r["word"], r["page"]): r["positions"] for r in got}
        want = {(r["word"], r["page"]): r["positions"] for _, r in expected_pairs}
        result["final_index_equal"] = index == want
    return result


def run(*, workload_name: str = "wordcount", duration: float = 300.0, interval: float = 20.0,
        rate: float | None = None, seed: int = 1, nodes: int = 2, placement: str = "nodes",
        zookeeper_pause: float = 5.0, snapshot_interval_ms: int = 1000, work: Path | None = None,
        drain: float = 300.0) -> dict[str, Any]:
    """One chaos run; returns the report (see the module docstring)."""
    load = workload(workload_name)
    work = work or Path(tempfile.mkdtemp(prefix="flamestream-chaos-"))
    data = work / "cluster"
    cli("up", "--nodes", str(nodes), "--placement", placement, "--snapshot-interval-ms", str(snapshot_interval_ms),
        "--log-segment-bytes", str(SEGMENT_BYTES), "--data-dir", str(data))
    try:
        state = _state(data)
        cli("deploy", str(ROOT / "examples" / f"{workload_name.replace('-', '_')}.py"), "--data-dir", str(data))
        stream = Stream(state["zookeeper"], state["cluster"], load, rate or {"wordcount": 500.0}.get(
            workload_name, load.default_rate), seed)
        threads = [threading.Thread(target=stream.push, daemon=True), threading.Thread(target=stream.consume,
                                                                                       daemon=True)]
        for thread in threads:
            thread.start()
        rng, phase = random.Random(seed), random.Random(f"phase {seed}")
        choices = victims(data)
        faults: list[Fault] = []
        with ClusterStore(state["zookeeper"], cluster=state["cluster"]) as store:
            while True:
                due = (len(faults) + 1) * interval
                if due > duration - interval / 2:
                    break
                time.sleep(max(0.0, due + phase.uniform(-interval / 4, interval / 4) - stream.now()))
                fault = Fault(rng.choice(choices), round(stream.now(), 3))
                faults.append(fault)
                inflict(data, store, stream, fault, zookeeper_pause)
                fault.at = round(fault.at, 3)
                if fault.recovered_at is None:
                    break  # not recovered: nothing after it would measure anything
            time.sleep(max(0.0, duration - stream.now()))
            stream.stop.set()
            threads[0].join(RECOVERY_TIMEOUT)
            pushed_until = stream.now()
            threads[1].join(drain)
            stream.give_up.set()
            threads[1].join(RECOVERY_TIMEOUT)
        report = _report(stream, faults, pushed_until)
        _write_latencies(work / "latencies.json", stream)
        report.update(check(data, stream, load.graph()),
                      restarts={p["name"]: p["restarts"] for p in _state(data)["processes"] if p["role"] == "node"},
                      workload=workload_name, placement=placement, nodes=nodes, rate=stream.rate,
                      duration_s=duration, interval_s=interval, seed=seed, data_dir=str(data))
        return report
    finally:
        cli("down", "--data-dir", str(data))


def _write_latencies(path: Path, stream: Stream) -> None:
    """Each done event's (scheduled s, latency ms), in push order: to see where a run's tail lies in time
    (the report's percentiles cannot say whether slow events cluster after the faults or spread over the run)."""
    rows = [[round(t, 3), round((stream.done[e] - t) * 1000, 1)] for e, t in stream.scheduled.items()
            if e in stream.done]
    path.write_text(json.dumps(rows))


def _report(stream: Stream, faults: list[Fault], pushed_until: float) -> dict[str, Any]:
    kills = [f for f in faults if f.what != ZOOKEEPER]
    recoveries = [f.recovery_s for f in kills if f.recovery_s is not None]
    gaps = [b - a for a, b in pairwise([0.0, *[t for t in stream.arrivals if t <= pushed_until]])]
    windows = [(f.at - NEAR, (f.recovered_at or pushed_until) + NEAR) for f in faults]
    latencies = {e: (stream.done[e] - t) * 1000 for e, t in stream.scheduled.items() if e in stream.done}
    near = [lat for e, lat in latencies.items() if any(a <= stream.scheduled[e] <= b for a, b in windows)]
    away = [lat for e, lat in latencies.items() if all(not a <= stream.scheduled[e] <= b for a, b in windows)]
    return {
        "faults": [asdict(f) for f in faults],
        "kills": len(kills), "zookeeper_pauses": len(faults) - len(kills),
        "unrecovered": sum(1 for f in faults if f.recovered_at is None),
        "recovery_p50_s": round(statistics.median(recoveries), 3) if recoveries else None,
        "recovery_max_s": max(recoveries, default=None),
        "longest_stall_s": round(max(gaps, default=0.0), 3),
        "events_pushed": stream.pushed, "events_done": len(stream.done),
        "latency_away_from_faults_ms": {"p50": percentile(away, 0.5), "p99": percentile(away, 0.99),
                                        "events": len(away)},
        "latency_near_faults_ms": {"p50": percentile(near, 0.5), "p99": percentile(near, 0.99),
                                   "events": len(near)},
        "errors": stream.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("wordcount", "inverted-index"), default="wordcount")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of streaming (default 300)")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between faults (default 20)")
    parser.add_argument("--rate", type=float, help="events/s (default 500 lines/s word count, 20 pages/s index)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the faults and the input (default 1)")
    parser.add_argument("--nodes", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--placement", choices=("nodes", "separate"), default="nodes")
    parser.add_argument("--zookeeper-pause", type=float, default=5.0, help="seconds ZooKeeper stays stopped")
    parser.add_argument("--snapshot-interval-ms", type=int, default=1000)
    parser.add_argument("--work", type=Path, help="data directory (default: a temporary one)")
    args = parser.parse_args()
    report = run(workload_name=args.workload, duration=args.duration, interval=args.interval, rate=args.rate,
                 seed=args.seed, nodes=args.nodes, placement=args.placement, zookeeper_pause=args.zookeeper_pause,
                 snapshot_interval_ms=args.snapshot_interval_ms, work=args.work)
    print(json.dumps(report, indent=2))
    if report["lost"] or report["duplicated"] or report["unrecovered"] or report["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
