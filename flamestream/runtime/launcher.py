"""Process management behind ``flamestream up`` and ``flamestream down``.

A local cluster is a set of detached processes (each in its own session, so
closing the terminal or a Ctrl-C aimed at the launcher does not kill them)
that outlive the ``up`` command.  Everything ``down`` needs to find them again
is written to ``DIR/cluster.json`` *as soon as each process is spawned*, so
even an ``up`` that is itself killed half-way leaves nothing ``down`` cannot
stop.  Each process is recorded with its pid and the kernel's start time for
that pid: a pid can be reused by an unrelated process after ours died, and
``down`` must never signal a stranger.

A cluster is ZooKeeper plus node processes (``flamestream node``), each
hosting some of the roles (``plan_nodes``).  ``node_args`` is the one place
that turns a node's roles into a command line; the docker-compose file is
checked against it so the two ways of running a cluster cannot drift apart.
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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2

from flamestream.cluster import (
    ACKER,
    BARRIER,
    FRONT,
    SERVICE_ROLES,
    WORKER,
    ClusterStore,
    host_port,
    placement,
    zookeeper_serving,
)
from flamestream.runtime import tls
from flamestream.wire.security import Credentials

if TYPE_CHECKING:  # spares imports this module
    from flamestream.runtime.spares import Spare

ZOOKEEPER = "zookeeper"


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

    def __init__(self, component: str, reason: str, log: str | None = None, output: str | None = None) -> None:
        super().__init__(f"{component}: {reason}")
        self.component = component
        self.reason = reason
        self.logs = list(dict.fromkeys(path for path in (log, output) if path is not None))
        """The component's log and output files, if it has them (an external ZooKeeper has none of ours)."""


class StopError(Exception):
    """Some recorded processes could not be stopped (e.g. not ours to signal)."""


NODE = "node"
"""The role of node processes in the state file (ZooKeeper's process is ``zookeeper``)."""
SUPERVISOR = "supervisor"
"""The process ``up`` leaves running to restart crashed nodes (``flamestream.runtime.restarts``)."""
SUPERVISING_FILE = "supervising"
"""``DIR/supervising``: the supervisor's pid, written once it watches the nodes (``_Launcher.wait_supervising``)."""

PLACEMENTS = ("nodes", "separate")
DEFAULT_SNAPSHOT_INTERVAL_MS = 1000


@dataclass(frozen=True)
class NodePlan:
    """The roles one node process hosts: at most one worker and one front (a node is one place in the hash
    space and one source of global times), any number of barrier partitions, maybe the acker."""

    name: str
    acker: bool = False
    worker: int | None = None
    front: int | None = None
    barriers: tuple[int, ...] = ()
    """Partitions; partition ``f`` is front ``f``'s output."""

    def members(self) -> list[tuple[str, str]]:
        """(role, member name) of everything the node registers in ZooKeeper."""
        return ([(ACKER, ACKER)] if self.acker else []) + \
            ([(WORKER, f"{WORKER}{self.worker}")] if self.worker is not None else []) + \
            ([(FRONT, f"{FRONT}{self.front}")] if self.front is not None else []) + \
            ([(BARRIER, f"{BARRIER}{self.barriers[0]}")] if self.barriers else [])


def node_name(argv: list[str]) -> str | None:
    """The ``--name`` of a node's command line (``node_args``), None if it has none."""
    return argv[argv.index("--name") + 1] if "--name" in argv[:-1] else None


def plan_nodes(nodes: int, fronts: int = 1, placement: str = "nodes") -> list[NodePlan]:
    """Which node hosts what: the same members either way, so a cluster's output does not depend on it.

    ``nodes``: ``nodes`` processes, node ``n`` runs worker ``n``; front ``f``
    and the barrier of its partition run on node ``f``, the acker on node 0.
    ``separate``: one process per member (the layout before nodes existed),
    kept to measure what co-location saves.
    """
    if placement == "separate":
        return ([NodePlan(ACKER, acker=True)] + [NodePlan(f"{WORKER}{i}", worker=i) for i in range(nodes)]
                + [NodePlan(f"{FRONT}{f}", front=f) for f in range(fronts)]
                + [NodePlan(f"{BARRIER}{f}", barriers=(f,)) for f in range(fronts)])
    if placement != "nodes":
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if fronts > nodes:
        raise ValueError(f"{fronts} fronts need at least {fronts} nodes (a node hosts at most one front); "
                         f"got --nodes {nodes}")
    return [NodePlan(f"{NODE}{n}", acker=n == 0, worker=n, front=n if n < fronts else None,
                     barriers=(n,) if n < fronts else ()) for n in range(nodes)]


