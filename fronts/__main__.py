"""``python -m fronts --zookeeper HOST:PORT --id F --data-dir DIR``: run front F (see the package docstring)."""

import argparse
from pathlib import Path

from flamestream import hosting
from flamestream.hashing import INT32_MAX
from fronts.service import ROLE, serve


def _front_id(text: str) -> int:
    """Front ids are non-negative int32s: they travel as ``GlobalTime.front`` and as worker sender ``-1 - F``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"front id must be in 0..{INT32_MAX}, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fronts", description="Run a FlameStream front.")
    hosting.add_host_arguments(parser, ROLE)
    parser.add_argument("--id", type=_front_id, required=True, help="front id F: the front part of global times")
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="directory of the durable input log (DIR/input/front-F)")
    parser.add_argument("--report-interval-ms", type=_positive, default=5,
                        help="how often to report the front's time to the acker, default 5")
    parser.add_argument("--max-event-bytes", type=_positive, default=1 << 20,
                        help="largest event accepted, default 1048576")
    args = parser.parse_args()
    if args.name == ROLE:
        args.name = f"front{args.id}"
    hosting.run(lambda: serve(args))


main()
