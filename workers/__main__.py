"""``python -m workers --zookeeper HOST:PORT --index I``: run worker I (hash range I of the tick's layout)."""

import argparse

from flamestream import hosting
from workers.service import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    hosting.add_host_arguments(parser, "worker")
    parser.add_argument("--index", type=int, required=True, help="which hash range of the tick's layout to own")
    args = parser.parse_args()
    if args.name == "worker":
        args.name = f"worker{args.index}"
    hosting.run(lambda: serve(args))


main()
