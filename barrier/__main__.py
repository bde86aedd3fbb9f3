"""``python -m barrier --zookeeper HOST:PORT --partitions 0[,1,...] --data-dir DIR [--cluster C] [--name N]``."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from barrier.service import serve
from flamestream import hosting


def _partitions(text: str) -> tuple[int, ...]:
    try:
        partitions = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated front ids such as 0,1, got {text!r}") from None
    if partitions[0] < 0:
        raise argparse.ArgumentTypeError(f"partitions are front ids and cannot be negative, got {text!r}")
    return tuple(partitions)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m barrier",
                                     description="FlameStream barrier: invalidation buffer and output topic")
    hosting.add_host_arguments(parser, "barrier")
    parser.add_argument("--partitions", type=_partitions, required=True,
                        help="comma-separated partitions (front ids) this barrier owns, e.g. 0,1")
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="directory of the durable output topic (DIR/topic/<partition>), kept across restarts")
    parser.add_argument("--release", choices=("after-min-time", "on-arrival"), default="after-min-time",
                        help="after-min-time (exactly-once, default) or on-arrival: guarantees off, for benchmarks "
                             "against peers without exactly-once (no invalidation, no waiting for the acker)")
    args = parser.parse_args()
    hosting.run(functools.partial(serve, args))


if __name__ == "__main__":
    main()
