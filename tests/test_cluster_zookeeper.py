"""ClusterStore and the coordinator's ZooKeeper server against a real ZooKeeper.

One server is shared by the module; each test works in its own cluster name so
tests cannot see each other's nodes.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flamestream.cluster import ClusterStore, host_port
from flamestream.coordinator import ZooKeeperError, ZooKeeperServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

OpenStore = Callable[[str], ClusterStore]


def _ruok(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(b"ruok")
        reply = b""
        while chunk := sock.recv(64):
            reply += chunk
    return reply


def _port_is_free(port: int) -> bool:
    """Nothing listens, and a new server could bind the port (as the JVM does, with SO_REUSEADDR)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (e.g. a private zoo.cfg path)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def open_store(zk: ZooKeeperServer) -> Iterator[OpenStore]:
    stores: list[ClusterStore] = []

    def open_(cluster: str) -> ClusterStore:
        store = ClusterStore(zk.address, cluster=cluster)
        store.start()
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.stop()


# -- the server ---------------------------------------------------------------


def test_a_members_address_is_read_one_way_everywhere() -> None:
    assert host_port("127.0.0.1:5001") == ("127.0.0.1", 5001)
    assert host_port("node-1.example:80") == ("node-1.example", 80)
    assert host_port("[::1]:5001") == ("::1", 5001)  # the port after the last colon, the brackets dropped
    for malformed in ("127.0.0.1", "host:", "host:port"):
        with pytest.raises(ValueError):
            host_port(malformed)


def test_server_start_stop_leaves_no_process_or_port(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    port = server.port
    assert server.address == f"127.0.0.1:{port}"
    assert _port_is_free(port)
    with server:
        pid = server.pid
        assert pid is not None
        assert server.running
        assert _ruok(port) == b"imok"
        assert not _port_is_free(port)
        config = (tmp_path / "zk" / "zoo.cfg").read_text()
        assert f"clientPort={port}\n" in config
        assert "admin.enableServer=false\n" in config
        assert f"dataDir={tmp_path / 'zk' / 'data'}\n" in config
    assert not server.running
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert _port_is_free(port)
    # log4j was wired up: the server's own start-up messages reached the file.
    assert f"127.0.0.1:{port}" in server.log_path.read_text()


def test_server_refuses_a_port_in_use(tmp_path: Path, zk: ZooKeeperServer) -> None:
    server = ZooKeeperServer(tmp_path, port=zk.port)
    with pytest.raises(ZooKeeperError, match=rf"127\.0\.0\.1:{zk.port} is already in use"):
        server.start()
    assert server.pid is None
    assert _ruok(zk.port) == b"imok"


def test_server_reports_a_jvm_that_dies_during_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+FlameStreamNoSuchOption")
    server = ZooKeeperServer(tmp_path)
    with pytest.raises(ZooKeeperError, match="exited with code") as excinfo:
        server.start()
    assert "FlameStreamNoSuchOption" in str(excinfo.value)  # the log tail is part of the message
    assert server.pid is None
    assert _port_is_free(server.port)


def test_server_start_timeout_cleans_up(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path)
    with pytest.raises(ZooKeeperError, match=r"did not start serving within 0s"):
        server.start(timeout=0)
    assert server.pid is None
    assert _processes_mentioning(str(tmp_path / "zoo.cfg")) == []
    assert _port_is_free(server.port)


def test_server_explains_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ZooKeeperError, match=r"apt-get install -y zookeeper default-jre-headless"):
        ZooKeeperServer(tmp_path).start()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_prints_address_and_exits_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flamestream.coordinator", "zookeeper", "--data-dir", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        assert ready, "no readiness line within 30s"
        line = proc.stdout.readline()
        match = re.fullmatch(r"zookeeper 127\.0\.0\.1:(\d+)\n", line)
        assert match, f"unexpected first line {line!r}"
        port = int(match[1])
        assert _ruok(port) == b"imok"
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stdout.read() == ""
    assert _port_is_free(port)
    assert _processes_mentioning(str(tmp_path / "zoo.cfg")) == []


