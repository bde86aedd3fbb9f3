"""``flamestream node``: which roles one node process hosts, from its command line.

The node itself (``flamestream.runtime.node``) knows roles only through their
protocol; this module is the one place that builds the service packages'
roles from flags, so the runtime never imports a service and services never
import each other.  A node may host any combination of one worker, one front,
a barrier for any partitions and the acker: ``--worker 0 --front 0 --barrier 0
--acker`` is a whole cluster in one process.  One worker and one front at
most, because a node is one address: one place in the hash space and one
source of global times.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from flamestream.acker.service import STALL_TIMEOUT, AckerRole
from flamestream.barrier.service import BarrierRole
from flamestream.cluster import ClusterStore
from flamestream.core.functions import Allowed, set_process_policy
from flamestream.core.hashing import INT32_MAX
from flamestream.core.tick import weight_fault
from flamestream.fronts.service import MAX_IN_FLIGHT_EVENTS, MAX_PUSH_BYTES, SEGMENT_BYTES, SEND_WINDOW_BYTES, FrontRole
from flamestream.runtime import hosting, logs, tls
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.node import Node, Role, add_arguments, timeout_seconds
from flamestream.wire.security import Credentials
from flamestream.workers.service import MAX_SNAPSHOT_STRIDE, SNAPSHOT_CPU_SHARE, WorkerRole


def _count(low: int, what: str) -> Callable[[str], int]:
    """An argparse type for integers from ``low`` to INT32_MAX (ids travel as int32s)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= INT32_MAX:
            raise argparse.ArgumentTypeError(f"{what} must be in {low}..{INT32_MAX}, got {value}")
        return value

    return parse


def _stride(text: str) -> int:
    """An argparse type for a snapshot stride: a power of two from 1 to 64 (so the strides of workers meet)."""
    value = _count(1, "--snapshot-max-stride")(text)
    if value > 64 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"--snapshot-max-stride must be a power of two from 1 to 64, got {value}")
    return value


SHARED_NODE_WEIGHT = 0.5
"""Default ``--worker-weight`` of a worker whose node also hosts a front, the acker or a barrier (1 otherwise): its
share of the hash space relative to the other workers' (``Layout.weighted``, read by ``deploy``).  Why: that node
does the front's, the acker's and the barrier's work for every record besides its worker's, and under load it fell
behind first.  The index at 80 pages/s on two nodes, five rounds in turns, worker 0 (beside the other roles) with 35 %
of the hash space against half: p50 21-27 against 24-29 ms (median 23.1 against 28.0), p99 139-254 against 224-313
(median 191 against 280); at 40 pages/s and below it made no difference."""


def _number(text: str) -> float:
    """``text`` as a float, or the argparse error that it is not a number."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _weight(text: str) -> float:
    """An argparse type for ``--worker-weight`` (``tick.weight_fault``)."""
    value = _number(text)
    fault = weight_fault(value)
    if fault is not None:
        raise argparse.ArgumentTypeError(fault)
    return value


def worker_weight(args: argparse.Namespace) -> float:
    """The worker's weight: ``--worker-weight``, else ``SHARED_NODE_WEIGHT`` beside another role, else 1."""
    if args.worker_weight is not None:
        return float(args.worker_weight)
    return SHARED_NODE_WEIGHT if args.front is not None or args.barrier or args.acker else 1.0


