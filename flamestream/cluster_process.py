"""Process management behind ``flamestream up`` and ``flamestream down``.

A local cluster is a set of detached processes (each in its own session, so
closing the terminal or a Ctrl-C aimed at the launcher does not kill them)
that outlive the ``up`` command.  Everything ``down`` needs to find them again
is written to ``DIR/cluster.json`` *as soon as each process is spawned*, so
even an ``up`` that is itself killed half-way leaves nothing ``down`` cannot
stop.  Each process is recorded with its pid and the kernel's start time for
that pid: a pid can be reused by an unrelated process after ours died, and
``down`` must never signal a stranger.

``service_args`` is the one place that turns a role into a command line; the
docker-compose file is checked against it so the two ways of running a cluster
cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

import flamestream
from flamestream.cluster import ClusterStore, zookeeper_serving

ZOOKEEPER = "zookeeper"
ACKER = "acker"
WORKER = "worker"
FRONT = "front"
BARRIER = "barrier"
SERVICE_ROLES = (ACKER, WORKER, FRONT, BARRIER)
"""Member roles in ZooKeeper (``members/<role>/<name>``), in start order."""

MODULES = {ACKER: "acker", WORKER: "workers", FRONT: "fronts", BARRIER: "barrier"}
"""The package run with ``python -m`` for each role."""

STATE_FILE = "cluster.json"
LOG_DIR = "logs"
DEFAULT_TIMEOUT = 60.0
SERVICE_GRACE = 10.0
# The coordinator gives its JVM 10 s to stop on SIGTERM; ours must be longer or
# we would SIGKILL the coordinator while it is still shutting ZooKeeper down.
ZOOKEEPER_GRACE = 15.0
_ZOOKEEPER_LINE = re.compile(r"^zookeeper (\S+:\d+)$", re.MULTILINE)


class StartError(Exception):
    """A component of the cluster did not come up; carries what the user needs to see."""

    def __init__(self, component: str, reason: str, log: str | None = None) -> None:
        super().__init__(f"{component}: {reason}")
        self.component = component
        self.reason = reason
        self.log = log
        """The component's log file, if it has one (an external ZooKeeper has none of ours)."""


class StopError(Exception):
    """Some recorded processes could not be stopped (e.g. not ours to signal)."""


def member_name(role: str, index: int) -> str:
    """The member name of a role's ``index``-th process: ``acker``, ``worker0``, ``front1``, ..."""
    return role if role == ACKER else f"{role}{index}"


def service_args(role: str, index: int, *, zookeeper: str, cluster: str, data_dir: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, exactly_once: bool = True) -> list[str]:
    """Interpreter arguments (after ``python``) that run one service process.

    ``index`` is the worker index or the front id; a barrier with index ``f``
    owns partition ``f``, the output of front ``f``.  ``data_dir`` is where
    fronts and barriers keep their durable logs (ignored for other roles).
    ``exactly_once=False`` makes barriers release on arrival (guarantees off).
    """
    if role not in MODULES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(SERVICE_ROLES)}")
    args = ["-m", MODULES[role], "--zookeeper", zookeeper, "--cluster", cluster, "--name", member_name(role, index),
            "--host", host, "--port", str(port)]
    if role == WORKER:
        args += ["--index", str(index)]
    elif role in (FRONT, BARRIER):
        if data_dir is None:
            raise ValueError(f"a {role} needs a data directory")
        args += ["--id" if role == FRONT else "--partitions", str(index), "--data-dir", data_dir]
    if role == BARRIER and not exactly_once:
        args += ["--release", "on-arrival"]
    return args


def planned_services(workers: int, fronts: int) -> list[tuple[str, int]]:
    """(role, index) of every service process of a cluster: one barrier per front partition."""
    return ([(ACKER, 0)] + [(WORKER, i) for i in range(workers)] + [(FRONT, f) for f in range(fronts)]
            + [(BARRIER, f) for f in range(fronts)])


# -- the state file ------------------------------------------------------------------------------------------


