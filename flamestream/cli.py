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
import codecs
import contextlib
import importlib.util
import io
import itertools
import json
import logging
import math
import os
import shlex
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flamestream import roles
from flamestream.acker.service import STALL_TIMEOUT
from flamestream.client import Client, ClientError, InvalidName, PushResult, Record, StateWarning
from flamestream.cluster import ClusterStore
from flamestream.core.front import Stamped, stamp_inputs
from flamestream.core.functions import Allowed, FunctionRefError
from flamestream.core.graph import GraphError
from flamestream.core.local import Handover, LocalRuntime
from flamestream.core.oracle import run_oracle
from flamestream.core.payload import PayloadError, check_payload, decode_payload, encode_payload, unique_keys
from flamestream.loader import load_graph, read_inputs
from flamestream.runtime import launcher, spares, tls
from flamestream.runtime.heap import tune_gc
from flamestream.runtime.node import add_allow_module_argument, timeout_seconds
from flamestream.runtime.restarts import HANG_TIMEOUT
from flamestream.wire.security import ENV, CredentialsError, find_credentials


def to_json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, default=repr)


def record_text(payload: Any) -> str:
    """What ``consume`` would print for ``payload`` released by a cluster: its record (``encode_payload``: NaN as
    null, a value JSON cannot hold as its repr, an unwritable one as its dead letter), read back.  So ``run``
    never prints invalid JSON, nor dies on an output the cluster writes."""
    return to_json(decode_payload(encode_payload(payload)))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


DEFAULT_DATA_DIR = ".flamestream"
SPARK_COMMANDS = ("replay", "audit", "sink")
"""Commands that need the `spark` extra (nodes and the other commands do not)."""


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


