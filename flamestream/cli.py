"""The ``flamestream`` command line.

``flamestream run GRAPH --input FILE`` runs a graph on the embedded local
runtime and prints every released record as one JSON line.

The distributed runtime: ``up`` starts a local cluster in the background
(ZooKeeper, acker, workers, fronts, barriers), ``deploy`` publishes a graph to
it, ``push`` sends events, ``consume`` prints released records, ``down``
stops everything.  Commands after ``up`` find the cluster through
``DIR/cluster.json`` (``--data-dir``) or directly through ``--zookeeper``.

Usage errors, bad graphs and bad input print a message and exit with code 2;
a cluster that is not running or fails a request exits with code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from flamestream import cluster_process
from flamestream.client import Client, ClientError, PushResult, Record
from flamestream.cluster import ClusterStore
from flamestream.functions import FunctionRefError
from flamestream.graph import GraphError
from flamestream.heap import tune_gc
from flamestream.loader import load_graph, read_inputs
from flamestream.local import LocalRuntime
from flamestream.oracle import run_oracle


def to_json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, default=repr)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


DEFAULT_DATA_DIR = ".flamestream"


class UsageError(Exception):
    """Bad arguments or input detected after parsing (exit code 2)."""


class NotRunning(Exception):
    """There is no running cluster to talk to (exit code 1)."""


def _positive_number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def seconds(text: str) -> float:
    return _positive_number(text, "a number of seconds")


def rate(text: str) -> float:
    return _positive_number(text, "a rate in events per second")


def cluster_name(text: str) -> str:
    """Checked by the cluster store's own naming rules (constructing one does not connect)."""
    try:
        ClusterStore("unused", cluster=text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """How deploy/push/consume find the cluster: the data directory of `up`, or ZooKeeper directly."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", help=f"data directory of a cluster started by `flamestream up` "
                                          f"(default {DEFAULT_DATA_DIR})")
    where.add_argument("--zookeeper", metavar="HOST:PORT", help="the cluster's ZooKeeper, instead of --data-dir")
    parser.add_argument("--cluster", type=cluster_name, help="cluster name, with --zookeeper (default 'default')")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flamestream", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a graph on the embedded local runtime")
    run.set_defaults(handler=cmd_run)
    run.add_argument("graph", help="Python file defining graph() (and optionally read_input(path))")
    run.add_argument("--input", required=True, help="input file, one event per line ('-' for stdin)")
    run.add_argument("--workers", type=positive, default=2, help="simulated workers (hash ranges), default 2")
    run.add_argument("--fronts", type=positive, default=1, help="simulated fronts, default 1")
    run.add_argument("--seed", type=int, default=0, help="seed of the delivery scheduler, default 0")
    run.add_argument("--batch", type=positive, default=1,
                     help="max events a front injects per step (bursts cause more replays), default 1")
    run.add_argument("--adversarial", action="store_true", help="skew channel speeds to force replays")
    run.add_argument("--oracle", action="store_true", help="run the sequential oracle instead of the runtime")
    run.add_argument("--stats", action="store_true", help="print run statistics as JSON on stderr")

    up = sub.add_parser("up", help="start a local cluster in the background")
    up.set_defaults(handler=cmd_up)
    up.add_argument("--workers", type=positive, default=2, help="worker processes, default 2")
    up.add_argument("--fronts", type=positive, default=1, help="front processes (and barriers, one each), default 1")
    up.add_argument("--guarantees", choices=("exactly-once", "off"), default="exactly-once",
                    help="exactly-once (default) or off: barriers release on arrival, for benchmarks against peers "
                         "without exactly-once")
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                    help=f"state, logs and cluster.json of the cluster (default {DEFAULT_DATA_DIR})")
    up.add_argument("--zookeeper", metavar="HOST:PORT", help="use this ZooKeeper instead of starting one")
    up.add_argument("--cluster", type=cluster_name, default="default", help="cluster name, default 'default'")
    up.add_argument("--timeout", type=seconds, default=cluster_process.DEFAULT_TIMEOUT,
                    help=f"seconds to wait for everything to serve, default {cluster_process.DEFAULT_TIMEOUT:g}")

    down = sub.add_parser("down", help="stop the cluster started by `up`")
    down.set_defaults(handler=cmd_down)
    down.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's data directory "
                                                                   f"(default {DEFAULT_DATA_DIR})")

    deploy = sub.add_parser("deploy", help="run a graph on the cluster from now on")
    deploy.set_defaults(handler=cmd_deploy)
    deploy.add_argument("graph", help="Python file defining graph()")
    add_cluster_arguments(deploy)

    push = sub.add_parser("push", help="push events to the cluster's fronts")
    push.set_defaults(handler=cmd_push)
    push.add_argument("file", nargs="?", default="-", help="one event per line (default: stdin)")
    push.add_argument("--json", action="store_true",
                      help="parse each line as JSON (blank lines are skipped) instead of pushing it as a string")
    push.add_argument("--producer", help="idempotent producer id: pushing the same input again admits nothing twice")
    push.add_argument("--rate", type=float, help="events per second, one per request (default: as fast as possible)")
    add_cluster_arguments(push)

    consume = sub.add_parser("consume", help="print released records as JSON lines, committing as it goes")
    consume.set_defaults(handler=cmd_consume)
    consume.add_argument("--group", default="cli", help="consumer group, resumes where it committed (default cli)")
    consume.add_argument("--limit", type=positive, help="stop after this many records")
    consume.add_argument("--timeout", type=seconds, help="stop after this many seconds without a record")
    consume.add_argument("--meta", action="store_true",
                         help='print {"partition", "offset", "ts", "front", "payload"} instead of the payload')
    add_cluster_arguments(consume)

    replay = sub.add_parser("replay", help="run a graph over the fronts' input log as a Spark job, into Parquet")
    replay.set_defaults(handler=cmd_replay)
    replay.add_argument("--graph", required=True, help="Python file defining graph()")
    replay.add_argument("--input-log", required=True,
                        help="the cluster's data dir (or its input/ dir) holding the fronts' input logs")
    replay.add_argument("--out", required=True, help="output directory for the Parquet files (replaced)")
    replay.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    replay.add_argument("--partitions", type=positive, default=4, help="partitions per stage (default 4)")

    sink = sub.add_parser("sink", help="land the output topic in a table with Spark Structured Streaming")
    sink.set_defaults(handler=cmd_sink)
    sink.add_argument("format", choices=["parquet"], help="table format")
    sink.add_argument("--topic", default=".flamestream", help="the cluster's data dir (default .flamestream)")
    sink.add_argument("--out", required=True, help="Parquet directory")
    sink.add_argument("--checkpoint", help="Spark checkpoint directory (default: OUT/_checkpoint)")
    sink.add_argument("--once", action="store_true", help="land what the topic holds now, then stop")
    sink.add_argument("--max-records-per-trigger", type=positive, help="bound each micro-batch")
    sink.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")

    audit = sub.add_parser("audit", help="compare the output topic with a batch replay (exit 1 when they differ)")
    audit.set_defaults(handler=cmd_audit)
    audit.add_argument("--topic", required=True, help="the cluster's data dir (or its topic/ dir)")
    audit.add_argument("--replay", required=True, help="Parquet directory written by `flamestream replay`")
    audit.add_argument("--show", type=positive, default=10, help="differences to print per side (default 10)")
    bench = sub.add_parser("bench", help="latency and throughput of flamestream and its peers, side by side")
    bench.set_defaults(handler=cmd_bench)
    bench.add_argument("workload", choices=("inverted-index", "wordcount"))
    bench.add_argument("--rate", type=rate, default=None,
                       help="events per second, seeded Poisson (pages/s or lines/s; default 20 pages/s for the "
                            "inverted index, 1000 lines/s for word count)")
    bench.add_argument("--duration", type=seconds, default=10.0, help="seconds of pushing per run (default 10)")
    bench.add_argument("--workers", type=positive, default=2, help="workers of each system (default 2)")
    bench.add_argument("--peers", type=peer_list, default=["spark", "bytewax", "python"],
                       help="comma-separated peers out of spark,bytewax,python, or 'none' (default all three)")
    bench.add_argument("--guarantees", choices=("exactly-once", "off", "both"), default="both",
                       help="run flamestream exactly-once, with guarantees off (barrier releases on arrival), or "
                            "both (default)")
    bench.add_argument("--sweep", type=rate_list, default=[],
                       help="more rates to run, comma-separated: yields each system's max sustainable rate "
                            "(highest rate with p99 < 100 ms)")
    bench.add_argument("--throughput", action="store_true",
                       help="also run each system once as fast as it absorbs (max throughput, ratios to Python "
                            "and Bytewax)")
    bench.add_argument("--rounds", type=positive, default=1, help="interleaved rounds (default 1)")
    bench.add_argument("--seed", type=int, default=1, help="seed of the input and the arrival times (default 1)")
    bench.add_argument("--out", default="bench-results", help="results directory (default bench-results)")
    bench.add_argument("--drain-timeout", type=seconds, default=60.0,
                       help="seconds a run may take after pushing to finish its events (default 60)")
    return parser


def rate_list(text: str) -> list[float]:
    return [rate(part) for part in text.split(",") if part.strip()]


def peer_list(text: str) -> list[str]:
    from flamestream.benchmark.systems import PEERS

    if text == "none":
        return []
    peers = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    return list(dict.fromkeys(peers))


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib.util

    from flamestream.benchmark.suite import OURS_OFF, Options, run_suite
    from flamestream.benchmark.workloads import workload

    needs = {"bytewax": "bytewax", "spark": "pandas"}  # peer -> the module of the `peers` extra it runs on
    missing = [module for peer, module in needs.items()
               if peer in args.peers and importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError(f"peer dependencies missing ({', '.join(missing)}): pip install 'flamestream[peers]', "
                         f"or leave those peers out with --peers")
    try:
        chosen = workload(args.workload)  # fails here, before anything starts, if its input is missing
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    options = Options(workload=args.workload, rate=args.rate or chosen.default_rate, duration=args.duration,
                      workers=args.workers, peers=args.peers, guarantees=args.guarantees, sweep=args.sweep,
                      throughput=args.throughput, rounds=args.rounds, seed=args.seed, out=Path(args.out),
                      drain_timeout=args.drain_timeout)
    directory = run_suite(options, say=lambda line: print(line, file=sys.stderr, flush=True))
    summary = json.loads((directory / "result.json").read_text())
    print(json.dumps({"result": str(directory / "result.json"), "plot": str(directory / "latency.png"),
                      "systems": [{k: s.get(k) for k in ("name", "p50_ms", "p99_ms", "throughput", "correct", "error")}
                                  for s in summary["systems"]]}, indent=2))
    # Guarantees off may release replayed versions: its check is reported, never a failure of the run.
    failed = [s["name"] for s in summary["systems"]
              if s.get("error") or (not s.get("correct") and s["name"] != OURS_OFF)]
    if failed:
        print(f"flamestream: error: {', '.join(failed)} failed or differ from the oracle; see {directory}",
              file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "cluster", None) is not None and args.command != "up" and args.zookeeper is None:
        parser.error("--cluster needs --zookeeper (with --data-dir the cluster name comes from cluster.json)")
    try:
        code: int = args.handler(args)
        return code
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except (UsageError, GraphError, FunctionRefError, OSError) as exc:
        print(f"flamestream: error: {exc}", file=sys.stderr)
        return 2
    except (NotRunning, ClientError) as exc:
        print(f"flamestream: error: {exc}", file=sys.stderr)
        return 1


def cmd_replay(args: argparse.Namespace) -> int:
    from flamestream.input_log import read_input_logs
    from flamestream.replay import ReplayError, replay, spark_session, to_parquet

    graph, _module = load_graph(args.graph)
    source = Path(args.input_log)
    if not source.is_dir():
        raise UsageError(f"--input-log {args.input_log!r} is not a directory")
    stamped = read_input_logs(source)
    if not stamped:
        raise UsageError(f"no input log under {source} (expected front-<id>/ directories, or input/ holding them)")
    spark = spark_session(args.master, "flamestream-replay")
    try:
        released = replay(spark, graph, stamped, partitions=args.partitions)
        to_parquet(spark, released, args.out)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    finally:
        spark.stop()
    print(f"flamestream: replayed {len(stamped)} events -> {len(released)} records in {args.out}", file=sys.stderr)
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from flamestream.replay import spark_session
    from flamestream.spark_source import start_parquet_sink

    if not Path(args.topic).is_dir():
        raise UsageError(f"--topic {args.topic!r} is not a directory")
    checkpoint = args.checkpoint or str(Path(args.out) / "_checkpoint")
    spark = spark_session(args.master, "flamestream-sink")
    try:
        query = start_parquet_sink(spark, args.topic, args.out, checkpoint, available_now=args.once,
                                   max_records=args.max_records_per_trigger)
        print(f"flamestream: landing {args.topic} in {args.out} (checkpoint {checkpoint})", file=sys.stderr)
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from flamestream.audit import audit, replay_records, topic_records
    from flamestream.replay import spark_session

    topic_dir, replay_dir = Path(args.topic), Path(args.replay)
    for flag, path in (("--topic", topic_dir), ("--replay", replay_dir)):
        if not path.is_dir():
            raise UsageError(f"{flag} {str(path)!r} is not a directory")
    topic = topic_records(topic_dir)
    spark = spark_session("local[1]", "flamestream-audit")
    try:
        replayed = replay_records(spark, str(replay_dir))
    finally:
        spark.stop()
    result = audit(topic, replayed)
    print(result.verdict(args.show))
    return 0 if result.equal else 1


def cmd_run(args: argparse.Namespace) -> int:
    graph, module = load_graph(args.graph)
    events = list(read_inputs(module, args.input))
    tune_gc()
    out = sys.stdout
    if args.oracle:
        from flamestream.front import stamp_inputs

        released, rejected = run_oracle(graph, stamp_inputs(events, args.fronts))
        for _gt, payload in released:
            out.write(to_json(payload) + "\n")
        stats: dict[str, Any] = {"released": len(released)}
    else:
        runtime = LocalRuntime(graph, workers=args.workers, fronts=args.fronts, seed=args.seed, batch=args.batch,
                               adversarial=args.adversarial)
        result = runtime.run(events)
        for _gt, _trace, payload in result.output:
            out.write(to_json(payload) + "\n")
        rejected = result.rejected
        stats = {**result.stats.__dict__, "replay_overhead": result.stats.replay_overhead}
    for payload in rejected:
        print(f"flamestream: rejected at the front (balancing function failed): {to_json(payload)}", file=sys.stderr)
    if args.stats:
        print(json.dumps({**stats, "rejected": len(rejected)}), file=sys.stderr)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    try:
        existing = cluster_process.load_state(data_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if existing is not None:
        alive = cluster_process.alive_processes(existing)
        if alive:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
            raise UsageError(f"a cluster is already running in {data_dir}: {names}; "
                             f"stop it first with `flamestream down --data-dir {args.data_dir}`")
        cluster_process.state_path(data_dir).unlink()
        print(f"flamestream: removed the record of an earlier cluster in {data_dir}: none of its processes is "
              "running", file=sys.stderr)
    options = cluster_process.UpOptions(data_dir=data_dir, workers=args.workers, fronts=args.fronts,
                                        zookeeper=args.zookeeper, cluster=args.cluster, timeout=args.timeout,
                                        exactly_once=args.guarantees == "exactly-once")
    try:
        state = cluster_process.start_cluster(options)
    except cluster_process.StartError as exc:
        print(f"flamestream: error: {exc.component} failed to start: {exc.reason}; stopped everything started",
              file=sys.stderr)
        if exc.log is not None:
            print(f"--- last lines of {exc.log} ---\n{cluster_process.log_tail(exc.log)}", file=sys.stderr)
        return 1
    print(cluster_process.format_endpoints(state.endpoints()), flush=True)
    print(f"flamestream: cluster {state.cluster!r} is up; logs in {data_dir / cluster_process.LOG_DIR}; "
          f"stop it with `flamestream down --data-dir {args.data_dir}`", file=sys.stderr)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    try:
        state = cluster_process.load_state(data_dir)
    except ValueError as exc:
        raise NotRunning(str(exc)) from None
    if state is None:
        print(f"flamestream: no cluster is recorded in {data_dir}; nothing to stop", file=sys.stderr)
        return 0
    try:
        busy = cluster_process.stop_cluster(state)
    except cluster_process.StopError as exc:
        raise NotRunning(f"{exc}; {cluster_process.state_path(data_dir)} is kept") from None
    cluster_process.state_path(data_dir).unlink(missing_ok=True)
    print(f"flamestream: stopped cluster {state.cluster!r} ({len(state.processes)} processes)", file=sys.stderr)
    if busy:
        print(f"flamestream: warning: now used by other processes: {', '.join(busy)}", file=sys.stderr)
    return 0


def cluster_address(args: argparse.Namespace) -> tuple[str, str]:
    """(ZooKeeper, cluster name) from --zookeeper/--cluster or from the cluster.json of --data-dir."""
    if args.zookeeper is not None:
        return args.zookeeper, args.cluster or "default"
    data_dir = Path(args.data_dir or DEFAULT_DATA_DIR).resolve()
    path = cluster_process.state_path(data_dir)
    try:
        state = cluster_process.load_state(data_dir)
    except ValueError as exc:
        raise NotRunning(str(exc)) from None
    if state is None:
        raise NotRunning(f"no cluster is running: {path} does not exist (start one with `flamestream up`, "
                         "or pass --zookeeper HOST:PORT)")
    if not cluster_process.alive_processes(state):
        raise NotRunning(f"the cluster recorded in {path} is not running any more; clean up with "
                         "`flamestream down` and start it again with `flamestream up`")
    return state.zookeeper, state.cluster


def cmd_deploy(args: argparse.Namespace) -> int:
    graph, _module = load_graph(args.graph)
    zookeeper, cluster = cluster_address(args)
    with Client(zookeeper, cluster) as client:
        number = client.deploy(graph)
    print(number)
    return 0


def read_events(path: str, as_json: bool) -> list[Any]:
    """Every event of the input, all checked before anything is pushed, so a bad line pushes nothing."""
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    with stream:
        lines = [line.rstrip("\n") for line in stream]
    if not as_json:
        return lines
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{'stdin' if path == '-' else path} line {number} is not valid JSON "
                             f"({exc.msg} at column {exc.colno}); nothing was pushed") from None
    return events


def cmd_push(args: argparse.Namespace) -> int:
    events = read_events(args.file, args.json)
    zookeeper, cluster = cluster_address(args)
    if args.rate is not None and args.rate <= 0:
        raise UsageError(f"--rate must be > 0, got {args.rate}")
    with Client(zookeeper, cluster) as client:
        try:
            if args.rate is None:
                result = client.push(events, producer=args.producer)
            else:
                result = paced_push(client, events, args.producer, args.rate)
        except ClientError as exc:
            if exc.pushed:
                hint = " (push the same input with the same --producer to add the rest exactly once)"
                exc.args = (f"{exc}; {exc.pushed} of {len(events)} events were pushed before the failure"
                            f"{hint if args.producer else ''}",)
            raise
    print(f"pushed {result.events} events ({result.duplicates} duplicates)", file=sys.stderr)
    return 0


def paced_push(client: Client, events: list[Any], producer: str | None, rate: float) -> PushResult:
    """One event per request at ``rate`` events/s: the shape of a live source rather than a bulk load."""
    start = time.monotonic()
    results = []
    for i, event in enumerate(events):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        try:
            results.append(client.push([event], producer=producer))
        except ClientError as exc:
            exc.pushed += i
            raise
    return PushResult(events=sum(r.events for r in results), duplicates=sum(r.duplicates for r in results),
                      times=tuple(t for r in results for t in r.times))


def record_view(record: Record, meta: bool) -> Any:
    if not meta:
        return record.payload
    return {"partition": record.partition, "offset": record.offset, "ts": record.time.ts, "front": record.time.front,
            "payload": record.payload}


def cmd_consume(args: argparse.Namespace) -> int:
    zookeeper, cluster = cluster_address(args)
    count = 0
    with (Client(zookeeper, cluster) as client,
          closing(client.consume_batches(args.group, timeout=args.timeout)) as batches):
        for batch in batches:
            if args.limit is not None:
                batch = batch[:args.limit - count]
            # Printed before committed: a consumer killed in between shows these
            # records again on resume rather than never.  One commit per partition
            # per batch (a partition arrives in order) keeps consuming fast.
            sys.stdout.write("".join(to_json(record_view(r, args.meta)) + "\n" for r in batch))
            sys.stdout.flush()
            for record in {r.partition: r for r in batch}.values():
                client.commit(record)
            count += len(batch)
            if args.limit is not None and count >= args.limit:
                break
    print(f"flamestream: consumed {count} records (group {args.group!r})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
