"""Batch replay of the fronts' input log as a Spark job, with the project's own operator code.

The model is deterministic, so replaying the logged events (each with the
global time and trace its front stamped) must release exactly what the stream
released.  The graph compiles into one Spark stage per grouping, in the order
groupings feed each other: a stage repartitions the grouping's whole input by
its balancing hash, sorts each partition by meta and runs the worker core over
it depth-first — global-time order, so nothing is ever replayed — with every
other grouping *cut*: items bound for one are set aside as that grouping's
input.  Each grouping's state therefore lives in exactly one stage.  Stateless
work between groupings needs no partitioning.  A cycle through one grouping
stays inside its stage as long as its items re-enter on the same partition; a
cycle through two groupings, or an item re-entering its grouping on another
partition, crosses a repartition and is refused naming the edge.

Data flows executor to executor: the input log is read by the executors
(``format("flamestream-input")``), every stage is a DataFrame ``repartition``
(by the hash range owning each item) + ``sortWithinPartitions`` (by meta) +
``mapInArrow`` running the worker core, and the released records are written by
the executors as Parquet partitioned by front.  The driver holds plans and
counters only.

Ticks: each global-time interval [tick.start, next.start) runs with its tick's
graph, and a tick that takes over its predecessor's state (``Tick.previous``)
starts from exactly the model's hand-over: each grouping stage of the interval
before ends with the state below the boundary (``Worker.snapshot``), which the
next interval's stage of the grouping with the same name restores into the
worker owning each key (``Worker.restore``).  A replay from a snapshot starts
the same way, from the snapshot's files, and reads only the log after it.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from flamestream.core.graph import Graph
from flamestream.core.item import Envelope, Item
from flamestream.core.meta import MIN_TIME, GlobalTime
from flamestream.core.payload import encode_payload
from flamestream.core.plan import GROUPING, Plan, compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.core.worker import Worker, WorkerState, entry_hash
from flamestream.runtime.heap import tune_gc
from flamestream.spark.progress import Progress
from flamestream.storage.snapshots import SnapshotError, read_snapshot

OUT, CUT, STATE, ERROR, REJECTED, EVENTS = range(6)
"""Row kinds: a released record, an envelope bound for a grouping's stage, a bucket of grouping state carried
into a stage, an error message, an event the entry balancing function refused, and a count of input events
(in ``hash``, one row per input batch)."""

ROW_SCHEMA = "kind TINYINT, op INT, hash INT, owner INT, ts BIGINT, front INT, trace ARRAY<BIGINT>, data BINARY"
"""Rows between stages.  ``op``: the destination operation (CUT) or grouping (STATE); ``owner``: the hash range
(of ``Layout.even(partitions)``) that owns ``hash``; ``data``: the pickled payload (CUT), pickled (key, entries)
(STATE), payload JSON (OUT, REJECTED) or UTF-8 message (ERROR)."""

OUT_SCHEMA = "ts BIGINT, trace ARRAY<BIGINT>, payload STRING, front INT"
"""What ``replay`` writes: global time, trace (meta order) and payload JSON, partitioned by front."""

CHUNK = 256
"""Envelopes the worker core takes at once (its grouping state is trimmed between chunks)."""
FLUSH = 8192
"""Rows a task hands to Spark at once at most."""


class ReplayError(ValueError):
    """The graph cannot run as batch stages (the message names the edge), or the replay's input is unusable."""