def node_args(plan: NodePlan, *, zookeeper: str, cluster: str, data_dir: str, host: str = "127.0.0.1",
              port: int = 0, exactly_once: bool = True, log_file: str | None = None,
              log_format: str = "text", snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS,
              allow_modules: Iterable[str] = (), log_segment_bytes: int | None = None,
              tls_dir: str | None = None, stall_timeout: float | None = None, memory_budget_mb: int = 0) -> list[str]:
    """Interpreter arguments (after ``python``) that run one node: the one place a plan becomes a command line.

    ``exactly_once=False`` makes barriers release on arrival (guarantees off).
    ``allow_modules``: the node's ``--allow-module`` list (modules its graphs may use besides their own package).
    """
    args = ["-m", "flamestream", NODE, "--zookeeper", zookeeper, "--cluster", cluster, "--name", plan.name,
            "--host", host, "--port", str(port)]
    args += ["--acker"] if plan.acker else []
    args += ["--worker", str(plan.worker)] if plan.worker is not None else []
    args += ["--front", str(plan.front)] if plan.front is not None else []
    args += ["--barrier", ",".join(map(str, plan.barriers))] if plan.barriers else []
    args += ["--data-dir", data_dir]  # input logs, topics, snapshots: one directory the cluster shares
    if plan.barriers and not exactly_once:
        args += ["--release", "on-arrival"]
    if plan.worker is not None and snapshot_interval_ms != DEFAULT_SNAPSHOT_INTERVAL_MS:
        args += ["--snapshot-interval-ms", str(snapshot_interval_ms)]
    if plan.worker is not None and memory_budget_mb:
        args += ["--memory-budget-mb", str(memory_budget_mb)]
    if plan.acker and stall_timeout is not None:
        args += ["--stall-timeout", f"{stall_timeout:g}"]
    if plan.front is not None and log_segment_bytes is not None:
        args += ["--log-segment-bytes", str(log_segment_bytes)]
    if log_file is not None:
        args += ["--log-file", log_file]
    if log_format != "text":
        args += ["--log-format", log_format]
    for module in allow_modules:
        args += ["--allow-module", module]
    if tls_dir:
        args += ["--tls-dir", tls_dir]
    return args


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
    output: str = ""
    """Its stdout and stderr (for a node: the ready line, and anything that fails before logging is set up)."""
    helpers: list[tuple[int, str | None]] = field(default_factory=list)
    members: list[tuple[str, str]] = field(default_factory=list)
    """(role, member name) a node hosts."""
    args: list[str] = field(default_factory=list)
    """Its command line after the interpreter: how the supervisor starts it again."""
    restarts: int = 0
    """How often the supervisor restarted it after a crash."""