INSECURE_BANNER = """\
flamestream: ****************************************************************************************
flamestream: WARNING: this cluster is INSECURE (--insecure): plaintext gRPC, no authentication, open
flamestream: ZooKeeper ACLs. Whoever reaches its ports or its ZooKeeper can push, read the topic, reset
flamestream: consumer offsets, forge acks and exchanges, or deploy code the nodes will run.
flamestream: For development on a trusted machine only; without --insecure `up` secures the cluster.
flamestream: ****************************************************************************************"""
"""What ``up --insecure`` prints on stderr: loud, since nothing else stops anyone."""


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """How deploy/push/consume find the cluster: the data directory of `up`, or ZooKeeper directly."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", help=f"data directory of a cluster started by `flamestream up` "
                                          f"(default {DEFAULT_DATA_DIR})")
    where.add_argument("--zookeeper", metavar="HOST:PORT", help="the cluster's ZooKeeper, instead of --data-dir")
    parser.add_argument("--cluster", type=cluster_name, help="cluster name, with --zookeeper (default 'default')")
    add_credentials_argument(parser)


def add_credentials_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--credentials", metavar="PATH",
                        help="credentials directory of the cluster (CA, client certificate, tokens: DIR/tls of its "
                             "`up`); default $FLAMESTREAM_CREDENTIALS, else the one the --data-dir cluster recorded, "
                             "else (with --zookeeper) the one its nodes advertise, if readable here")


def credentials_of(args: argparse.Namespace) -> str | None:
    """``--credentials``, else ``$FLAMESTREAM_CREDENTIALS``, else what the data dir's cluster recorded (its
    ``tls_dir``: none for an ``--insecure`` one, whatever an earlier run left in ``DIR/tls``), else ``DIR/tls`` if
    it exists (a data dir copied from the cluster's host, with no cluster.json); None leaves it to the client
    (``Client``: the members' advertisement).  With ``--zookeeper`` only the first two: the data dir then says
    nothing about that cluster."""
    explicit = find_credentials(getattr(args, "credentials", None))
    if explicit is not None:
        return str(explicit)
    if getattr(args, "zookeeper", None) is not None:
        return None
    data_dir = Path(getattr(args, "data_dir", None) or DEFAULT_DATA_DIR).resolve()
    with contextlib.suppress(ValueError):
        state = launcher.load_state(data_dir)
        if state is not None:
            return state.tls_dir or None
    found = find_credentials(None, data_dir)
    return str(found) if found is not None else None


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
    run.add_argument("--redeploy-at", type=int, metavar="N",
                     help="hand over to a new tick at the global time of the N-th event (0-based), as `deploy` does "
                          "on a cluster: the state below it carried over (the output is the same)")
    run.add_argument("--workers-after", type=positive, metavar="M",
                     help="workers of the tick after --redeploy-at (default: --workers)")
    run.add_argument("--stats", action="store_true", help="print run statistics as JSON on stderr")
    add_allow_module_argument(run)

    up = sub.add_parser("up", help="start a local cluster in the background")
    up.set_defaults(handler=cmd_up)
    up.add_argument("--nodes", type=positive, default=2,
                    help="node processes, default 2: node N runs worker N; node 0 also the front, its barrier and "
                         "the acker")
    up.add_argument("--fronts", type=positive, default=1,
                    help="fronts (at most one per node; front F and its barrier run on node F), default 1")
    up.add_argument("--placement", choices=launcher.PLACEMENTS, default="nodes",
                    help="nodes (default): roles share --nodes processes and talk in-process; separate: one process "
                         "per role (slower; kept for comparison)")
    up.add_argument("--snapshot-interval-ms", type=int, default=launcher.DEFAULT_SNAPSHOT_INTERVAL_MS,
                    help="workers snapshot their state below every multiple of this many ms of global time "
                         f"(DIR/snapshots; 0 = off; default {launcher.DEFAULT_SNAPSHOT_INTERVAL_MS})")
    up.add_argument("--log-segment-bytes", type=positive, metavar="BYTES",
                    help="the fronts' input-log segment size; retention deletes whole segments below the oldest "
                         "retained complete snapshot (default 64 MiB)")
    up.add_argument("--memory-budget-mb", type=non_negative, default=0, metavar="MB",
                    help="every worker's memory budget: while a worker's process is resident above it the fronts "
                         "admit nothing (RESOURCE_EXHAUSTED naming it, transient); 0 = none (default)")
    up.add_argument("--log-format", choices=("text", "json"), default="text",
                    help="the nodes' logs (DIR/logs/<node>.log): text (default) or json lines")
    up.add_argument("--guarantees", choices=("exactly-once", "off"), default="exactly-once",
                    help="exactly-once (default) or off: barriers release on arrival, for benchmarks against peers "
                         "without exactly-once")
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                    help=f"state, logs and cluster.json of the cluster (default {DEFAULT_DATA_DIR})")
    up.add_argument("--zookeeper", metavar="HOST:PORT", help="use this ZooKeeper instead of starting one")
    up.add_argument("--cluster", type=cluster_name, default="default", help="cluster name, default 'default'")
    up.add_argument("--timeout", type=seconds, default=launcher.DEFAULT_TIMEOUT,
                    help=f"seconds to wait for everything to serve, default {launcher.DEFAULT_TIMEOUT:g}")
    security = up.add_mutually_exclusive_group()
    security.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                          help="secure the cluster (the default): mTLS between nodes, TLS + role tokens for clients, "
                               "ZooKeeper digest ACLs; credentials go to DIR/tls. --no-tls is --insecure")
    security.add_argument("--insecure", dest="tls", action="store_false",
                          help="development only: plaintext gRPC, no authentication, open ZooKeeper ACLs (says so "
                               "loudly: at up, in every node's log, in status)")
    up.add_argument("--tls-dir", metavar="PATH",
                    help="use and complete this credentials directory instead of DIR/tls, e.g. one holding your own "
                         "ca.pem + ca.key, or prepared nodes/<name>.pem + .key")
    up.add_argument("--no-supervise", dest="supervise", action="store_false",
                    help="do not leave a supervisor running that restarts crashed nodes (it runs by default)")
    up.add_argument("--no-spares", dest="spares", action="store_false",
                    help="the supervisor keeps no warm spare processes (by default a node's restart is a spare "
                         "that has imported everything already, which saves about a second of every recovery)")
    up.add_argument("--hang-timeout", type=timeout_seconds, metavar="S",
                    help="the supervisor kills (SIGKILL) and restarts a node that answered its health check before "
                         f"but not for S seconds; 0 = never (default {HANG_TIMEOUT:g})")
    up.add_argument("--stall-timeout", type=timeout_seconds, metavar="S",
                    help="the acker's node exits, so the cluster recovers, when a global time stays in flight S "
                         f"seconds while the min time does not move (a lost batch); 0 = never (default "
                         f"{STALL_TIMEOUT:g})")
    add_allow_module_argument(up)  # passed on to every node

    node = sub.add_parser("node", help="run one node process hosting the given roles (what `up` starts)",
                          description="Run one node: a process hosting any combination of roles (workers, fronts, "
                                      "barrier partitions, the acker) behind one gRPC server.")
    node.set_defaults(handler=cmd_node)
    roles.add_role_arguments(node)

    down = sub.add_parser("down", help="stop the cluster started by `up`")
    down.set_defaults(handler=cmd_down)
    down.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's data directory "
                                                                   f"(default {DEFAULT_DATA_DIR})")

    status = sub.add_parser("status", help="the processes of the cluster started by `up`, with their restarts")
    status.set_defaults(handler=cmd_status)
    status.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's data directory "
                                                                     f"(default {DEFAULT_DATA_DIR})")

    supervise = sub.add_parser("supervise", help="restart the crashed nodes of a cluster (what `up` leaves running)")
    supervise.set_defaults(handler=cmd_supervise)
    supervise.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's data directory "
                                                                        f"(default {DEFAULT_DATA_DIR})")
    supervise.add_argument("--hang-timeout", type=timeout_seconds, default=HANG_TIMEOUT, metavar="S",
                           help="kill (SIGKILL) and restart a node that answered its health check before but not for "
                                f"S seconds; 0 = never (default {HANG_TIMEOUT:g})")
    supervise.add_argument("--no-spares", dest="spares", action="store_false",
                           help="keep no warm spare process per node (a restart then starts a new interpreter)")

    spare = sub.add_parser("spare")  # the supervisor's warm spares (runtime/spares.py); listed by no help
    spare.set_defaults(handler=cmd_spare)
    spare.add_argument("--data-dir", help="the cluster's directory: only names the process")

    tls_init = sub.add_parser("tls-init", help="create a secured cluster's credentials for nodes started by hand "
                                               "(what `up` does in DIR/tls; docker-compose's tls-init service)")
    tls_init.set_defaults(handler=cmd_tls_init)
    tls_init.add_argument("directory", help="credentials directory; what is already there is kept (bring your own "
                                            "ca.pem + ca.key to have certificates issued by your CA)")
    tls_init.add_argument("--node", action="append", default=[], type=node_host, metavar="NAME[=HOST]",
                          help="issue node NAME's certificate (nodes/NAME.pem) for HOST, its --host (default NAME); "
                               "repeatable. A node without one issues its own at start if it can read ca.key")

    deploy = sub.add_parser("deploy", help="run a graph on the cluster from now on (taking over the running "
                                           "graph's state)")
    deploy.set_defaults(handler=cmd_deploy)
    deploy.add_argument("graph", help="Python file defining graph()")
    deploy.add_argument("--workers", type=positive, help="run on workers 0..N-1 only (default: every registered one)")
    deploy.add_argument("--drop-state", action="store_true",
                        help="allow dropping the state of groupings the new graph no longer has")
    deploy.add_argument("--fresh", action="store_true",
                        help="start with empty state instead of taking it over (when the running tick never ran, "
                             "e.g. its graph could not be loaded, or a grouping's keys mean something else now)")
    deploy.add_argument("--rebalance", action="store_true",
                        help="cut the hash ranges so each worker gets an equal share of the load the workers measured "
                             "(scale always does)")
    add_allow_module_argument(deploy)  # checked here for the message; the nodes check with their own list
    add_cluster_arguments(deploy)

    scale = sub.add_parser("scale", help="change the number of workers of a cluster started by `up`, handing the "
                                         "running graph's state over")
    scale.set_defaults(handler=cmd_scale)
    scale.add_argument("--workers", type=positive, required=True, help="workers (one node each) from now on")
    scale.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's data directory "
                                                                    f"(default {DEFAULT_DATA_DIR})")
    scale.add_argument("--timeout", type=seconds, default=launcher.DEFAULT_TIMEOUT,
                       help=f"seconds to wait for new nodes and for the hand-over, default "
                            f"{launcher.DEFAULT_TIMEOUT:g}")
    add_credentials_argument(scale)

    push = sub.add_parser("push", help="push events to the cluster's fronts")
    push.set_defaults(handler=cmd_push)
    push.add_argument("file", nargs="?", default="-", help="one event per line (default: stdin)")
    push.add_argument("--json", action="store_true",
                      help="parse each line as JSON (blank lines are skipped) instead of pushing it as a string")
    push.add_argument("--producer", help="idempotent producer id: pushing the same input again admits nothing twice")
    push.add_argument("--rate", type=rate, help="events per second, one per request (default: as fast as possible)")
    add_cluster_arguments(push)

    consume = sub.add_parser("consume", help="print released records as JSON lines, committing as it goes")
    consume.set_defaults(handler=cmd_consume)
    consume.add_argument("--group", default="cli", help="consumer group, resumes where it committed (default cli)")
    consume.add_argument("--limit", type=positive, help="stop after this many records")
    consume.add_argument("--timeout", type=seconds, help="stop after this many seconds without a record")
    consume.add_argument("--meta", action="store_true",
                         help='print {"partition", "offset", "ts", "front", "payload"} instead of the payload')
    add_cluster_arguments(consume)

    replay = sub.add_parser("replay", help="run the fronts' input log through the deployed graphs as a Spark job, "
                                           "into Parquet")
    replay.set_defaults(handler=cmd_replay)
    replay.add_argument("--input-log", required=True,
                        help="the cluster's data dir (or its input/ dir) holding the fronts' input logs")
    replay.add_argument("--out", required=True, help="output directory for the Parquet files (replaced)")
    replay.add_argument("--graph", help="Python file defining graph(): replay this one graph over the whole log "
                                        "(default: follow the cluster's ticks, each interval with its own graph)")
    replay.add_argument("--zookeeper", metavar="HOST:PORT",
                        help="the cluster's ZooKeeper, to read its ticks (default: the one INPUT_LOG/cluster.json "
                             "records)")
    replay.add_argument("--cluster", type=cluster_name, help="cluster name, with --zookeeper (default 'default')")
    replay.add_argument("--from-snapshot", metavar="DIR",
                        help="start from this complete snapshot (DATA_DIR/snapshots/<ts>-<front>) and replay only "
                             "the log at or after its boundary")
    replay.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    replay.add_argument("--partitions", type=positive, default=8,
                        help="partitions (hash ranges) per stage (default 8: several per core even out hash ranges "
                             "of uneven load)")
    replay.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark configuration, e.g. spark.executor.memory=2g (repeatable)")

    sink = sub.add_parser("sink", help="land the output topic in a table with Spark Structured Streaming")
    sink.set_defaults(handler=cmd_sink)
    sink.add_argument("format", choices=["parquet"], help="table format")
    sink.add_argument("--topic", default=".flamestream", help="the cluster's data dir (default .flamestream)")
    sink.add_argument("--out", required=True, help="Parquet directory")
    sink.add_argument("--checkpoint", help="Spark checkpoint directory (default: OUT/_checkpoint)")
    sink.add_argument("--once", action="store_true", help="land what the topic holds now, then stop")
    sink.add_argument("--max-records-per-trigger", type=positive, help="bound each micro-batch")
    sink.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    sink.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                      help="Spark configuration (repeatable)")

    audit = sub.add_parser("audit", help="compare the output topic with a batch replay (exit 1 when they differ)")
    audit.set_defaults(handler=cmd_audit)
    audit.add_argument("--topic", required=True, help="the cluster's data dir (or its topic/ dir)")
    audit.add_argument("--replay", required=True, help="Parquet directory written by `flamestream replay`")
    audit.add_argument("--show", type=positive, default=10, help="differences to print per side (default 10)")
    audit.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    audit.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="Spark configuration (repeatable)")
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
    bench.add_argument("--snapshot-interval", type=interval_list, default=[1000], metavar="MS[,MS...]",
                       help="flamestream's snapshot interval in ms (0 = off); several run side by side, the first "
                            "also for the other variants (default 1000)")
    bench.add_argument("--placement", choices=("nodes", "separate", "both"), default="nodes",
                       help="flamestream's processes: nodes (default; co-located roles), separate (a process per "
                            "role), or both, side by side")
    bench.add_argument("--sweep", type=rate_list, default=[],
                       help="more rates to run, comma-separated: yields each system's max sustainable rate "
                            "(highest rate with p99 < 100 ms)")
    bench.add_argument("--throughput", action="store_true",
                       help="also run each system once as fast as it absorbs (max throughput, ratios to Python "
                            "and Bytewax)")
    bench.add_argument("--rounds", type=positive, default=1, help="interleaved rounds (default 1)")
    bench.add_argument("--seed", type=int, default=1, help="seed of the input and the arrival times (default 1)")
    bench.add_argument("--out", default="bench-results", help="results directory (default bench-results)")
    bench.add_argument("--tls", action="store_true",
                       help="also run flamestream exactly-once secured, as `up` runs it by default (reported as "
                            "'flamestream (TLS)'); the other flamestream runs are `up --insecure`")
    bench.add_argument("--drain-timeout", type=seconds, default=60.0,
                       help="seconds a run may take after pushing to finish its events (default 60)")
    return parser


def rate_list(text: str) -> list[float]:
    return [rate(part) for part in text.split(",") if part.strip()]


def interval_list(text: str) -> list[int]:
    try:
        intervals = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated milliseconds such as 1000,0, "
                                         f"got {text!r}") from None
    if any(ms < 0 for ms in intervals):
        raise argparse.ArgumentTypeError(f"intervals must be >= 0 ms, got {text!r}")
    return list(dict.fromkeys(intervals))


def peer_list(text: str) -> list[str]:
    from flamestream.bench.systems import PEERS

    if text == "none":
        return []
    peers = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    return list(dict.fromkeys(peers))


def cmd_bench(args: argparse.Namespace) -> int:

    from flamestream.bench.suite import OURS_OFF, Options, run_suite
    from flamestream.bench.workloads import workload

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
                      workers=args.workers, peers=args.peers, guarantees=args.guarantees, placement=args.placement,
                      snapshot_intervals=args.snapshot_interval,
                      sweep=args.sweep,
                      throughput=args.throughput, rounds=args.rounds, seed=args.seed, out=Path(args.out),
                      drain_timeout=args.drain_timeout, tls=args.tls)
    directory = run_suite(options, say=lambda line: print(line, file=sys.stderr, flush=True))
    summary = json.loads((directory / "result.json").read_text())
    plot = directory / "latency.png"
    print(json.dumps({"result": str(directory / "result.json"), "plot": str(plot) if plot.exists() else None,
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
    if args.command in SPARK_COMMANDS and importlib.util.find_spec("pyspark") is None:
        print(f"flamestream: error: `{args.command}` runs on Spark, which is not installed: "
              "pip install 'flamestream[spark]'", file=sys.stderr)
        return 2
    try:
        code: int = args.handler(args)
        return code
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except (UsageError, GraphError, FunctionRefError, OSError, InvalidName, CredentialsError) as exc:
        print(f"flamestream: error: {exc}", file=sys.stderr)
        return 2
    except (NotRunning, ClientError) as exc:
        print(f"flamestream: error: {exc}", file=sys.stderr)
        return 1


def cmd_replay(args: argparse.Namespace) -> int:
    from flamestream.spark.replay import ReplayError, parse_conf, read_ticks, replay, spark_session
    from flamestream.spark.source import front_logs

    source = Path(args.input_log)
    if not source.is_dir():
        raise UsageError(f"--input-log {args.input_log!r} is not a directory")
    if not front_logs(source):
        raise UsageError(f"no input log under {source} (expected front-<id>/ directories, or input/ holding them)")
    if args.graph is not None and args.zookeeper is not None:
        raise UsageError("--graph replays one graph over the whole log; --zookeeper reads the cluster's ticks "
                         "instead: give one of them")
    conf = parse_conf(args.conf)
    graph, ticks = None, None
    if args.graph is not None:
        graph, _module = load_graph(args.graph)
    else:
        zookeeper, cluster = args.zookeeper, args.cluster or "default"
        if zookeeper is None:
            state = None
            for data_dir in (source, source.parent):
                try:
                    state = state or launcher.load_state(data_dir.resolve())
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
            if state is None:
                raise UsageError(f"no --graph, and no cluster.json in {source} to find the cluster's ticks: pass "
                                 "--graph FILE to replay one graph, or --zookeeper HOST:PORT [--cluster NAME]")
            zookeeper, cluster = state.zookeeper, state.cluster
        try:
            ticks = read_ticks(zookeeper, cluster)
        except Exception as exc:  # unreachable ZooKeeper (kazoo's timeout), malformed ticks
            raise NotRunning(f"cannot read the ticks of cluster {cluster!r} from ZooKeeper {zookeeper}: {exc}; "
                             "pass --graph FILE to replay one graph instead") from None
    spark = spark_session(args.master, "flamestream-replay", conf)
    try:
        result = replay(spark, source, args.out, graph=graph, ticks=ticks, snapshot=args.from_snapshot,
                        partitions=args.partitions)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    finally:
        spark.stop()
    print(f"flamestream: replayed {result.events} events -> {result.released} records in {args.out}",
          file=sys.stderr)
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from flamestream.spark.replay import parse_conf, spark_session
    from flamestream.spark.source import start_parquet_sink

    if not Path(args.topic).is_dir():
        raise UsageError(f"--topic {args.topic!r} is not a directory")
    checkpoint = args.checkpoint or str(Path(args.out) / "_checkpoint")
    spark = spark_session(args.master, "flamestream-sink", parse_conf(args.conf))
    try:
        query = start_parquet_sink(spark, args.topic, args.out, checkpoint, available_now=args.once,
                                   max_records=args.max_records_per_trigger)
        print(f"flamestream: landing {args.topic} in {args.out} (checkpoint {checkpoint})", file=sys.stderr)
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from flamestream.spark.audit import audit_spark
    from flamestream.spark.replay import parse_conf, spark_session

    topic_dir, replay_dir = Path(args.topic), Path(args.replay)
    for flag, path in (("--topic", topic_dir), ("--replay", replay_dir)):
        if not path.is_dir():
            raise UsageError(f"{flag} {str(path)!r} is not a directory")
    spark = spark_session(args.master, "flamestream-audit", parse_conf(args.conf))
    try:
        result = audit_spark(spark, topic_dir, replay_dir, show=args.show)
    finally:
        spark.stop()
    print(result.verdict(args.show))
    return 0 if result.equal else 1


def cmd_run(args: argparse.Namespace) -> int:
    graph, module = load_graph(args.graph, Allowed.of(args.allow_module))
    try:
        events = list(read_inputs(module, args.input))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{args.input} is not valid {exc.encoding} ({exc.reason})") from None
    tune_gc()
    out = sys.stdout
    stamped = stamp_inputs(events, args.fronts)
    handovers = _handovers(args, stamped)
    if args.oracle:
        released, rejected = run_oracle(graph, stamped)
        for _gt, payload in released:
            out.write(record_text(payload) + "\n")
        stats: dict[str, Any] = {"released": len(released)}
    else:
        runtime = LocalRuntime(graph, workers=args.workers, fronts=args.fronts, seed=args.seed, batch=args.batch,
                               adversarial=args.adversarial, handovers=handovers)
        result = runtime.run_stamped(stamped)
        for _gt, _trace, payload in result.output:
            out.write(record_text(payload) + "\n")
        rejected = result.rejected
        stats = {**asdict(result.stats), "replay_overhead": result.stats.replay_overhead}
    for payload in rejected:
        print(f"flamestream: rejected at the front (invalid payload, or the balancing function failed): "
              f"{record_text(payload)}", file=sys.stderr)
    if args.stats:
        print(json.dumps({**stats, "rejected": len(rejected)}), file=sys.stderr)
    return 0


def _handovers(args: argparse.Namespace, stamped: list[Stamped]) -> list[Handover]:
    """``run --redeploy-at N [--workers-after M]``: one hand-over at the N-th event's global time."""
    if args.redeploy_at is None:
        if args.workers_after is not None:
            raise UsageError("--workers-after needs --redeploy-at")
        return []
    if args.oracle:
        raise UsageError("--redeploy-at runs the local runtime; the oracle has no ticks")
    if not 0 <= args.redeploy_at < len(stamped):
        raise UsageError(f"--redeploy-at {args.redeploy_at}: the input has {len(stamped)} events (0-based index)")
    return [Handover(stamped[args.redeploy_at][1], args.workers_after or args.workers)]


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    try:
        existing = launcher.load_state(data_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if existing is not None:
        alive = launcher.alive_processes(existing)
        if alive:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
            raise UsageError(f"a cluster is already running in {data_dir}: {names}; "
                             f"stop it first with `flamestream down --data-dir {args.data_dir}`")
        launcher.state_path(data_dir).unlink()
        print(f"flamestream: removed the record of an earlier cluster in {data_dir}: none of its processes is "
              "running", file=sys.stderr)
    if args.tls_dir and not args.tls:
        raise UsageError("--tls-dir gives the credentials of a secured cluster; --insecure has none")
    options = launcher.UpOptions(data_dir=data_dir, nodes=args.nodes, fronts=args.fronts,
                                 placement=args.placement, log_format=args.log_format,
                                 snapshot_interval_ms=args.snapshot_interval_ms,
                                 log_segment_bytes=args.log_segment_bytes, zookeeper=args.zookeeper,
                                 cluster=args.cluster, timeout=args.timeout,
                                 exactly_once=args.guarantees == "exactly-once",
                                 allow_modules=tuple(args.allow_module), supervise=args.supervise, spares=args.spares,
                                 hang_timeout=args.hang_timeout, stall_timeout=args.stall_timeout,
                                 memory_budget_mb=args.memory_budget_mb,
                                 tls_dir=Path(args.tls_dir or data_dir / "tls") if args.tls else None)
    try:
        launcher.plan_nodes(options.nodes, options.fronts, options.placement)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        state = launcher.start_cluster(options)
    except launcher.StartError as exc:
        print(f"flamestream: error: {exc.component} failed to start: {exc.reason}; stopped everything started",
              file=sys.stderr)
        for log in exc.logs:
            print(f"--- last lines of {log} ---\n{launcher.log_tail(log)}", file=sys.stderr)
        return 1
    print(launcher.format_endpoints(state.endpoints()), flush=True)
    if state.tls_dir:
        print(f"flamestream: secured (mTLS, role tokens, ZooKeeper ACLs); credentials in {state.tls_dir}: the CLI "
              f"finds them through --data-dir, the SDK on this host through the nodes; elsewhere, with a copy:\n"
              f"export {ENV}={shlex.quote(state.tls_dir)}", file=sys.stderr)
    else:
        print(INSECURE_BANNER, file=sys.stderr)
    print(f"flamestream: cluster {state.cluster!r} is up; logs in {data_dir / launcher.LOG_DIR}; "
          f"stop it with `flamestream down --data-dir {args.data_dir}`", file=sys.stderr)
    return 0


def node_host(text: str) -> tuple[str, str]:
    name, _, host = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME or NAME=HOST, got {text!r}")
    return name, host or name


def cmd_tls_init(args: argparse.Namespace) -> int:
    try:
        directory = tls.init(Path(args.directory), args.node)
    except ValueError as exc:  # a node certificate without the CA key to issue it
        raise UsageError(str(exc)) from None
    print(f"flamestream: credentials in {directory} (nodes: --tls-dir {directory}; clients: "
          f"export {ENV}={shlex.quote(str(directory))})", file=sys.stderr)
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    try:
        roles.check(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return roles.main(args)


def _recorded(args: argparse.Namespace) -> tuple[Path, launcher.ClusterState | None]:
    """``--data-dir`` and the cluster recorded there (None: none is); a damaged record is NotRunning."""
    data_dir = Path(args.data_dir).resolve()
    try:
        return data_dir, launcher.load_state(data_dir)
    except ValueError as exc:
        raise NotRunning(str(exc)) from None


def cmd_down(args: argparse.Namespace) -> int:
    data_dir, state = _recorded(args)
    if state is None:
        print(f"flamestream: no cluster is recorded in {data_dir}; nothing to stop", file=sys.stderr)
        return 0
    try:
        busy = launcher.stop_cluster(state, data_dir)
    except launcher.StopError as exc:
        raise NotRunning(f"{exc}; {launcher.state_path(data_dir)} is kept") from None
    launcher.state_path(data_dir).unlink(missing_ok=True)
    print(f"flamestream: stopped cluster {state.cluster!r} ({len(state.processes)} processes)", file=sys.stderr)
    if busy:
        print(f"flamestream: warning: now used by other processes: {', '.join(busy)}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    data_dir, state = _recorded(args)
    if state is None:
        raise NotRunning(f"no cluster is recorded in {data_dir}")
    rows = [(p.name, p.role, str(p.pid), _liveness(p, state.tls_dir), f"restarts {p.restarts}", p.address or "-")
            for p in state.processes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    security = f"secured, credentials in {state.tls_dir}" if state.tls_dir else "INSECURE: plaintext, no authentication"
    print(f"cluster {state.cluster!r} (ZooKeeper {state.zookeeper}; {security})")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _liveness(process: launcher.ProcessRecord, tls_dir: str | None) -> str:
    """``gone``, ``running`` (no health service: ZooKeeper, the supervisor), or a node's gRPC health: a node whose
    role failed is alive but ``NOT_SERVING``, which ``running`` alone hid."""
    if not launcher.is_alive(process.pid, process.started):
        return "gone"
    if process.role != launcher.NODE or not process.address:
        return "running"
    return launcher.health_status(process.address, tls_dir)


def cmd_spare(_args: argparse.Namespace) -> int:
    """Wait, with every service imported, for the command line of the node this process is to become."""
    command = spares.receive()
    return 0 if command is None else main(command)


def cmd_supervise(args: argparse.Namespace) -> int:
    from flamestream.runtime import restarts

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return restarts.supervise(Path(args.data_dir).resolve(), args.hang_timeout, args.spares)


def cluster_address(args: argparse.Namespace) -> tuple[str, str]:
    """(ZooKeeper, cluster name) from --zookeeper/--cluster or from the cluster.json of --data-dir."""
    if args.zookeeper is not None:
        return args.zookeeper, args.cluster or "default"
    data_dir = Path(args.data_dir or DEFAULT_DATA_DIR).resolve()
    path = launcher.state_path(data_dir)
    try:
        state = launcher.load_state(data_dir)
    except ValueError as exc:
        raise NotRunning(str(exc)) from None
    if state is None:
        raise NotRunning(f"no cluster is running: {path} does not exist (start one with `flamestream up`, "
                         "or pass --zookeeper HOST:PORT)")
    if not launcher.alive_processes(state):
        raise NotRunning(f"the cluster recorded in {path} is not running any more; clean up with "
                         "`flamestream down` and start it again with `flamestream up`")
    return state.zookeeper, state.cluster


def cmd_scale(args: argparse.Namespace) -> int:
    """Start or stop worker nodes and hand the running graph over to the new layout."""
    data_dir = Path(args.data_dir).resolve()
    zookeeper, cluster = cluster_address(argparse.Namespace(zookeeper=None, cluster=None, data_dir=args.data_dir))
    state = launcher.load_state(data_dir)
    assert state is not None  # cluster_address checked it
    workers = {index: record for record in state.processes for role, name in record.members if role == "worker"
               for index in [int(name.removeprefix("worker"))]}
    if sorted(workers) != list(range(len(workers))):
        raise UsageError(f"the cluster in {data_dir} runs workers {sorted(workers)}: scale needs 0..N-1")
    started = [launcher.NodePlan(f"{launcher.NODE}{k}", worker=k) for k in range(len(workers), args.workers)]
    try:
        launcher.add_nodes(data_dir, state, started, args.timeout)
    except launcher.StartError as exc:
        raise NotRunning(f"{exc.component} failed to start: {exc.reason}") from None
    with Client(zookeeper, cluster, credentials=credentials_of(args)) as client:
        tick = client.rescale(args.workers)
        waited = client.wait_handover(tick, args.timeout)
    leaving = [record for k, record in workers.items() if k >= args.workers
               and all(role == "worker" for role, _ in record.members)]
    launcher.remove_nodes(data_dir, state, leaving)
    print(tick)
    print(f"flamestream: tick {tick} runs {args.workers} workers (started {len(started)} nodes, stopped "
          f"{len(leaving)}); the state was handed over {waited:.2f}s after it was published", file=sys.stderr)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    graph, _module = load_graph(args.graph, Allowed.of(args.allow_module))
    zookeeper, cluster = cluster_address(args)
    with Client(zookeeper, cluster, credentials=credentials_of(args)) as client:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", StateWarning)
            number = client.deploy(graph, workers=args.workers, drop_state=args.drop_state,
                                   rebalance=args.rebalance, allow_modules=args.allow_module, fresh=args.fresh)
        for warning in said:  # a StateWarning in one line, like the errors; any other as Python shows it
            if issubclass(warning.category, StateWarning):
                print(f"flamestream: warning: {warning.message}", file=sys.stderr)
            else:
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
        client.wait_handover(number)
    print(number)
    return 0


READ_SIZE = 1 << 20
"""Bytes read from the input at once at most: from a pipe a read returns only what has been written so far."""


def read_lines(path: str) -> Iterator[list[str]]:
    """The input's lines (without their newline), in batches of those that arrived together, as they arrive.

    Each read takes only what is there, so ``tail -f log | flamestream push``
    sees every line as soon as it is written, while a burst or a file still
    comes in large batches.  Lines are split as Python reads text: a file as
    UTF-8 with universal newlines (``\\r\\n`` and ``\\r`` end lines too),
    stdin in its own encoding at ``\\n`` only.
    """
    if path == "-":
        source = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)  # noqa: SIM115
        encoding, errors = sys.stdin.encoding, sys.stdin.errors or "strict"
    else:
        source = open(path, "rb", buffering=0)  # noqa: SIM115
        encoding, errors = "utf-8", "strict"
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder(encoding)(errors), translate=path != "-")
    pending = ""  # the start of a line whose newline has not arrived yet
    with source:
        while chunk := source.read(READ_SIZE):
            *lines, pending = (pending + decoder.decode(chunk)).split("\n")
            if lines:
                yield lines
    *lines, pending = (pending + decoder.decode(b"", final=True)).split("\n")
    if pending:  # the last line had no newline
        lines.append(pending)
    if lines:
        yield lines


def read_events(path: str, as_json: bool) -> Iterator[tuple[int, list[Any], list[int]]]:
    """(number of its last line, events, the line of each event) of each batch of ``read_lines``, checked whole
    before it is yielded.

    So a bad line stops the push with nothing of its batch pushed, only the
    batches before it (none, when the input was written at once).  Checked as
    the front checks (``check_payload``), so a line the cluster would refuse is
    named by its number here, in one line, before anything of its batch is sent;
    undecodable input is named the same way instead of a traceback.
    """
    where = input_name(path)
    number = 0
    try:
        for lines in read_lines(path):
            numbered = json_events(lines, number + 1, where) if as_json else plain_events(lines, number + 1, where)
            number += len(lines)
            yield number, [event for _, event in numbered], [line for line, _ in numbered]
    except UnicodeDecodeError as exc:
        # The batch that failed to decode starts after line ``number``; its newlines before the bad byte
        # say which line holds it.
        line = number + 1 + bytes(exc.object[:exc.start]).count(b"\n")
        raise UsageError(f"{where} line {line} is not valid {exc.encoding} ({exc.reason}: "
                         f"byte {bytes(exc.object[exc.start:exc.start + 1]).hex()})") from None


def input_name(path: str) -> str:
    """How messages name the input ``path`` (``-``: standard input)."""
    return "stdin" if path == "-" else path


def plain_events(lines: list[str], first: int, where: str) -> list[tuple[int, str]]:
    """(number, line) of each line, each line an event; a line the front would refuse (a lone surrogate:
    undecodable bytes read with ``surrogateescape``) is a usage error naming it."""
    for number, line in enumerate(lines, first):
        fault = check_payload(line)
        if fault is not None:
            raise UsageError(f"{where} line {number}: {fault} (undecodable bytes in the input?)")
    return list(enumerate(lines, first))


def json_events(lines: list[str], first: int, where: str) -> list[tuple[int, Any]]:
    """(number, JSON value) of each line but the blank ones; ``first`` is the number of the first line."""
    events = []
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            event = json.loads(line, object_pairs_hook=unique_keys)
        except PayloadError as exc:  # a key twice in one object
            raise UsageError(f"{where} line {number}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where} line {number} is not valid JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:  # an integer too long; nesting too deep for the parser
            raise UsageError(f"{where} line {number} is not valid JSON ({type(exc).__name__}: {exc})") from None
        fault = check_payload(event)
        if fault is not None:
            raise UsageError(f"{where} line {number}: {fault}")
        events.append((number, event))
    return events


@dataclass
class Pushed:
    """What a push has delivered so far: its summary, and how far it got when it fails."""

    events: int = 0
    duplicates: int = 0
    lines: int = 0
    """Input lines (blank ones included) whose events have all been pushed."""

    def add(self, result: PushResult) -> None:
        self.events += result.events
        self.duplicates += result.duplicates


def cmd_push(args: argparse.Namespace) -> int:
    """Push each batch of lines as soon as it is read, so a live source (a pipe that stays open) is delivered live.

    With ``--producer`` the client numbers the events across the batches, so
    the sequences are those of one push of the whole input.
    """
    batches = read_events(args.file, args.json)
    pushed = Pushed()
    pushing: list[int] = []  # the input line of each event of the push under way
    pacer = None if args.rate is None else Pacer(args.rate)
    try:
        # The first batch is read before the cluster is looked up: bad input is reported as such, cluster or not.
        first = next(batches, None)
        zookeeper, cluster = cluster_address(args)
        with Client(zookeeper, cluster, credentials=credentials_of(args)) as client:
            for lines, events, numbers in batches if first is None else itertools.chain([first], batches):
                if pacer is None:
                    pushing = numbers
                    pushed.add(client.push(events, producer=args.producer))
                else:
                    arrived = time.monotonic()
                    for event, number in zip(events, numbers, strict=True):
                        pushing = [number]
                        pacer.wait(arrived)
                        pushed.add(client.push([event], producer=args.producer))
                pushed.lines = lines
    except UsageError as exc:  # a bad line
        after = f" after line {pushed.lines}" if pushed.lines else ""
        exc.args = (f"{exc}; nothing{after} was pushed",)
        raise
    except ClientError as exc:
        if exc.event is not None and exc.code is not None:  # a front refused one event: name its input line
            exc.args = (f"{input_name(args.file)} line {pushing[exc.event]} was refused ({exc.code.name}): "
                        f"{exc.reason}",)
        done = pushed.events + exc.pushed
        if done:
            hint = " (push the same input with the same --producer to add the rest exactly once)"
            exc.args = (f"{exc}; {done} events were pushed before the failure{hint if args.producer else ''}",)
        raise
    print(f"pushed {pushed.events} events ({pushed.duplicates} duplicates)", file=sys.stderr)
    return 0


class Pacer:
    """``--rate``: events ``1 / rate`` seconds apart, one per request, the shape of a live source.

    An event is due the later of ``1 / rate`` after the previous one and when
    it was read: time lost pushing is caught up (events read in advance keep
    their schedule), but input that stalled is not followed by a burst.
    """

    def __init__(self, rate: float) -> None:
        self.interval = 1 / rate
        self.due = -math.inf

    def wait(self, arrived: float) -> None:
        """Sleep until the next event, read at ``arrived`` (``time.monotonic``), is due."""
        self.due = max(self.due + self.interval, arrived)
        time.sleep(max(0.0, self.due - time.monotonic()))


def record_view(record: Record, meta: bool) -> Any:
    if not meta:
        return record.payload
    return {"partition": record.partition, "offset": record.offset, "ts": record.time.ts, "front": record.time.front,
            "payload": record.payload}


def cmd_consume(args: argparse.Namespace) -> int:
    zookeeper, cluster = cluster_address(args)
    count = 0
    with (Client(zookeeper, cluster, credentials=credentials_of(args)) as client,
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