@dataclass
class ProcessRecord:
    """One launched process.  ``helpers`` are processes it started that must not outlive it (ZooKeeper's JVM)."""

    role: str
    name: str
    pid: int
    started: str | None
    log: str
    address: str = ""
    helpers: list[tuple[int, str | None]] = field(default_factory=list)


@dataclass
class ClusterState:
    cluster: str
    zookeeper: str
    own_zookeeper: bool
    processes: list[ProcessRecord] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        records = [ProcessRecord(**{**p, "helpers": [(int(pid), started) for pid, started in p.get("helpers", [])]})
                   for p in data["processes"]]
        return cls(cluster=str(data["cluster"]), zookeeper=str(data["zookeeper"]),
                   own_zookeeper=bool(data["own_zookeeper"]), processes=records)

    def endpoints(self) -> list[tuple[str, str]]:
        """(name, address) of ZooKeeper and every service, in start order."""
        services = [(p.name, p.address) for p in self.processes if p.role != ZOOKEEPER]
        return [(ZOOKEEPER, self.zookeeper), *services]


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def load_state(data_dir: Path) -> ClusterState | None:
    """The recorded cluster, or None if there is none; a damaged file raises ValueError naming it."""
    path = state_path(data_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return ClusterState.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is damaged ({type(exc).__name__}: {exc}); remove it after checking that "
                         "no flamestream process is left running") from exc


def save_state(data_dir: Path, state: ClusterState) -> None:
    """Write atomically, so a crash mid-write never leaves ``down`` a half file."""
    path = state_path(data_dir)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(state.to_json())
    tmp.replace(path)


# -- processes ---------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None without /proc or such a process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat): with the pid, a unique identity."""
    fields = _proc_stat(pid)
    return fields[19] if fields is not None else None


def is_alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is still the process we recorded, and not a zombie."""
    with contextlib.suppress(ChildProcessError):
        # Our own child (when ``up`` cleans up after a failure) stays a zombie
        # until reaped; reaping it here is what makes it disappear.
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists but belongs to another user: only the start time can tell whether it is ours
    fields = _proc_stat(pid)
    if fields is None:
        return started is None  # no /proc (not Linux): the pid is all we have
    return fields[0] != "Z" and (started is None or fields[19] == started)


def _signal(pid: int, started: str | None, sig: signal.Signals) -> None:
    if is_alive(pid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _children(pid: int) -> list[tuple[int, str | None]]:
    """Direct children of ``pid`` (found through /proc; empty where there is none)."""
    found: list[tuple[int, str | None]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = _proc_stat(int(entry.name))
                if fields is not None and fields[1] == str(pid):
                    found.append((int(entry.name), fields[19]))
    return found


def alive_processes(state: ClusterState) -> list[ProcessRecord]:
    return [p for p in state.processes
            if is_alive(p.pid, p.started) or any(is_alive(pid, s) for pid, s in p.helpers)]


def _wait_gone(targets: list[tuple[int, str | None]], timeout: float) -> list[tuple[int, str | None]]:
    deadline = time.monotonic() + timeout
    while True:
        left = [(pid, started) for pid, started in targets if is_alive(pid, started)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _stop_group(records: list[ProcessRecord], grace: float) -> None:
    """SIGTERM, wait up to ``grace``, then SIGKILL the processes and their helpers; wait until all are gone."""
    main = [(p.pid, p.started) for p in records]
    for pid, started in main:
        _signal(pid, started, signal.SIGTERM)
    left = _wait_gone(main, grace)
    for pid, started in left:
        _signal(pid, started, signal.SIGKILL)
    helpers = [h for p in records for h in p.helpers]
    if left:
        # A process killed with SIGKILL cannot stop what it started; its
        # helpers lead their own process groups (see coordinator.zookeeper).
        for pid, started in helpers:
            if is_alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    stuck = _wait_gone(main + helpers, 5.0)
    if stuck:
        raise StopError("could not stop pid(s) " + ", ".join(str(pid) for pid, _ in stuck))


def _port_free(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same as a server's listening socket: connections in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError:
            return False
        return True


def stop_cluster(state: ClusterState) -> list[str]:
    """Stop every recorded process, ZooKeeper last; returns addresses still bound afterwards.

    Services go first so they can close their ZooKeeper sessions (and drop
    their ephemeral membership) while ZooKeeper is still there to hear it.
    Raises StopError if a process survives SIGKILL or cannot be signalled.
    """
    services = [p for p in state.processes if p.role != ZOOKEEPER]
    zookeeper = [p for p in state.processes if p.role == ZOOKEEPER]
    _stop_group(services, SERVICE_GRACE)
    _stop_group(zookeeper, ZOOKEEPER_GRACE)
    addresses = [p.address for p in state.processes if p.address]
    deadline = time.monotonic() + 5.0
    while True:
        busy = [a for a in addresses if not _port_free(a)]
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.1)


# -- starting ----------------------------------------------------------------------------------------------


def log_tail(path: str | Path, lines: int = 20) -> str:
    """The last lines of a log, reading only its end (logs of long runs get big)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16 * 1024))
            data = f.read()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:]) or "(empty log)"