def spark_session(master: str, app: str, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession the way flamestream runs its jobs: bound to loopback, UI off, only errors logged, executors
    on this interpreter (which has flamestream installed), our own progress lines instead of Spark's bar."""
    from pyspark.sql import SparkSession

    # The JVM reads it at launch: without it, Spark warns on every command that the hostname resolves to loopback
    # and names another interface's address "instead", though the driver binds to 127.0.0.1 (below).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false").config("spark.log.level", "ERROR")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1024"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def parse_conf(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (the CLI's ``--conf``) -> a Spark configuration."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf takes KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


# -- planning ----------------------------------------------------------------------------------------------------

def grouping_order(plan: Plan) -> list[int]:
    """Groupings in the order their stages must run (each after every grouping that feeds it)."""
    groupings = [op for op, kind in enumerate(plan.kinds) if kind == GROUPING]
    feeds = {g: _next_groupings(plan, g) - {g} for g in groupings}
    order: list[int] = []
    waiting = {g: sum(g in fed for fed in feeds.values()) for g in groupings}
    ready = [g for g in groupings if waiting[g] == 0]
    while ready:
        g = ready.pop(0)
        order.append(g)
        for h in sorted(feeds[g]):
            waiting[h] -= 1
            if waiting[h] == 0:
                ready.append(h)
    if len(order) < len(groupings):
        g = next(g for g in groupings if g not in order)
        h = next(h for h in sorted(feeds[g]) if h not in order)
        raise ReplayError(f"cannot replay in batch: grouping {plan.names[g]!r} feeds grouping {plan.names[h]!r} "
                          f"and is fed back by it — a cycle crossing a repartition at the input of {plan.names[h]!r}")
    return order


def _next_groupings(plan: Plan, start: int) -> set[int]:
    """Groupings reachable from ``start``'s outputs without passing through another grouping."""
    found: set[int] = set()
    seen: set[int] = set()
    frontier = list(plan.routes[start])
    while frontier:
        op = frontier.pop()
        if op in seen:
            continue
        seen.add(op)
        if plan.kinds[op] == GROUPING:
            found.add(op)
        else:
            frontier.extend(plan.routes[op])
    return found


@dataclass(frozen=True)
class Interval:
    """Events with global time in [start, stop) (None: unbounded) run with ``graph``; ``carry``: the interval
    starts from the previous interval's state below ``start`` (a tick that takes its predecessor's state over)."""

    start: GlobalTime | None
    stop: GlobalTime | None
    graph: Graph
    carry: bool = True


def intervals_of_ticks(ticks: Iterable[Tick], after: GlobalTime | None = None) -> list[Interval]:
    """The replay plan of a cluster's ticks: [tick.start, next.start) with the tick's graph.

    Events before the first tick (there should be none: fronts admit nothing
    before a deploy) run with the first tick's graph.  Consecutive ticks of the
    same graph that hand their state over are one interval: the hand-over keeps
    the last ``window - 1`` items of each bucket, which is all a later window
    can include, so splitting would change traces only, never the output.
    With ``after``, intervals start there (a replay from a snapshot).
    """
    ordered = sorted(ticks, key=lambda t: (t.start, t.number))
    if not ordered:
        raise ReplayError("the cluster has no ticks: nothing was ever deployed")
    out: list[Interval] = []
    for i, tick in enumerate(ordered):
        stop = ordered[i + 1].start if i + 1 < len(ordered) else None
        start = None if i == 0 else tick.start
        if after is not None and stop is not None and stop <= after:
            continue
        if after is not None and (start is None or start < after):
            start = after
        graph = Graph.from_dict(tick.graph)
        carry = tick.previous is not None
        if out and carry and out[-1].graph.to_json() == graph.to_json():
            out[-1] = Interval(out[-1].start, stop, out[-1].graph, out[-1].carry)
        else:
            out.append(Interval(start, stop, graph, carry))
    return out


def read_ticks(zookeeper: str, cluster: str) -> list[Tick]:
    """Every tick the cluster published, with its number."""
    from flamestream.cluster import ClusterStore

    with ClusterStore(zookeeper, cluster=cluster) as store:
        return [Tick.from_dict({**data, "number": n}) for n, data in store.ticks()]


# -- executor side: rows in, rows out ----------------------------------------------------------------------------

@cache
def _plan(graph_json: str) -> Plan:
    """Each executor compiles the shipped graph once (functions are resolved by import path there), and tunes its
    garbage collector like a worker's: the cyclic collector took 44% of the core's time on the inverted index."""
    plan = compile_graph(Graph.from_json(graph_json))
    tune_gc()
    return plan


def _groupings(plan: Plan) -> frozenset[int]:
    return frozenset(op for op, kind in enumerate(plan.kinds) if kind == GROUPING)


class Rows:
    """Output rows of a task, handed to Spark as Arrow batches of at most ``FLUSH`` rows."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.columns: list[list[Any]] = [[] for _ in range(8)]

    def __len__(self) -> int:
        return len(self.columns[0])

    def add(self, kind: int, op: int, h: int | None, ts: int | None, front: int | None, trace: Iterable[int],
            data: bytes, owner: int | None = None) -> None:
        kinds, ops, hashes, owners, tss, fronts, traces, datas = self.columns
        kinds.append(kind)
        ops.append(op)
        hashes.append(h)
        owners.append(owner if h is None or kind == EVENTS else self.layout.owner(h))
        tss.append(ts)
        fronts.append(front)
        traces.append(list(trace))
        datas.append(data)

    def cut(self, envelopes: Iterable[Envelope]) -> None:
        for op, h, (payload, gt, trace, _tomb) in envelopes:
            self.add(CUT, op, h, gt.ts, gt.front, trace, pickle.dumps(payload, pickle.HIGHEST_PROTOCOL))

    def released(self, items: Iterable[Item]) -> None:
        for payload, gt, trace, tomb in items:
            if tomb:
                self.error(f"batch replay produced a retraction at {gt}: its input was not in meta order")
            self.add(OUT, -1, None, gt.ts, gt.front, trace, encode_payload(payload))

    def events(self, n: int) -> None:
        """A count of input events, carried in ``hash`` (summed by the driver's counters)."""
        self.add(EVENTS, -1, n, None, None, (), b"")

    def error(self, message: str) -> None:
        self.add(ERROR, -1, None, None, None, (), message.encode())

    def state(self, op: int, state: WorkerState, name: str) -> None:
        for h, key, entries in state.get(name, ()):
            self.add(STATE, op, h, MIN_TIME.ts, MIN_TIME.front, (),
                     pickle.dumps((key, entries), pickle.HIGHEST_PROTOCOL))

    def batch(self) -> Any:
        import pyarrow as pa  # type: ignore[import-untyped]

        kinds, ops, hashes, owners, tss, fronts, traces, datas = self.columns
        self.columns = [[] for _ in range(8)]
        return pa.RecordBatch.from_arrays(
            [pa.array(kinds, pa.int8()), pa.array(ops, pa.int32()), pa.array(hashes, pa.int32()),
             pa.array(owners, pa.int32()), pa.array(tss, pa.int64()), pa.array(fronts, pa.int32()),
             pa.array(traces, pa.list_(pa.int64())), pa.array(datas, pa.binary())],
            names=["kind", "op", "hash", "owner", "ts", "front", "trace", "data"])

    def flush(self, force: bool = False) -> Iterator[Any]:
        if len(self) >= FLUSH or (force and len(self)):
            yield self.batch()


def entry_pass(graph_json: str, partitions: int, batches: Iterable[Any]) -> Iterator[Any]:
    """Input-log rows -> the stateless work they start: released records, and envelopes cut at groupings."""
    plan = _plan(graph_json)
    groupings = _groupings(plan)
    worker = Worker(plan, 0, Layout.even(1), groupings)
    rows = Rows(Layout.even(partitions))
    entry = plan.entry
    keep_hash = plan.replicated or plan.balances[entry] is not None
    for batch in batches:
        columns = batch.to_pydict()
        rows.events(batch.num_rows)
        envelopes: list[Envelope] = []
        for front, ts, seq, text in zip(columns["front"], columns["ts"], columns["seq"], columns["payload"],
                                        strict=True):
            payload = json.loads(text)
            h = entry_hash(plan, payload)  # an int32, as the front stamped it, or None as the oracle says
            if h is None:  # the front refuses such an event: it never entered the stream
                rows.add(REJECTED, -1, None, ts, front, (), text.encode())
                continue
            envelopes.append((entry, h if keep_hash else None, (payload, GlobalTime(ts, front), (seq,), False)))
        if entry in groupings:
            rows.cut(envelopes)
        else:
            for i in range(0, len(envelopes), CHUNK):
                _remote, sink = worker.process(envelopes[i:i + CHUNK])  # one worker owns every hash: no remote
                rows.released(sink)
                rows.cut(worker.cut_off)
                worker.cut_off = []
                yield from rows.flush()
        yield from rows.flush()
    yield from rows.flush(force=True)


def stage_pass(graph_json: str, grouping: int, partitions: int, carry: Mapping[str, int], boundary: GlobalTime | None,
               batches: Iterable[Any]) -> Iterator[Any]:
    """One partition of ``grouping``'s stage: rows sorted by (owner, meta), state rows of an owner first.

    Each hash range (owner) gets its own worker core, restored from the state
    rows and then fed the envelopes in meta order, a chunk at a time, its state
    trimmed before each chunk to what a later item can still need (everything
    before the chunk is done).  Items the core routes to another range go to a
    stateless worker: fine unless they are bound for this grouping (its cycle
    changed partition).  With ``carry`` (grouping name -> its operation in the
    next interval's graph), each worker ends by handing over its state below
    ``boundary``.
    """
    plan = _plan(graph_json)
    groupings = _groupings(plan)
    layout = Layout.even(partitions)
    free = Worker(plan, 0, Layout.even(1), groupings)
    rows = Rows(layout)
    name = plan.names[grouping]
    refused = (f"cannot replay in batch: an item re-enters grouping {name!r} through its cycle on another "
               "partition — a cycle crossing a repartition")
    worker: Worker | None = None
    owner: int | None = None
    restore: WorkerState = {}
    chunk: list[Envelope] = []

    def run() -> bool:
        assert worker is not None
        if restore:
            worker.restore(restore)
            restore.clear()
        if not chunk:
            return True
        worker.on_min_time(chunk[0][2][1])
        remote, sink = worker.process(chunk)
        chunk.clear()
        rows.released(sink)
        rows.cut(worker.cut_off)
        worker.cut_off = []
        stray = [env for envs in remote.values() for env in envs]
        if any(env[0] == grouping for env in stray):
            rows.error(refused)
            return False
        if stray:
            _remote, freed = free.process(stray)
            rows.released(freed)
            if any(env[0] == grouping for env in free.cut_off):
                rows.error(refused)
                return False
            rows.cut(free.cut_off)
            free.cut_off = []
        return True

    def finish() -> None:
        if worker is not None and carry and boundary is not None:
            state = worker.snapshot(boundary)
            for grouping_name, op in carry.items():
                rows.state(op, state, grouping_name)

    for batch in batches:
        columns = batch.to_pydict()
        for kind, op, h, own, ts, front, trace, data in zip(
                columns["kind"], columns["op"], columns["hash"], columns["owner"], columns["ts"], columns["front"],
                columns["trace"], columns["data"], strict=True):
            if own != owner:
                if worker is not None and not run():
                    yield from rows.flush(force=True)
                    return
                finish()
                owner = own
                worker = Worker(plan, own, layout, groupings - {grouping})
            if kind == STATE:
                key, entries = pickle.loads(data)
                restore.setdefault(plan.names[op], []).append((h, key, entries))
                continue
            chunk.append((op, h, (pickle.loads(data), GlobalTime(ts, front), tuple(trace), False)))
            if len(chunk) >= CHUNK:
                if not run():
                    yield from rows.flush(force=True)
                    return
                yield from rows.flush()
    if worker is not None and run():
        finish()
    yield from rows.flush(force=True)


def snapshot_pass(graph_json: str, partitions: int, batches: Iterable[Any]) -> Iterator[Any]:
    """Snapshot file paths -> STATE rows for the groupings of the graph (matched by name), or an ERROR row."""
    plan = _plan(graph_json)
    ops = {plan.names[op]: op for op in _groupings(plan)}
    rows = Rows(Layout.even(partitions))
    for batch in batches:
        for path in batch.to_pydict()["path"]:
            try:
                _info, state = read_snapshot(Path(path))
            except SnapshotError as exc:
                rows.error(str(exc))
                continue
            for name, op in ops.items():
                rows.state(op, state, name)
                yield from rows.flush()
    yield from rows.flush(force=True)


def check_snapshot_file(path: str) -> tuple[str, str, int, int, int, int]:
    """(path, error or "", boundary ts, boundary front, tick, worker) of one snapshot file, read where it lies."""
    try:
        info, _state = read_snapshot(Path(path))
    except SnapshotError as exc:
        return path, str(exc), 0, 0, 0, 0
    return path, "", info.boundary.ts, info.boundary.front, info.tick, info.worker


# -- driver side: plans and counters -----------------------------------------------------------------------------

def partition_keys(partitions: int) -> list[int]:
    """For each owner i, a small int whose Spark hash partitioning lands in partition i: ``repartition(n, key)``
    places rows by pmod(murmur3(key, 42), n), so keying rows by these puts hash range i in partition i, one each."""
    keys: dict[int, int] = {}
    k = 0
    while len(keys) < partitions:
        keys.setdefault(_murmur3_int(k) % partitions, k)
        k += 1
    return [keys[i] for i in range(partitions)]


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (the ``hash`` of an INT column), as a signed int."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = rotl((value & mask) * 0xCC9E2D51 & mask, 15) * 0x1B873593 & mask
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & mask
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@dataclass
class StageCount:
    label: str
    rows_in: int
    released: int
    cut: int
    state: int


@dataclass
class ReplayResult:
    events: int = 0
    released: int = 0
    rejected: int = 0
    stages: list[StageCount] = field(default_factory=list)


class _Job:
    """One replay: the plan of stages over DataFrames, and the counters the driver keeps."""

    def __init__(self, spark: Any, partitions: int, say: Callable[[str], None]) -> None:
        from pyspark import StorageLevel

        self.spark, self.partitions, self.say = spark, partitions, say
        self.level = StorageLevel.MEMORY_AND_DISK
        self.progress = Progress(spark, say)
        self.persisted: list[Any] = []
        self.outputs: list[Any] = []
        self.result = ReplayResult()
        keys = partition_keys(partitions)
        from pyspark.sql import functions as F

        self.placement = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col("owner") + 1)

    def absorb(self, tagged: Any, label: str, rows_in: int) -> tuple[Any, dict[tuple[int, int], int]]:
        """Run ``tagged`` (persisted for what follows), count its rows by (kind, op), raise its first error.

        The counters are all that comes back to the driver: one row per (kind, operation)."""
        from pyspark.sql import functions as F

        tagged = tagged.persist(self.level)
        self.persisted.append(tagged)
        with self.progress.stage(label):
            totals = (tagged.groupBy("kind", "op")
                      .agg(F.count(F.lit(1)).alias("rows"),
                           F.sum(F.when(F.col("kind") == EVENTS, F.col("hash"))).alias("events"))
                      .collect())
        counts = {(int(r["kind"]), int(r["op"])): int(r["rows"]) for r in totals}
        events = sum(int(r["events"] or 0) for r in totals)
        self.result.events += events
        rows_in = events if rows_in < 0 else rows_in
        if any(kind == ERROR for kind, _ in counts):
            raise ReplayError(tagged.filter(F.col("kind") == ERROR).first()["data"].decode())
        released = sum(n for (kind, _), n in counts.items() if kind == OUT)
        cut = sum(n for (kind, _), n in counts.items() if kind == CUT)
        state = sum(n for (kind, _), n in counts.items() if kind == STATE)
        rejected = sum(n for (kind, _), n in counts.items() if kind == REJECTED)
        self.result.released += released
        self.result.rejected += rejected
        self.result.stages.append(StageCount(label, rows_in, released, cut, state))
        if released:
            self.outputs.append(tagged.filter(F.col("kind") == OUT))
        carried = f", {state} state buckets carried" if state else ""
        refused = f", {rejected} refused by the entry balancing function" if rejected else ""
        self.say(f"replay: {label}: {rows_in} in -> {released} released, {cut} to later stages{carried}{refused}")
        return tagged, counts

    def stage(self, rows: Any) -> Any:
        """Repartition by owner (one hash range per partition) and sort each partition by (owner, meta)."""
        return (rows.repartition(self.partitions, self.placement)
                .sortWithinPartitions("owner", "ts", "front", "trace"))

    def write(self, out: str) -> None:
        from pyspark.sql import functions as F

        if not self.outputs:  # nothing released: still a table, with its schema, that reads back empty
            self.spark.createDataFrame([], OUT_SCHEMA).write.mode("overwrite").parquet(out)
            return
        released = self.outputs[0]
        for df in self.outputs[1:]:
            released = released.unionByName(df)
        with self.progress.stage("writing the released records"):
            (released.select("ts", "trace", F.col("data").cast("string").alias("payload"), "front")
             .sortWithinPartitions("front", "ts", "trace")
             .write.mode("overwrite").partitionBy("front").parquet(out))

    def close(self) -> None:
        for df in self.persisted:
            df.unpersist()


def replay(spark: Any, input_log: str | Path, out: str, *, graph: Graph | None = None,
           ticks: Iterable[Tick] | None = None, snapshot: str | Path | None = None, partitions: int = 2,
           progress: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay the fronts' input log under ``input_log`` into Parquet at ``out``; counters come back.

    ``graph``: one graph over the whole log.  ``ticks``: the cluster's ticks,
    each interval with its own graph and the state handed over between them.
    ``snapshot``: a complete snapshot directory (``DIR/snapshots/<ts>-<front>``)
    whose state the replay starts from, reading only the log at or after its
    boundary.
    """
    from flamestream.spark.source import InputLogSource

    if (graph is None) == (ticks is None):
        raise ValueError("replay needs a graph or the cluster's ticks (exactly one)")
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    start: GlobalTime | None = None
    snapshot_files: list[str] = []
    tick_list = list(ticks) if ticks is not None else None
    if snapshot is not None:
        start, snapshot_files = check_snapshot(spark, Path(snapshot), tick_list)
    check_log(input_log, start)
    if tick_list is not None:
        intervals = intervals_of_ticks(tick_list, after=start)
    else:
        assert graph is not None
        intervals = [Interval(start, None, graph)]
    for interval in intervals:
        grouping_order(compile_graph(interval.graph))  # refuse what cannot run before running anything
    spark.dataSource.register(InputLogSource)
    job = _Job(spark, partitions, say)
    try:
        state: dict[str, list[Any]] = {}
        """Grouping name -> DataFrames of STATE rows for it (op = its index in the graph that produced them)."""
        if snapshot_files:
            first = intervals[0].graph
            paths = spark.createDataFrame([(p,) for p in snapshot_files], "path STRING").repartition(
                len(snapshot_files))
            graph_json = first.to_json()
            loaded = paths.mapInArrow(lambda batches: snapshot_pass(graph_json, partitions, batches), ROW_SCHEMA)
            loaded, _ = job.absorb(loaded, f"snapshot {Path(snapshot or '').name}", len(snapshot_files))
            plan = compile_graph(first)
            state = {plan.names[g]: [loaded.filter(f"kind = {STATE} AND op = {g}")] for g in _groupings(plan)}
        for number, interval in enumerate(intervals, 1):
            if len(intervals) > 1:
                say(f"replay: interval {number}/{len(intervals)} [{_show(interval.start)}, {_show(interval.stop)}) "
                    f"graph {interval.graph.name!r}{'' if interval.carry else ', starting with no state'}")
            nxt = intervals[number] if number < len(intervals) else None
            state = _run_interval(spark, job, input_log, interval, state if interval.carry or number == 1 else {},
                                  nxt)
        job.write(out)
    finally:
        job.close()
    return job.result


def _show(gt: GlobalTime | None) -> str:
    return "…" if gt is None else f"{gt.ts}:{gt.front}"


def _run_interval(spark: Any, job: _Job, input_log: str | Path, interval: Interval,
                  state: dict[str, list[Any]], following: Interval | None) -> dict[str, list[Any]]:
    """The stages of one interval; returns the STATE rows handed to ``following``, by grouping name."""
    from pyspark.sql import functions as F

    plan = compile_graph(interval.graph)
    graph_json = interval.graph.to_json()
    partitions = job.partitions
    reader = (spark.read.format("flamestream-input").option("path", str(input_log))
              .option("minPartitions", str(partitions)))
    if interval.start is not None:
        reader = reader.option("from", _show(interval.start))
    if interval.stop is not None:
        reader = reader.option("until", _show(interval.stop))
    events = reader.load()
    tagged = events.mapInArrow(lambda batches: entry_pass(graph_json, partitions, batches), ROW_SCHEMA)
    tagged, counts = job.absorb(tagged, "stateless pass", -1)
    pending: dict[int, list[Any]] = {}
    _collect(pending, tagged, counts)
    carried_names: dict[str, int] = {}
    if following is not None and following.carry:
        after = compile_graph(following.graph)
        carried_names = {after.names[op]: op for op in _groupings(after)}
    handed: dict[str, list[Any]] = {}
    order = grouping_order(plan)
    done: set[int] = set()
    for number, g in enumerate(order, 1):
        name = plan.names[g]
        pieces = list(pending.pop(g, []))
        restored = state.get(name, [])
        done.add(g)
        if not pieces and not restored:
            continue
        rows_in = sum(n for _, n in pieces)
        inputs = [df for df, _ in pieces] + [df.withColumn("op", F.lit(g).cast("int")) for df in restored]
        union = inputs[0]
        for df in inputs[1:]:
            union = union.unionByName(df)
        carry = {name: carried_names[name]} if name in carried_names else {}
        boundary = following.start if following is not None else None
        stage = job.stage(union).mapInArrow(
            lambda batches, g=g, carry=carry, boundary=boundary: stage_pass(graph_json, g, partitions, carry,
                                                                            boundary, batches), ROW_SCHEMA)
        stage, counts = job.absorb(stage, f"stage {number}/{len(order)} grouping {name!r}", rows_in)
        for kind, op in counts:
            if kind == CUT and op in done:
                raise ReplayError(f"cannot replay in batch: items reach grouping {plan.names[op]!r} again after its "
                                  "stage ran — a cycle crossing a repartition at its input")
        _collect(pending, stage, counts)
        if carry:
            handed[name] = [stage.filter(f"kind = {STATE}")]
    return handed


def _collect(pending: dict[int, list[Any]], tagged: Any, counts: Mapping[tuple[int, int], int]) -> None:
    for (kind, op), n in counts.items():
        if kind == CUT:
            pending.setdefault(op, []).append((tagged.filter(f"kind = {CUT} AND op = {op}"), n))


def check_log(input_log: str | Path, start: GlobalTime | None) -> None:
    """ReplayError unless every front's input log still holds every event from ``start`` on (None: all of them).

    Retention deletes the events below the oldest retained snapshot, so a replay of the whole log, or from a
    snapshot older than what was deleted, would run on part of its input and release a wrong output without a
    word: it is refused, naming the log and where to start instead.
    """
    from flamestream.spark.source import front_logs
    from flamestream.storage.input_log import check_covers
    from flamestream.storage.log import LogError

    for directory in front_logs(input_log).values():
        try:
            check_covers(directory, start)
        except LogError as exc:
            raise ReplayError(str(exc)) from None


def check_snapshot(spark: Any, directory: Path, ticks: list[Tick] | None) -> tuple[GlobalTime, list[str]]:
    """The boundary and files of a complete, intact snapshot directory; ReplayError naming what is wrong."""
    from flamestream.core.meta import boundary_of

    if not directory.is_dir():
        raise ReplayError(f"snapshot {directory} is not a directory")
    try:
        boundary = boundary_of(directory.name)
    except ValueError:
        raise ReplayError(f"snapshot directory {directory} is not named <ts>-<front> (its boundary)") from None
    files = sorted(directory.glob("worker-*.snap"), key=lambda p: _worker_number(p))
    numbers = [_worker_number(p) for p in files]
    if not files:
        raise ReplayError(f"snapshot {directory} holds no worker-<i>.snap file")
    if numbers != list(range(len(files))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise ReplayError(f"snapshot {directory} is incomplete: no file of worker(s) {missing}")
    torn = [p.name for p in directory.glob("worker-*.snap.tmp") if not p.with_suffix("").exists()]
    if torn:
        raise ReplayError(f"snapshot {directory} is incomplete: {', '.join(sorted(torn))} was never finished")
    checked = spark.sparkContext.parallelize([str(p) for p in files], len(files)).map(check_snapshot_file).collect()
    for path, error, ts, front, _tick, worker in checked:
        if error:
            raise ReplayError(f"refusing to replay from a damaged snapshot: {error}")
        if GlobalTime(ts, front) != boundary:
            raise ReplayError(f"snapshot file {path} is of boundary {ts}-{front}, not {directory.name}")
        if worker != _worker_number(Path(path)):
            raise ReplayError(f"snapshot file {path} says it is worker {worker}'s")
    written_by = {tick for _p, _e, _ts, _f, tick, _w in checked}
    if len(written_by) != 1:
        raise ReplayError(f"snapshot {directory} mixes files of ticks {sorted(written_by)}")
    if ticks is not None:
        (number,) = written_by
        tick = next((t for t in ticks if t.number == number), None)
        if tick is not None and tick.layout.workers != len(files):
            raise ReplayError(f"snapshot {directory} is incomplete: {len(files)} files for the "
                              f"{tick.layout.workers} workers of tick {number}")
    return boundary, [str(p) for p in files]


def _worker_number(path: Path) -> int:
    suffix = path.name.removeprefix("worker-").removesuffix(".snap")
    return int(suffix) if suffix.isdigit() else -1
