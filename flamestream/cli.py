"""The ``flamestream`` command line.

``flamestream run GRAPH --input FILE`` runs a graph on the embedded local
runtime and prints every released record as one JSON line.  Usage errors and
bad graphs/inputs print a message and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from flamestream.functions import FunctionRefError
from flamestream.graph import GraphError
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flamestream", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a graph on the embedded local runtime")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return cmd_run(args)
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (GraphError, FunctionRefError, OSError) as exc:
        print(f"flamestream: error: {exc}", file=sys.stderr)
        return 2


def cmd_run(args: argparse.Namespace) -> int:
    graph, module = load_graph(args.graph)
    events = list(read_inputs(module, args.input))
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


if __name__ == "__main__":
    sys.exit(main())