@dataclass
class ClusterState:
    cluster: str
    zookeeper: str
    own_zookeeper: bool
    processes: list[ProcessRecord] = field(default_factory=list)
    exactly_once: bool = True
    log_format: str = "text"
    snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS
    """How ``up`` started the nodes: nodes that ``scale`` adds later start the same way."""
    allow_modules: list[str] = field(default_factory=list)
    """The nodes' ``--allow-module`` list (kept so that nodes ``scale`` adds run the same graphs)."""
    log_segment_bytes: int | None = None
    """The fronts' input-log segment size (None: the node's default)."""
    tls_dir: str = ""
    """The credentials directory of a secured cluster ("" = ``--insecure``); ``scale`` starts nodes with it too."""
    memory_budget_mb: int = 0
    """Every worker's ``--memory-budget-mb`` (0: none)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        records = [ProcessRecord(**{**p, "helpers": [(int(pid), started) for pid, started in p.get("helpers", [])],
                                    "members": [(str(role), str(name)) for role, name in p.get("members", [])]})
                   for p in data["processes"]]
        return cls(cluster=str(data["cluster"]), zookeeper=str(data["zookeeper"]),
                   own_zookeeper=bool(data["own_zookeeper"]), processes=records,
                   exactly_once=bool(data.get("exactly_once", True)), log_format=str(data.get("log_format", "text")),
                   snapshot_interval_ms=int(data.get("snapshot_interval_ms", DEFAULT_SNAPSHOT_INTERVAL_MS)),
                   allow_modules=[str(m) for m in data.get("allow_modules", [])],
                   log_segment_bytes=data.get("log_segment_bytes"), tls_dir=str(data.get("tls_dir", "")),
                   memory_budget_mb=int(data.get("memory_budget_mb", 0)))

    def endpoints(self) -> list[tuple[str, str]]:
        """(name, address and hosted members) of ZooKeeper and every node, in start order."""
        nodes = [(p.name, f"{p.address}  {' '.join(name for _, name in p.members)}")
                 for p in self.processes if p.role == NODE]
        return [(ZOOKEEPER, self.zookeeper), *nodes]


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def supervising_path(data_dir: Path) -> Path:
    return data_dir / SUPERVISING_FILE


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
    return (fields[0] != "Z" or _threads_left(pid)) and (started is None or fields[19] == started)


def _threads_left(pid: int) -> bool:
    """Whether a zombie ``pid`` still has threads: its leader exited first, and until the others do (one busy in
    an fsync when SIGKILL came), the process's files stay open and their locks held.  Its successor, started at
    once, found the input log still locked ("already open for writing") and failed."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


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
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same as a server's listening socket: connections in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(host_port(address))
        except OSError:
            return False
        return True


def stop_cluster(state: ClusterState, data_dir: Path) -> list[str]:
    """Stop every recorded process, ZooKeeper last; returns addresses still bound afterwards.

    Services go first so they can close their ZooKeeper sessions (and drop
    their ephemeral membership) while ZooKeeper is still there to hear it.
    The supervisor goes before them, and then the state file in ``data_dir``
    is read again: a node it restarted since ``state`` was read (a bench's
    state is read at ``up``) runs under a pid only the file knows, and was
    once left running after the rest had stopped.
    Raises StopError if a process survives SIGKILL or cannot be signalled.
    """
    _stop_group([p for p in state.processes if p.role == SUPERVISOR], SERVICE_GRACE)  # or it restarts the rest
    processes = list(state.processes)
    with contextlib.suppress(ValueError):  # a damaged file: what ``state`` holds is all there is
        latest = load_state(data_dir)
        known = {(p.pid, p.started) for p in processes}
        processes += [p for p in latest.processes if (p.pid, p.started) not in known] if latest else []
    services = [p for p in processes if p.role not in (ZOOKEEPER, SUPERVISOR)]
    zookeeper = [p for p in processes if p.role == ZOOKEEPER]
    _stop_group(services, SERVICE_GRACE)
    _stop_group(zookeeper, ZOOKEEPER_GRACE)
    addresses = sorted({p.address for p in processes if p.address})
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


def child_env() -> dict[str, str]:
    """The services' environment: unbuffered output, so their logs are current."""
    return dict(os.environ, PYTHONUNBUFFERED="1")


@dataclass
class UpOptions:
    data_dir: Path
    nodes: int = 2
    """Also the number of workers: one per node."""
    fronts: int = 1
    placement: str = "nodes"
    """``nodes`` (co-located roles) or ``separate`` (a process per role); see ``plan_nodes``."""
    log_format: str = "text"
    snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS
    zookeeper: str | None = None
    cluster: str = "default"
    timeout: float = DEFAULT_TIMEOUT
    exactly_once: bool = True
    """False: barriers release on arrival (guarantees off, for benchmarks against peers without them)."""
    allow_modules: tuple[str, ...] = ()
    """Every node's ``--allow-module``: modules the graphs may use besides their own package."""
    log_segment_bytes: int | None = None
    """The fronts' input-log segment size (None: the node's default, 64 MiB)."""
    tls_dir: Path | None = None
    """Credentials are created here (what is missing) and every node serves mTLS with them; None: the cluster is
    insecure (``up --insecure``; the launcher's own default, which ``up``'s is not)."""
    supervise: bool = True
    """Leave a supervisor running that restarts crashed nodes (``flamestream.runtime.restarts``)."""
    spares: bool = True
    """The supervisor keeps a warm spare per node (``flamestream.runtime.spares``)."""
    hang_timeout: float | None = None
    """The supervisor's ``--hang-timeout`` (None: its default)."""
    stall_timeout: float | None = None
    """The acker's ``--stall-timeout`` (None: its default)."""
    memory_budget_mb: int = 0
    """Every worker's ``--memory-budget-mb`` (0: none)."""


