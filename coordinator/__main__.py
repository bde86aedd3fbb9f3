"""``python -m flamestream.coordinator zookeeper --data-dir DIR [--port P]``.

Runs a private ZooKeeper server in the foreground so scripts and other
processes can share one coordination store.  The ``zookeeper HOST:PORT`` line
on stdout is the readiness signal: a launcher reads it instead of polling the
port.  SIGTERM and SIGINT stop the server cleanly and exit 0, so that a
supervisor's ordinary shutdown is not reported as a failure.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from flamestream.coordinator.zookeeper import ZooKeeperError, ZooKeeperServer
from flamestream.runtime import logs

log = logs.role_logger("coordinator")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {port}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flamestream.coordinator",
                                     description="FlameStream coordinator services")
    commands = parser.add_subparsers(dest="command", required=True)
    zookeeper = commands.add_parser("zookeeper", help="run a standalone ZooKeeper server in the foreground")
    zookeeper.add_argument("--data-dir", type=Path, required=True, help="directory for zoo.cfg, data and logs")
    zookeeper.add_argument("--port", type=_port, help="client port (default: a free loopback port)")
    return parser


def run_zookeeper(data_dir: Path, port: int | None) -> int:
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before starting so a signal during start-up still ends in a
    # clean stop rather than an orphaned JVM.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    server = ZooKeeperServer(data_dir, port=port)
    try:
        server.start()
    except (ZooKeeperError, OSError) as err:  # OSError: data_dir cannot be created or written
        log.error("error: %s", err)
        return 1
    try:
        if not stop.is_set():
            print(f"zookeeper {server.address}", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                log.error("error: ZooKeeper at %s exited unexpectedly\n%s", server.address, server.log_tail())
                return 1
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure("zookeeper")
    return run_zookeeper(args.data_dir, args.port)


if __name__ == "__main__":
    sys.exit(main())
