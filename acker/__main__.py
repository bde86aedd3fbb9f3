"""``python -m acker --zookeeper HOST:PORT [--cluster C] [--name acker] [--port P]``."""

from __future__ import annotations

import argparse
import functools

from acker.service import serve
from flamestream import hosting


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m acker", description="FlameStream acker: ack table and min time")
    hosting.add_host_arguments(parser, "acker")
    args = parser.parse_args()
    hosting.run(functools.partial(serve, args))


if __name__ == "__main__":
    main()