@pytest.mark.parametrize(
    "args",
    [
        ["zookeeper"],
        ["zookeeper", "--data-dir", "x", "--port", "nope"],
        ["zookeeper", "--data-dir", "x", "--port", "0"],
    ],
)
def test_cli_rejects_bad_arguments(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flamestream.coordinator", *args], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "usage: python -m flamestream.coordinator" in result.stderr
    assert result.stdout == ""


# -- membership ---------------------------------------------------------------


def test_ephemeral_members_disappear_with_their_session(open_store: OpenStore, cluster: str) -> None:
    workers, observer = open_store(cluster), open_store(cluster)
    workers.register("worker", "w1", {"address": "127.0.0.1:5001"})
    workers.register("worker", "w2", {"address": "127.0.0.1:5002"})
    observer.register("front", "f1", {"address": "127.0.0.1:6001"})

    assert observer.wait_for_members("worker", 2, timeout=5) == {
        "w1": {"address": "127.0.0.1:5001"},
        "w2": {"address": "127.0.0.1:5002"},
    }
    assert workers.members("front") == {"f1": {"address": "127.0.0.1:6001"}}

    workers.stop()
    assert _wait_until(lambda: observer.members("worker") == {}, timeout=5), observer.members("worker")
    assert observer.members("front") == {"f1": {"address": "127.0.0.1:6001"}}


def test_register_refuses_a_name_held_by_a_live_session(open_store: OpenStore, cluster: str) -> None:
    first, second = open_store(cluster), open_store(cluster)
    first.register("worker", "w1", {"address": "a"})
    with pytest.raises(ValueError, match="worker/w1 is already registered"):
        second.register("worker", "w1", {"address": "b"})
    assert second.members("worker") == {"w1": {"address": "a"}}


def test_wait_for_members_wakes_on_registration_and_times_out_clearly(open_store: OpenStore, cluster: str) -> None:
    waiter, joiner = open_store(cluster), open_store(cluster)
    joiner.register("acker", "a1", {})
    timer = threading.Timer(0.3, joiner.register, args=("acker", "a2", {"n": 2}))
    timer.start()
    try:
        started = time.monotonic()
        assert waiter.wait_for_members("acker", 2, timeout=10) == {"a1": {}, "a2": {"n": 2}}
        assert time.monotonic() - started < 5
    finally:
        timer.join()

    with pytest.raises(TimeoutError, match=r"waiting for 3 'acker' members .*: 2 registered \['a1', 'a2'\]"):
        waiter.wait_for_members("acker", 3, timeout=0.2)


# -- ticks ----------------------------------------------------------------------


def test_ticks_are_numbered_in_publication_order(open_store: OpenStore, cluster: str) -> None:
    store = open_store(cluster)
    assert store.ticks() == []
    assert store.latest_tick() is None
    published = [{"tick": i, "graph": {"nodes": ["a", "b"]}, "starts": [-(2**31), i]} for i in range(3)]
    assert [store.publish_tick(tick) for tick in published] == [0, 1, 2]
    assert store.ticks() == list(enumerate(published))
    assert store.latest_tick() == (2, published[2])


def test_watch_ticks_delivers_existing_then_new_ticks_exactly_once_in_order(
    open_store: OpenStore, cluster: str
) -> None:
    publisher, watcher = open_store(cluster), open_store(cluster)
    for i in range(3):
        publisher.publish_tick({"early": i})

    received: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def record(n: int, tick: dict[str, Any]) -> None:
        with lock:
            received.append((n, tick))

    watcher.watch_ticks(record)
    assert received == [(0, {"early": 0}), (1, {"early": 1}), (2, {"early": 2})]

    # Two independent sessions publish at once: numbers must never collide.
    publishers = [publisher, open_store(cluster)]
    numbers: list[list[int]] = [[], []]

    def publish(k: int) -> None:
        for i in range(10):
            numbers[k].append(publishers[k].publish_tick({"publisher": k, "i": i}))

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(numbers[0] + numbers[1]) == list(range(3, 23))
    assert numbers[0] == sorted(numbers[0]) and numbers[1] == sorted(numbers[1])

    assert _wait_until(lambda: len(received) >= 23, timeout=10), len(received)
    time.sleep(0.3)  # give a duplicate delivery the chance to show up
    with lock:
        assert [n for n, _ in received] == list(range(23))
        assert received == publisher.ticks()


def test_watch_ticks_keeps_delivering_after_a_failing_callback(open_store: OpenStore, cluster: str) -> None:
    store = open_store(cluster)
    store.publish_tick({"bad": True})
    seen: list[int] = []

    def callback(n: int, tick: dict[str, Any]) -> None:
        seen.append(n)
        if tick.get("bad"):
            raise RuntimeError("callback failure")

    store.watch_ticks(callback)
    store.publish_tick({"bad": False})
    assert _wait_until(lambda: seen == [0, 1], timeout=5), seen
    time.sleep(0.2)
    assert seen == [0, 1]


# -- isolation and validation ---------------------------------------------------------


def test_clusters_do_not_see_each_other(open_store: OpenStore, cluster: str) -> None:
    a, b = open_store(f"{cluster}-a"), open_store(f"{cluster}-b")
    a.register("worker", "w1", {"address": "x"})
    assert a.publish_tick({"cluster": "a"}) == 0

    assert b.members("worker") == {}
    assert b.ticks() == []
    assert b.latest_tick() is None
    assert b.publish_tick({"cluster": "b"}) == 0
    assert a.ticks() == [(0, {"cluster": "a"})]
    assert b.ticks() == [(0, {"cluster": "b"})]
    assert a.base != b.base


BAD_NAMES = ["", "a/b", ".", "..", "tab\there"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_names_are_rejected(open_store: OpenStore, cluster: str, bad: str) -> None:
    store = open_store(cluster)
    calls: list[Callable[[], object]] = [
        lambda: store.register(bad, "w1", {}),
        lambda: store.register("worker", bad, {}),
        lambda: store.members(bad),
        lambda: store.wait_for_members(bad, 1, timeout=0.1),
        lambda: ClusterStore(store.hosts, cluster=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="must"):
            call()
    assert store.members("worker") == {}


def test_invalid_numbers_and_roots_are_rejected(open_store: OpenStore, cluster: str) -> None:
    store = open_store(cluster)
    with pytest.raises(ValueError, match="count must be a non-negative integer"):
        store.wait_for_members("worker", -1, timeout=0.1)
    with pytest.raises(ValueError, match="absolute ZooKeeper path"):
        ClusterStore(store.hosts, root="flamestream")
    with pytest.raises(ValueError, match="root path component"):
        ClusterStore(store.hosts, root="/a//b")