def _share(text: str) -> float:
    """An argparse type for a share of the CPU: a number above 0, at most 1."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a share must be above 0 and at most 1, got {text}")
    return value


def _partitions(text: str) -> tuple[int, ...]:
    try:
        partitions = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated front ids such as 0,1, got {text!r}") from None
    if partitions[0] < 0:
        raise argparse.ArgumentTypeError(f"partitions are front ids and cannot be negative, got {text!r}")
    return tuple(partitions)


def add_role_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    roles = parser.add_argument_group("roles (any combination, at least one)")
    roles.add_argument("--worker", type=_count(0, "worker index"), metavar="I",
                       help="host worker I (hash range I of the tick's layout); with --data-dir it writes snapshots "
                            "and can take part in hand-overs")
    roles.add_argument("--front", type=_count(0, "front id"), metavar="F",
                       help="host front F (the front part of global times); needs --data-dir")
    roles.add_argument("--barrier", type=_partitions, metavar="P[,P...]",
                       help="host the barrier of these partitions (partition F is front F's output); needs --data-dir")
    roles.add_argument("--acker", action="store_true", help="host the cluster's acker")
    worker = parser.add_argument_group("worker options")
    worker.add_argument("--batch-items", type=_count(1, "--batch-items"), default=256,
                        help="most items per outgoing message; a step ships its output whenever this many are "
                             "pending, so receivers start on it while the step runs on (default 256)")
    worker.add_argument("--worker-weight", type=_weight, default=None, metavar="W",
                        help="the worker's share of the hash space relative to the other workers' (0.01-100), read "
                             f"at each deploy; default {SHARED_NODE_WEIGHT:g} if this node also hosts a front, the "
                             "acker or a barrier, else 1")
    worker.add_argument("--linger-ms", type=float, default=0.0,
                        help="wait this long after input arrives to gather more before a step (default 0)")
    worker.add_argument("--snapshot-interval-ms", type=_count(0, "--snapshot-interval-ms"), default=1000,
                        help="write the grouping state below every multiple of this many ms of global time once "
                             "the min time passes it (DIR/snapshots; needs --data-dir); 0 = off (default 1000)")
    worker.add_argument("--snapshot-retention", type=_count(1, "--snapshot-retention"), default=2,
                        help="complete snapshots kept; older ones are deleted (default 2)")
    worker.add_argument("--snapshot-cpu-share", type=_share, default=SNAPSHOT_CPU_SHARE, metavar="SHARE",
                        help="a worker whose last periodic snapshot took more CPU than this share of the interval "
                             "skips boundaries, up to --snapshot-max-stride - 1 in a row (default "
                             f"{SNAPSHOT_CPU_SHARE:g})")
    worker.add_argument("--snapshot-max-stride", type=_stride, default=MAX_SNAPSHOT_STRIDE, metavar="N",
                        help="take a periodic snapshot at least below every N-th boundary, whatever it costs: a "
                             "recovery re-sends the input since the last complete one; a power of two, higher "
                             f"saves CPU, lower shortens recoveries (default {MAX_SNAPSHOT_STRIDE})")
    worker.add_argument("--memory-budget-mb", type=_count(0, "--memory-budget-mb"), default=0, metavar="MB",
                        help="while the process is resident above this, the fronts admit nothing (pushes wait, then "
                             "get RESOURCE_EXHAUSTED naming the worker) until it is back under 90%% of it; 0 = no "
                             "budget (default)")
    front = parser.add_argument_group("front options")
    front.add_argument("--report-interval-ms", type=_count(1, "--report-interval-ms"), default=5,
                       help="how often to report the front's time to the acker, default 5")
    front.add_argument("--max-event-bytes", type=_count(1, "--max-event-bytes"), default=1 << 20,
                       help="largest event accepted, default 1048576")
    front.add_argument("--log-segment-bytes", type=_count(1, "--log-segment-bytes"), default=SEGMENT_BYTES,
                       help="input-log segment size; retention deletes whole segments below the oldest retained "
                            f"complete snapshot (default {SEGMENT_BYTES})")
    front.add_argument("--max-push-bytes", type=_count(1, "--max-push-bytes"), default=MAX_PUSH_BYTES,
                       help=f"largest Push request accepted (RESOURCE_EXHAUSTED above it), default {MAX_PUSH_BYTES}")
    front.add_argument("--max-in-flight-events", type=_count(1, "--max-in-flight-events"),
                       default=MAX_IN_FLIGHT_EVENTS,
                       help="admitted events not yet complete before pushes wait, then get RESOURCE_EXHAUSTED "
                            f"(backpressure), default {MAX_IN_FLIGHT_EVENTS}")
    front.add_argument("--send-at-once", action="store_true",
                       help="send every push to the workers at once instead of pacing them: at most "
                            f"{SEND_WINDOW_BYTES} bytes of events in flight, later pushes logged and acknowledged, "
                            "then sent in chunks as the min time passes the earlier ones (pacing keeps bursts from "
                            "making the groupings replay; off is for tests that hold the min time)")
    acker = parser.add_argument_group("acker options")
    acker.add_argument("--stall-timeout", type=timeout_seconds, default=STALL_TIMEOUT, metavar="S",
                       help="exit 1 (so the cluster recovers) when a global time stays in flight S seconds, and far "
                            "longer than the stream's pace, while the min time does not move: a lost batch or a "
                            f"stuck worker; 0 = never (default {STALL_TIMEOUT:g})")
    barrier = parser.add_argument_group("barrier options")
    barrier.add_argument("--release", choices=("after-min-time", "on-arrival"), default="after-min-time",
                         help="after-min-time (exactly-once, default) or on-arrival: guarantees off, for benchmarks "
                              "against peers without exactly-once (no invalidation, no waiting for the acker)")


def node_name(args: argparse.Namespace) -> str:
    """``--name``, or one derived from the first role: node-worker0, node-front0, ..."""
    if args.name:
        return str(args.name)
    hosted = (["acker"] if args.acker else []) + ([f"worker{args.worker}"] if args.worker is not None else []) + \
        ([f"front{args.front}"] if args.front is not None else []) + ([f"barrier{args.barrier[0]}"] if args.barrier
                                                                     else [])
    return f"node-{hosted[0]}" if hosted else "node"


def check(args: argparse.Namespace) -> None:
    """Raise ValueError naming what is wrong with a node's flags."""
    if args.worker is None and args.front is None and not args.barrier and not args.acker:
        raise ValueError("a node needs at least one role: --worker, --front, --barrier or --acker")
    if (args.front is not None or args.barrier) and args.data_dir is None:
        raise ValueError("fronts and barriers keep durable logs: give --data-dir")
    if args.linger_ms < 0:
        raise ValueError("--linger-ms must be >= 0")


