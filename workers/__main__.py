"""``python -m workers --zookeeper HOST:PORT --index I``: run worker I (hash range I of the tick's layout)."""

import argparse

from flamestream import hosting
from workers.service import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    hosting.add_host_arguments(parser, "worker")
    parser.add_argument("--index", type=int, required=True, help="which hash range of the tick's layout to own")
    parser.add_argument("--batch-items", type=int, default=256,
                        help="most items per outgoing message; a step ships its output whenever this many are "
                             "pending, so receivers start on it while the step runs on (default 256)")
    parser.add_argument("--linger-ms", type=float, default=0.0,
                        help="wait this long after input arrives to gather more before a step: throughput for "
                             "latency (default 0)")
    args = parser.parse_args()
    if args.batch_items < 1 or args.linger_ms < 0:
        parser.error("--batch-items must be >= 1 and --linger-ms >= 0")
    if args.name == "worker":
        args.name = f"worker{args.index}"
    hosting.run(lambda: serve(args))


main()