class _Launcher:
    """Spawns the processes of one ``up`` and records each in the state file immediately."""

    def __init__(self, options: UpOptions, state: ClusterState) -> None:
        self.options = options
        self.data_dir = options.data_dir
        self.state = state
        self.popen: dict[str, subprocess.Popen[bytes]] = {}
        self.log_start: dict[str, int] = {}
        self.env = child_env()

    def spawn(self, role: str, name: str, args: list[str], log: Path | None = None) -> ProcessRecord:
        """Start ``args``; its stdout and stderr go to ``DIR/logs/<name>.out``, which is also its log unless it
        writes one itself (``log``: a node's structured log stays free of anything else)."""
        output = self.data_dir / LOG_DIR / f"{name}.out"
        argv = [sys.executable, *args]
        with output.open("ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
            out.flush()
            self.log_start[name] = out.tell()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.data_dir, env=self.env, start_new_session=True)
        record = ProcessRecord(role=role, name=name, pid=proc.pid, started=start_time(proc.pid), log=str(log or output),
                               output=str(output), args=args)
        self.popen[name] = proc
        self.state.processes.append(record)
        save_state(self.data_dir, self.state)
        return record

    def failure(self, record: ProcessRecord, reason: str) -> StartError:
        return StartError(record.name, reason, record.log, record.output)

    def check_running(self, record: ProcessRecord) -> None:
        code = self.popen[record.name].poll()
        if code is not None:
            raise self.failure(record, f"exited with code {code} during start-up")

    def start_zookeeper(self, deadline: float) -> None:
        record = self.spawn(ZOOKEEPER, ZOOKEEPER, ["-m", "flamestream.coordinator", "zookeeper", "--data-dir",
                                                   str(self.data_dir / ZOOKEEPER)])
        while True:
            with open(record.output, "rb") as f:
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
        self.wait_until(record, deadline, lambda: zookeeper_serving(record.address),
                        f"does not serve requests within {self.options.timeout:g}s")
        self.state.zookeeper = record.address
        save_state(self.data_dir, self.state)

    def start_nodes(self, plans: list[NodePlan]) -> list[ProcessRecord]:
        # One data directory for all: fronts and barriers keep their logs in
        # per-id subdirectories of it (input/front-<id>, topic/<partition>),
        # where replay and the oracle checks find every front's input.
        records = []
        for plan in plans:
            log = self.data_dir / LOG_DIR / f"{plan.name}.log"
            record = self.spawn(NODE, plan.name, node_args(
                plan, zookeeper=self.state.zookeeper, cluster=self.state.cluster, data_dir=str(self.data_dir),
                exactly_once=self.state.exactly_once, log_file=str(log), log_format=self.state.log_format,
                snapshot_interval_ms=self.state.snapshot_interval_ms, allow_modules=self.state.allow_modules,
                log_segment_bytes=self.state.log_segment_bytes, tls_dir=self.state.tls_dir or None,
                stall_timeout=self.options.stall_timeout, memory_budget_mb=self.state.memory_budget_mb), log)
            record.members = plan.members()
            records.append(record)
        save_state(self.data_dir, self.state)
        return records

    def wait_registered(self, store: ClusterStore, deadline: float, nodes: list[ProcessRecord]) -> None:
        """Block until ``nodes`` registered all their members in ZooKeeper; record the nodes' addresses."""
        while True:
            registered = {role: store.members(role) for role in SERVICE_ROLES}
            missing: list[ProcessRecord] = []
            for record in nodes:
                self.check_running(record)
                info = [registered[role].get(name, {}) for role, name in record.members]
                # Members left over from another run carry another node's name, and those of this node's dead
                # predecessor (killed within the session timeout) another pid: wait for this process's own.
                if any(entry.get("node") != record.name or entry.get("pid") != record.pid for entry in info):
                    missing.append(record)
                else:
                    record.address = str(info[0]["address"])
            if not missing:
                break
            if time.monotonic() >= deadline:
                raise self.failure(missing[0], f"did not register in ZooKeeper within {self.options.timeout:g}s")
            time.sleep(0.1)
        save_state(self.data_dir, self.state)

    def wait_serving(self, deadline: float, nodes: list[ProcessRecord]) -> None:
        """Block until ``nodes`` answer the standard gRPC health check with SERVING."""
        for record in nodes:
            while True:
                self.check_running(record)
                status = health_status(record.address, self.state.tls_dir or None)
                if status == "SERVING":
                    break
                if time.monotonic() >= deadline:
                    raise self.failure(record, f"registered {record.address} but its health check says {status} "
                                               f"after {self.options.timeout:g}s")
                time.sleep(0.1)

    def wait_supervising(self, deadline: float, supervisor: ProcessRecord) -> None:
        """Block until ``supervisor`` says it watches the nodes: ``DIR/supervising`` holds its pid.

        Why: ``up`` returned while the supervisor was still importing (0.3 s
        of CPU in its first half second), which then ran alongside whatever
        came next — the first seconds of a benchmark, measured, on two cores —
        and a node that died meanwhile waited for it to be restarted.
        """
        path = supervising_path(self.data_dir)

        def supervising() -> bool:
            try:
                return int(path.read_text()) == supervisor.pid
            except (FileNotFoundError, ValueError):  # not written yet, or read while being written
                return False

        self.wait_until(supervisor, deadline, supervising,
                        f"did not start supervising within {self.options.timeout:g}s")

    def wait_until(self, record: ProcessRecord, deadline: float, ready: Callable[[], bool], late: str) -> None:
        """Block until ``ready()`` while ``record`` runs; ``failure(record, late)`` once ``deadline`` passed."""
        while not ready():
            self.check_running(record)
            if time.monotonic() >= deadline:
                raise self.failure(record, late)
            time.sleep(0.05)