async def serve(args: argparse.Namespace) -> int:
    """Open every role's durable state, then run the node until it stops; returns the exit code."""
    local = LocalEndpoints()
    credentials = None
    if args.tls_dir is not None:
        tls.ensure_node_cert(args.tls_dir, node_name(args), args.host)
        credentials = Credentials.load(args.tls_dir, node=node_name(args))
    # With --tls the node writes as the ``service`` digest identity and lets admins (deploy, scale) write too.
    store = ClusterStore(args.zookeeper, cluster=args.cluster,
                         auth=credentials.zookeeper_auth("service") if credentials else None,
                         writers=list(credentials.zookeeper.values()) if credentials else ())
    roles: list[Role] = []
    if args.acker:
        roles.append(AckerRole(args.stall_timeout))
    if args.worker is not None:
        roles.append(WorkerRole(args.worker, store, args.data_dir, weight=worker_weight(args),
                                batch_items=args.batch_items,
                                linger_ms=args.linger_ms, snapshot_interval_ms=args.snapshot_interval_ms,
                                snapshot_retention=args.snapshot_retention,
                                snapshot_cpu_share=args.snapshot_cpu_share,
                                snapshot_max_stride=args.snapshot_max_stride,
                                memory_budget_mb=args.memory_budget_mb))
    if args.front is not None:
        roles.append(await FrontRole.open(args.front, args.data_dir, local, store,
                                          report_interval_ms=args.report_interval_ms,
                                          max_event_bytes=args.max_event_bytes,
                                          segment_bytes=args.log_segment_bytes,
                                          max_push_bytes=args.max_push_bytes,
                                          max_in_flight=args.max_in_flight_events,
                                          pace_pushes=not args.send_at_once))
    if args.barrier:
        roles.append(BarrierRole(args.data_dir, args.barrier, args.release == "on-arrival",
                                 functools.partial(store.legacy_offsets, "output")))
    node = Node(node_name(args), roles, store, local, host=args.host, port=args.port, frames_port=args.frames_port,
                data_dir=args.data_dir, credentials=credentials, stream_timeout=args.stream_timeout)
    return await node.run()


def main(args: argparse.Namespace) -> NoReturn:
    logs.configure(node_name(args), args.log_file, args.log_format, args.log_level)
    # Before any tick: workers and fronts rebuild graphs under this process's policy (the graph's own package,
    # flamestream's helpers and this node's --allow-module, never the deployer's).
    set_process_policy(Allowed.of(args.allow_module))

    async def run() -> None:
        code = await serve(args)
        # Stopped: exit now.  A thread still blocked in a ZooKeeper call (ZooKeeper away, or a call kazoo left
        # unanswered when the session closed under it) would otherwise hold the exit until its heartbeat fails,
        # or for good; nothing the node wrote is waiting (its roles closed their files and streams).
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)

    hosting.run(run)
    raise AssertionError("the node's event loop ended without ending the process")
