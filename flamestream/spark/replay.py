"""Batch replay of the fronts' input log on Spark, with the project's own operator code.

The model is deterministic, so replaying the logged events (each with the
global time and trace its front stamped) must release exactly what the stream
released.  The graph compiles into one Spark stage per grouping, in the order
groupings feed each other: a stage repartitions the grouping's whole input by
its balancing hash, sorts each partition by meta and runs the worker core over
it depth-first — global-time order, so nothing is ever replayed — with every
other grouping *cut*: items bound for one are set aside as that grouping's
input.  Each grouping's state therefore lives in exactly one stage.  Stateless
work between groupings needs no partitioning ("free" passes).  A cycle through
one grouping stays inside its stage as long as its items re-enter on the same
partition; a cycle through two groupings, or an item re-entering its grouping
on another partition, crosses a repartition and is refused naming the edge.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import Any

from flamestream.core.barrier import Released
from flamestream.core.front import Stamped
from flamestream.core.graph import Graph
from flamestream.core.item import Envelope, envelope_meta
from flamestream.core.plan import GROUPING, Plan, compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker

Tagged = tuple[str, Any]
"""("out", item) | ("cut", envelope) | ("free", envelope) | ("error", message), what a partition yields."""


class ReplayError(ValueError):
    """The graph cannot run as batch stages; the message names the edge."""


def spark_session(master: str, app: str) -> Any:
    """A SparkSession the way flamestream runs its jobs: UI off, only errors logged."""
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false").config("spark.log.level", "ERROR").getOrCreate())


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


@cache
def _plan(graph_json: str) -> Plan:
    """Each executor compiles the shipped graph once (functions are resolved by import path there)."""
    return compile_graph(Graph.from_json(graph_json))


def free_partition(graph_json: str, envelopes: Iterable[Envelope]) -> Iterator[Tagged]:
    """Stateless work: run until every item reached a sink or a (cut) grouping."""
    plan = _plan(graph_json)
    cut = frozenset(op for op, kind in enumerate(plan.kinds) if kind == GROUPING)
    worker = Worker(plan, 0, Layout.even(1), cut)
    runnable = []
    for env in envelopes:
        if env[0] in cut:
            yield "cut", env
        else:
            runnable.append(env)
    _, sink = worker.process(runnable)
    yield from (("cut", env) for env in worker.cut_off)
    yield from (("out", item) for item in sink)


def stage_partition(graph_json: str, grouping: int, partitions: int, index: int,
                    envelopes: Iterable[Envelope]) -> Iterator[Tagged]:
    """One partition of ``grouping``'s stage, in meta order; other groupings are cut."""
    plan = _plan(graph_json)
    cut = frozenset(op for op, kind in enumerate(plan.kinds) if kind == GROUPING and op != grouping)
    worker = Worker(plan, index, Layout.even(partitions), cut)
    remote, sink = worker.process(sorted(envelopes, key=envelope_meta))
    for envs in remote.values():
        for env in envs:
            if env[0] == grouping:
                yield "error", (f"cannot replay in batch: an item re-enters grouping {plan.names[grouping]!r} "
                                "through its cycle on another partition — a cycle crossing a repartition")
                return
            yield "free", env
    yield from (("cut", env) for env in worker.cut_off)
    yield from (("out", item) for item in sink)


def replay(spark: Any, graph: Graph, stamped: list[Stamped], partitions: int = 2,
           progress: Callable[[str], None] | None = None) -> list[Released]:
    """Run ``graph`` over stamped input events as Spark stages; the released items in meta order."""
    plan = compile_graph(graph)
    order = grouping_order(plan)
    graph_json = graph.to_json()
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    sc = spark.sparkContext
    entry, balance = plan.entry, plan.entry_balance
    free = sc.parallelize([(entry, balance(p), (p, gt, trace, False)) for _f, gt, trace, p in stamped],
                          max(1, partitions))
    pending: dict[int, Any] = {}
    outputs: list[Any] = []
    done: set[int] = set()

    def absorb(tagged: Any, what: str) -> Any:
        tagged = tagged.cache()
        counts = dict(tagged.map(lambda t: ((t[0], t[1][0]) if t[0] in ("cut", "free") else (t[0], -1), 1))
                      .reduceByKey(lambda a, b: a + b).collect())
        errors = tagged.filter(lambda t: t[0] == "error").map(lambda t: t[1]).take(1)
        if errors:
            raise ReplayError(errors[0])
        for (tag, op), _n in counts.items():
            if tag == "cut" and op in done:
                raise ReplayError(f"cannot replay in batch: items reach grouping {plan.names[op]!r} again after its "
                                  "stage ran — a cycle crossing a repartition at its input")
        outputs.append(tagged.filter(lambda t: t[0] == "out").map(lambda t: t[1]))
        for op in {op for (tag, op) in counts if tag == "cut"}:
            part = tagged.filter(lambda t, op=op: t[0] == "cut" and t[1][0] == op).map(lambda t: t[1])
            pending[op] = part if op not in pending else pending[op].union(part)
        say(f"replay: {what}: {sum(n for (tag, _), n in counts.items() if tag == 'out')} released, "
            f"{sum(n for (tag, _), n in counts.items() if tag == 'cut')} to later stages")
        return tagged.filter(lambda t: t[0] == "free").map(lambda t: t[1])

    layout = Layout.even(partitions)
    free = absorb(free.mapPartitions(lambda envs: free_partition(graph_json, envs)), "stateless pass")
    for number, g in enumerate(order, 1):
        if g not in pending:
            done.add(g)
            continue
        keyed = pending.pop(g).map(lambda env: (layout.owner(env[1]), env)).partitionBy(partitions, lambda k: k)
        stage = keyed.values().mapPartitionsWithIndex(
            lambda index, envs, g=g: stage_partition(graph_json, g, partitions, index, envs))
        done.add(g)
        free = absorb(stage, f"stage {number}/{len(order)} grouping {plan.names[g]!r}")
        if not free.isEmpty():
            free = absorb(free.mapPartitions(lambda envs: free_partition(graph_json, envs)), "stateless pass")
    released = [item for rdd in outputs for item in rdd.collect()]
    if any(item[3] for item in released):
        raise AssertionError("batch replay produced a retraction: its input was not in meta order")
    return sorted(((gt, trace, payload) for payload, gt, trace, _ in released), key=lambda r: (r[0], r[1]))


def to_parquet(spark: Any, released: list[Released], out: str) -> None:
    """Write released records as Parquet: ts, front, trace (meta order) and the payload as JSON."""
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

    from flamestream.core.payload import encode_payload

    schema = StructType([StructField("ts", LongType(), False), StructField("front", IntegerType(), False),
                         StructField("trace", ArrayType(LongType(), False), False),
                         StructField("payload", StringType(), False)])
    rows = [(gt.ts, gt.front, list(trace), encode_payload(payload).decode()) for gt, trace, payload in released]
    spark.createDataFrame(rows, schema).write.mode("overwrite").parquet(out)