_HEALTH_CHECK = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/Check"


def health_channel(address: str, tls_dir: str | None = None) -> grpc.Channel:
    """A channel for health checks of ``address`` (over TLS as a client with ``tls_dir``)."""
    if tls_dir:
        return grpc.secure_channel(address, Credentials.load(tls_dir).channel_credentials(with_tokens=False))
    return grpc.insecure_channel(address)


def health_status(address: str, tls_dir: str | None = None, channel: grpc.Channel | None = None) -> str:
    """The health status name of ``address``, or why it could not be asked; on ``channel`` if given (a caller
    that asks again and again keeps one: a new channel is a new connection, and a TLS handshake on both ends).

    Called through the method path because the typing stubs of the generated
    HealthStub declare no methods.
    """
    with contextlib.ExitStack() as own:
        if channel is None:
            channel = own.enter_context(health_channel(address, tls_dir))
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
                         own_zookeeper=options.zookeeper is None, exactly_once=options.exactly_once,
                         log_format=options.log_format, snapshot_interval_ms=options.snapshot_interval_ms,
                         allow_modules=list(options.allow_modules), log_segment_bytes=options.log_segment_bytes,
                         tls_dir=str(options.tls_dir.resolve()) if options.tls_dir else "",
                         memory_budget_mb=options.memory_budget_mb)
    plans = plan_nodes(options.nodes, options.fronts, options.placement)
    if options.tls_dir is not None:
        tls.init(options.tls_dir, [(plan.name, "127.0.0.1") for plan in plans])
    launcher = _Launcher(options, state)
    deadline = time.monotonic() + options.timeout
    try:
        if options.zookeeper is None:
            launcher.start_zookeeper(deadline)
        if options.tls_dir is not None:
            tls.record_cluster(options.tls_dir, state.zookeeper, options.cluster)
        store = ClusterStore(state.zookeeper, cluster=options.cluster,
                             timeout=max(1.0, min(10.0, deadline - time.monotonic())), **store_auth(state))
        try:
            store.start()
        except TimeoutError as exc:
            own = [p.log for p in state.processes if p.role == ZOOKEEPER]
            raise StartError(ZOOKEEPER, str(exc), *own[:1]) from None
        try:
            _refuse_live_cluster(store, data_dir)
            nodes = launcher.start_nodes(plans)
            launcher.wait_registered(store, deadline, nodes)
        finally:
            store.stop()
        launcher.wait_serving(deadline, nodes)
        if options.supervise:
            hang = [] if options.hang_timeout is None else ["--hang-timeout", f"{options.hang_timeout:g}"]
            spares = [] if options.spares else ["--no-spares"]
            supervising_path(data_dir).unlink(missing_ok=True)  # a crashed run's
            supervisor = launcher.spawn(SUPERVISOR, SUPERVISOR, ["-m", "flamestream", "supervise", "--data-dir",
                                                                 str(data_dir), *hang, *spares])
            launcher.wait_supervising(deadline, supervisor)
    except BaseException:
        with contextlib.suppress(StopError):
            stop_cluster(state, data_dir)
        state_path(data_dir).unlink(missing_ok=True)
        raise
    return state