def _child_env() -> dict[str, str]:
    """The services' environment: unbuffered output for the logs, and the source tree importable.

    The service packages (acker, workers, ...) sit next to ``flamestream`` in
    the source tree, but the package metadata installs only flamestream,
    examples and coordinator, so without this ``python -m workers`` would only
    work from the repository root.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(Path(flamestream.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@dataclass
class UpOptions:
    data_dir: Path
    workers: int = 2
    fronts: int = 1
    zookeeper: str | None = None
    cluster: str = "default"
    timeout: float = DEFAULT_TIMEOUT
    exactly_once: bool = True
    """False: barriers release on arrival (guarantees off, for benchmarks against peers without them)."""


class _Launcher:
    """Spawns the processes of one ``up`` and records each in the state file immediately."""

    def __init__(self, options: UpOptions, state: ClusterState) -> None:
        self.options = options
        self.data_dir = options.data_dir
        self.state = state
        self.popen: dict[str, subprocess.Popen[bytes]] = {}
        self.log_start: dict[str, int] = {}
        self.env = _child_env()

    def spawn(self, role: str, name: str, args: list[str]) -> ProcessRecord:
        log = self.data_dir / LOG_DIR / f"{name}.log"
        argv = [sys.executable, *args]
        with log.open("ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
            out.flush()
            self.log_start[name] = out.tell()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.data_dir, env=self.env, start_new_session=True)
        record = ProcessRecord(role=role, name=name, pid=proc.pid, started=start_time(proc.pid), log=str(log))
        self.popen[name] = proc
        self.state.processes.append(record)
        save_state(self.data_dir, self.state)
        return record

    def failure(self, record: ProcessRecord, reason: str) -> StartError:
        return StartError(record.name, reason, record.log)

    def check_running(self, record: ProcessRecord) -> None:
        code = self.popen[record.name].poll()
        if code is not None:
            raise self.failure(record, f"exited with code {code} during start-up")

    def start_zookeeper(self, deadline: float) -> None:
        record = self.spawn(ZOOKEEPER, ZOOKEEPER, ["-m", "coordinator", "zookeeper", "--data-dir",
                                                   str(self.data_dir / ZOOKEEPER)])
        while True:
            with open(record.log, "rb") as f:
                f.seek(self.log_start[record.name])
                found = _ZOOKEEPER_LINE.search(f.read().decode("utf-8", "replace"))
            if found:
                break
            self.check_running(record)
            if time.monotonic() >= deadline:
                raise self.failure(record, f"did not report its address within {self.options.timeout:g}s")
            time.sleep(0.1)
        record.address = found.group(1)
        record.helpers = _children(record.pid)
        while not zookeeper_serving(record.address):
            self.check_running(record)
            if time.monotonic() >= deadline:
                raise self.failure(record, f"does not serve requests within {self.options.timeout:g}s")
            time.sleep(0.05)
        self.state.zookeeper = record.address
        save_state(self.data_dir, self.state)

    def start_services(self) -> None:
        # One data directory for all: fronts and barriers keep their logs in
        # per-id subdirectories of it (input/front-<id>, topic/<partition>),
        # where replay and the oracle checks find every front's input.
        for role, index in planned_services(self.options.workers, self.options.fronts):
            self.spawn(role, member_name(role, index), service_args(
                role, index, zookeeper=self.state.zookeeper, cluster=self.state.cluster, data_dir=str(self.data_dir),
                exactly_once=self.options.exactly_once))

    def wait_registered(self, store: ClusterStore, deadline: float) -> None:
        """Block until every service is a ZooKeeper member; record the addresses they registered."""
        services = [p for p in self.state.processes if p.role != ZOOKEEPER]
        for role in SERVICE_ROLES:
            expected = [p for p in services if p.role == role]
            while True:
                for record in services:
                    self.check_running(record)
                try:
                    # Short slices so a process that dies is reported at once,
                    # not after the whole timeout.
                    remaining = max(0.0, deadline - time.monotonic())
                    members = store.wait_for_members(role, len(expected), min(0.5, remaining))
                except TimeoutError:
                    members = {}
                if all(p.name in members for p in expected):
                    break
                if time.monotonic() >= deadline:
                    missing = next(p for p in expected if p.name not in members)
                    raise self.failure(missing, f"did not register in ZooKeeper within {self.options.timeout:g}s")
                if len(members) >= len(expected):
                    time.sleep(0.1)  # enough members, but left over from another run: poll for ours
            for record in expected:
                record.address = str(members[record.name]["address"])
        save_state(self.data_dir, self.state)

    def wait_serving(self, deadline: float) -> None:
        """Block until every service answers the standard gRPC health check with SERVING."""
        for record in (p for p in self.state.processes if p.role != ZOOKEEPER):
            while True:
                self.check_running(record)
                status = _health(record.address)
                if status == "SERVING":
                    break
                if time.monotonic() >= deadline:
                    raise self.failure(record, f"registered {record.address} but its health check says {status} "
                                               f"after {self.options.timeout:g}s")
                time.sleep(0.1)


_HEALTH_CHECK = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/Check"


def _health(address: str) -> str:
    """The health status name of ``address``, or why it could not be asked.

    Called through the method path because the typing stubs of the generated
    HealthStub declare no methods.
    """
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary(_HEALTH_CHECK, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
        try:
            reply = check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
        except grpc.RpcError as exc:
            return f"unreachable ({exc.code().name})" if isinstance(exc, grpc.Call) else "unreachable"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def start_cluster(options: UpOptions) -> ClusterState:
    """Start ZooKeeper (unless given) and every service detached; return once all serve.

    On any failure (or Ctrl-C) everything started so far is stopped and the
    state file removed before the error propagates, so a failed ``up`` leaves
    nothing behind.
    """
    data_dir = options.data_dir
    (data_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    state = ClusterState(cluster=options.cluster, zookeeper=options.zookeeper or "",
                         own_zookeeper=options.zookeeper is None)
    launcher = _Launcher(options, state)
    deadline = time.monotonic() + options.timeout
    try:
        if options.zookeeper is None:
            launcher.start_zookeeper(deadline)
        store = ClusterStore(state.zookeeper, cluster=options.cluster,
                             timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        try:
            store.start()
        except TimeoutError as exc:
            own = [p.log for p in state.processes if p.role == ZOOKEEPER]
            raise StartError(ZOOKEEPER, str(exc), own[0] if own else None) from None
        try:
            launcher.start_services()
            launcher.wait_registered(store, deadline)
        finally:
            store.stop()
        launcher.wait_serving(deadline)
    except BaseException:
        with contextlib.suppress(StopError):
            stop_cluster(state)
        state_path(data_dir).unlink(missing_ok=True)
        raise
    return state


def format_endpoints(endpoints: Iterable[tuple[str, str]]) -> str:
    rows = list(endpoints)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {address}" for name, address in rows)

