"""A private, real ZooKeeper server run as a child process.

FlameStream keeps ticks, membership, leases and snapshot registrations in ZooKeeper.  Tests and
single-machine deployments need a server they fully own: its own data directory,
its own port, its own log file, and a guarantee that nothing (no JVM, no bound
port) outlives it.  This module launches the Debian ``zookeeper`` package's
server with a generated configuration instead of touching the system-wide
``/etc/zookeeper`` setup or service.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from flamestream.cluster import zookeeper_serving

INSTALL_HINT = "run `apt-get install -y zookeeper default-jre-headless`"

# The Debian package ships zookeeper.jar whose manifest Class-Path pulls in its
# runtime dependencies, but it logs through SLF4J without a binding on that
# class path.  The package depends on log4j 1.2, so bind SLF4J to it explicitly;
# otherwise the server would log nothing at all.
JAVA_DIR = Path("/usr/share/java")
CLASSPATH_JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

CONFIG_FILE = "zoo.cfg"
LOG4J_FILE = "log4j.properties"
LOG_FILE = "zookeeper.log"
# The JVM's own stdout/stderr: class-path or JVM start-up failures land here,
# before log4j is configured.
CONSOLE_FILE = "zookeeper.out"
DATA_SUBDIR = "data"


class ZooKeeperError(RuntimeError):
    """The ZooKeeper server could not be started or died."""


def _free_port(host: str) -> int:
    """Ask the kernel for an unused port so parallel runs never collide on a fixed one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` right now.

    SO_REUSEADDR mirrors what the JVM sets on its listening socket, so leftover
    TIME_WAIT connections do not count as "in use" but a live listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _tail(path: Path, lines: int) -> str:
    """Last ``lines`` lines of a possibly large log file, reading only its end."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _properties_value(path: Path) -> str:
    """Escape a path for a Java .properties file, where backslash is the escape character."""
    return str(path).replace("\\", "\\\\")


class ZooKeeperServer:
    """One standalone ZooKeeper server owned by this Python process.

    The server runs in its own process group so that ``stop()`` can terminate the
    JVM and anything it spawned in one go, and so that a Ctrl-C aimed at the
    parent's terminal does not kill the server behind the parent's back; the
    parent decides when to stop it.
    """

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        # Chosen once, so a stopped server can be restarted on the same address
        # and clients configured with ``address`` keep working.
        self.port = port if port is not None else _free_port(host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port`` in the form ZooKeeper clients (kazoo) accept as ``hosts``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the server JVM (also its process group id), None when not started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive; lets supervisors notice an unexpected death."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server log and of the JVM console output, for error reports."""
        parts = []
        for path in (self.data_dir / CONSOLE_FILE, self.log_path):
            text = _tail(path, lines)
            if text:
                parts.append(f"--- {path} ---\n{text}")
        return "\n".join(parts) if parts else "(no server output)"

    def start(self, timeout: float = 30.0) -> None:
        """Launch the server and return once it serves sessions (``srvr`` answers).

        Raises ZooKeeperError if the prerequisites are missing, the port is taken,
        or the server dies or stays silent for ``timeout`` seconds; in the last two
        cases the process is cleaned up and the error carries the log tail.
        """
        if self.running:
            raise ZooKeeperError(f"ZooKeeper at {self.address} is already running (pid {self.pid})")
        command = self._command()
        # Checked up front: if another server already listens there, our
        # readiness probe would be answered by *that* server.
        if not _port_is_bindable(self.host, self.port):
            raise ZooKeeperError(f"cannot start ZooKeeper: {self.address} is already in use")
        self._write_config()
        with (self.data_dir / CONSOLE_FILE).open("ab") as console:
            self._proc = subprocess.Popen(
                command,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise ZooKeeperError(
                    f"ZooKeeper at {self.address} exited with code {code} during start-up\n{self.log_tail()}"
                )
            if zookeeper_serving(self.address):
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise ZooKeeperError(
                    f"ZooKeeper at {self.address} did not start serving within {timeout:g}s\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``grace`` seconds) and reap it.

        Waiting for the exit is what guarantees that neither a process nor the
        listening port is left behind when this returns.  Safe to call repeatedly
        and after the server died on its own.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._proc = None

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # The group may already be gone if the JVM exited between poll() and here.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def _command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperError(f"cannot start ZooKeeper: `java` is not on PATH; {INSTALL_HINT}")
        jars = [JAVA_DIR / name for name in CLASSPATH_JARS]
        missing = [str(jar) for jar in jars if not jar.is_file()]
        if missing:
            raise ZooKeeperError(f"cannot start ZooKeeper: missing {', '.join(missing)}; {INSTALL_HINT}")
        return [
            java,
            # The JVM default (a quarter of RAM) is far more than a coordination
            # store of small nodes needs, and several servers may run side by side.
            "-Xmx256m",
            # The client JIT only (C1) and one garbage-collector thread: a
            # coordination store of a few writes a second gains nothing from
            # C2's compiled peak, and its compiler threads, with the parallel
            # collector's, were a third of the JVM's CPU in a benchmark's 15 s
            # on two cores shared with the nodes (0.57-0.63 s -> 0.41-0.42 s;
            # inverted index at 20 pages/s, two rounds in turns).
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            # No hsperfdata file, whose counters the JVM updates all the time for `jstat` (nobody attaches one
            # here): 1-2 ms of CPU a second idle -> 0 (10 s, four starts in turns).
            "-XX:-UsePerfData",
            # One selector thread doing the sockets' reads and writes itself, not a pool of 2 x cores it hands
            # each request to: a cluster holds a handful of sessions, and every hand-over woke a thread.  ZooKeeper's
            # CPU a request, sequential, four starts in turns: a read 0.135-0.138 -> 0.100-0.105 ms, a write
            # 0.31 -> 0.25-0.26 ms, a two-create transaction 0.40-0.42 -> 0.33-0.38 ms.
            "-Dzookeeper.nio.numSelectorThreads=1",
            "-Dzookeeper.nio.numWorkerThreads=0",
            f"-Dlog4j.configuration={(self.data_dir / LOG4J_FILE).as_uri()}",
            # The log4j JMX bean registration is only useful with a remote JMX
            # console, which this private server never exposes.
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            os.pathsep.join(str(jar) for jar in jars),
            MAIN_CLASS,
            str(self.data_dir / CONFIG_FILE),
        ]

    def _write_config(self) -> None:
        """(Re)write zoo.cfg and the log4j config so the server depends on nothing outside data_dir."""
        data = self.data_dir / DATA_SUBDIR
        data.mkdir(parents=True, exist_ok=True)
        config = {
            # 2 s ticks: session timeouts may range over 4..40 s, which covers
            # kazoo's 10 s default.  The limits only matter in a quorum but are
            # kept at the documented defaults so the file is a valid template.
            "tickTime": "2000",
            "initLimit": "10",
            "syncLimit": "5",
            "dataDir": _properties_value(data),
            "clientPort": str(self.port),
            "clientPortAddress": self.host,
            # No embedded Jetty admin server: it would grab port 8080.
            "admin.enableServer": "false",
            # srvr is the readiness probe (see flamestream.cluster.zookeeper_serving); ruok for operators.
            "4lw.commands.whitelist": "ruok,srvr",
            # Every worker, front and acker holds a session; never refuse them.
            "maxClientCnxns": "0",
            # A long-running coordinator would otherwise accumulate snapshots
            # and transaction logs forever.
            "autopurge.snapRetainCount": "3",
            "autopurge.purgeInterval": "1",
        }
        lines = ["# Generated by coordinator.zookeeper; rewritten on every start."]
        lines += [f"{key}={value}" for key, value in config.items()]
        (self.data_dir / CONFIG_FILE).write_text("\n".join(lines) + "\n")
        log4j = {
            "log4j.rootLogger": "INFO, FILE",
            "log4j.appender.FILE": "org.apache.log4j.FileAppender",
            "log4j.appender.FILE.File": _properties_value(self.log_path),
            "log4j.appender.FILE.Append": "true",
            "log4j.appender.FILE.layout": "org.apache.log4j.PatternLayout",
            "log4j.appender.FILE.layout.ConversionPattern": "%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n",
        }
        (self.data_dir / LOG4J_FILE).write_text("".join(f"{key}={value}\n" for key, value in log4j.items()))