def store_auth(state: ClusterState) -> dict[str, Any]:
    """ClusterStore keywords of the launcher's own session: the ``service`` identity of a secured cluster,
    so the subtree it creates first is guarded from the start."""
    if not state.tls_dir:
        return {}
    credentials = Credentials.load(state.tls_dir)
    return {"auth": credentials.zookeeper_auth("service"), "writers": list(credentials.zookeeper.values())}


def _refuse_live_cluster(store: ClusterStore, data_dir: Path) -> None:
    """Refuse to start a cluster whose name another live cluster already uses in this ZooKeeper.

    Members a crashed run of this very cluster left behind (same host, same data
    dir) are not in the way: the new nodes replace them (``Node._register``).
    """
    here = placement(data_dir)
    foreign = sorted(f"{role}/{name} ({info.get('address', '?')}, data dir {info.get('data_dir', '?')})"
                     for role in SERVICE_ROLES for name, info in store.members(role).items()
                     if any(info.get(key) != value for key, value in here.items()))
    if foreign:
        raise StartError(NODE, f"cluster {store.cluster!r} already runs in ZooKeeper {store.hosts}: "
                               f"{', '.join(foreign)}; stop it or choose another --cluster")


def add_nodes(data_dir: Path, state: ClusterState, plans: list[NodePlan],
              timeout: float = DEFAULT_TIMEOUT) -> list[ProcessRecord]:
    """Start more nodes for a running cluster (``scale``); on failure they are stopped and forgotten again."""
    launcher = _Launcher(UpOptions(data_dir=data_dir, timeout=timeout), state)
    deadline = time.monotonic() + timeout
    nodes: list[ProcessRecord] = []
    try:
        with ClusterStore(state.zookeeper, cluster=state.cluster, **store_auth(state)) as store:
            nodes = launcher.start_nodes(plans)
            launcher.wait_registered(store, deadline, nodes)
        launcher.wait_serving(deadline, nodes)
    except BaseException:
        remove_nodes(data_dir, state, nodes)
        raise
    return nodes


def remove_nodes(data_dir: Path, state: ClusterState, nodes: list[ProcessRecord]) -> None:
    """Drop ``nodes`` from the state file, then stop them (SIGTERM, then SIGKILL): in that order, so the
    supervisor never sees them gone while still recorded, and restarts none of them."""
    state.processes = [p for p in state.processes if p not in nodes]
    save_state(data_dir, state)
    _stop_group(nodes, SERVICE_GRACE)


def respawn(data_dir: Path, record: ProcessRecord, spare: Spare | None = None) -> bool:
    """Start ``record``'s process again, with its arguments and on the port it had, so its address in the
    cluster's records and ticks stays right; its pid, start time and restart count are updated.

    With a ``spare`` still waiting, the spare becomes the process (``flamestream.runtime.spares``: it has
    imported everything already); returns whether it did.
    """
    args = list(record.args)
    if record.address and "--port" in args:
        args[args.index("--port") + 1] = str(host_port(record.address)[1])
    argv = [sys.executable, *args]
    with open(record.output, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} restart {record.restarts + 1}: "
                  f"{shlex.join(argv)}\n".encode())
        out.flush()
        warm = spare is not None and spare.become(args, record.output, data_dir)
        if warm:
            assert spare is not None
            record.pid, record.started = spare.process.pid, spare.started
        else:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=data_dir, env=child_env(), start_new_session=True)
            record.pid, record.started = proc.pid, start_time(proc.pid)
    record.restarts += 1
    return warm


def format_endpoints(endpoints: Iterable[tuple[str, str]]) -> str:
    rows = list(endpoints)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {address}" for name, address in rows)

