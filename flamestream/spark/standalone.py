"""A real Spark standalone cluster on this machine: one master and one worker, bound to loopback.

The pyspark package ships Spark's launcher (``bin/spark-class``), so the
cluster needs nothing beyond the package and a JVM.  Used by the tests and the
benchmark; by hand::

    python -m flamestream.spark.standalone [--cores 2] [--memory 2g] [--dir DIR]   # prints the master URL
    flamestream replay --input-log .flamestream --out /tmp/replayed --master spark://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """Master + one worker (``cores``, ``memory``) as child processes, logs under ``directory``."""

    def __init__(self, directory: Path, cores: int = 2, memory: str = "2g") -> None:
        self.directory, self.cores, self.memory = directory, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, args: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(self.directory)}
        with open(self.directory / f"{name}.log", "wb") as log:
            self.processes.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 180.0) -> str:
        """Start both and wait until the worker has registered; returns the master URL."""
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                               "--work-dir", str(self.directory / "work"), self.url])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"the Spark standalone cluster failed to start; see {self.directory}/*.log")
            try:
                if any(w.get("state") == "ALIVE" for w in self.status().get("workers", [])):
                    return self.url
            except (OSError, ValueError):
                # The master's UI is not up yet, or half up: its main page once answered /json (HTML, in CI), as
                # Jetty already served while the UI's handlers were still being attached.
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"no worker registered with {self.url} within {timeout:g}s; see {self.directory}/*.log")

    def status(self) -> dict[str, Any]:
        """The master's view (workers, active and completed applications), from its JSON page on loopback."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as response:
            status: dict[str, Any] = json.loads(response.read())
            return status

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a Spark standalone master and one worker on loopback")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="2g")
    parser.add_argument("--dir", help="logs and work files (default: a temporary directory)")
    args = parser.parse_args(argv)
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="flamestream-spark-"))
    cluster = StandaloneCluster(directory, args.cores, args.memory)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print(cluster.start(), flush=True)
    print(f"master UI http://127.0.0.1:{cluster.ui_port}, logs in {directory}; Ctrl-C stops both", file=sys.stderr)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
