"""Restarts that always work: after kill -9, after an expired ZooKeeper session, and never onto a live cluster.

Each scenario is an ordinary incident that once left a data dir unstartable or
a cluster invisible (issue #12): the stale member of a killed node, sessions a
paused ZooKeeper expired, and an ``up`` that joined another live cluster of
the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import pytest

from flamestream.client import Client
from flamestream.cluster import ClusterStore
from flamestream.coordinator.zookeeper import ZooKeeperServer
from flamestream.runtime import launcher
from flamestream.runtime.spares import Spare
from tests.test_cluster_e2e import cli
from tests.test_nodes import eventually, health

pytestmark = pytest.mark.slow


def _up(data: Path, zookeeper: str, cluster: str) -> dict[str, Any]:
    up = cli("up", "--nodes", "2", "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster)
    assert up.returncode == 0, up.stdout + up.stderr
    return json.loads((data / "cluster.json").read_text())  # type: ignore[no-any-return]


def _down(data: Path) -> None:
    down = cli("down", "--data-dir", str(data))
    assert down.returncode == 0, down.stderr


def _node(state: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in state["processes"] if p["name"] == name)


def _counts(zookeeper: str, cluster: str, lines: list[str], group: str, expected: int) -> list[tuple[str, int]]:
    """Push ``lines`` and consume ``expected`` word-count records from the start of the topic."""
    with Client(zookeeper, cluster) as client:
        client.push(lines)
        # range first: zip stops on it without waiting for one more record (the consumer's idle timeout)
        records = [r.payload for _, r in zip(range(expected), client.consume(group=group, timeout=60), strict=False)]
    return sorted((r["word"], r["count"]) for r in records)



def test_up_returns_once_the_supervisor_watches_the_nodes(cluster_dir: Path, zookeeper: str,
                                                         cluster_name: str) -> None:
    """``up`` waits for the supervisor's word that it supervises (its pid in ``DIR/supervising``), so its start-up
    is over when ``up`` returns; ``down`` leaves no such word behind."""
    state = _up(cluster_dir, zookeeper, cluster_name)
    assert (cluster_dir / launcher.SUPERVISING_FILE).read_text() == str(_node(state, "supervisor")["pid"])
    _down(cluster_dir)
    assert not (cluster_dir / launcher.SUPERVISING_FILE).exists()


def test_up_right_after_a_kill_9_replaces_the_dead_nodes_members(cluster_dir: Path, zookeeper: str,
                                                                  cluster_name: str) -> None:
    state = _up(cluster_dir, zookeeper, cluster_name)
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    assert _counts(zookeeper, cluster_name, ["a b a"], "g", 3) == [("a", 1), ("a", 2), ("b", 1)]
    os.kill(_node(state, "node1")["pid"], signal.SIGKILL)
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        assert "worker1" in store.members("worker")  # its session outlives it by the session timeout
        _down(cluster_dir)
        state = _up(cluster_dir, zookeeper, cluster_name)  # at once, while the dead worker1 is still registered
        assert store.members("worker")["worker1"]["address"] == _node(state, "node1")["address"]
    # The node's own word for how it took the name, not a wall-clock bound that a loaded machine exceeds: it
    # replaced the dead incarnation's member rather than waiting for that session to expire.
    log = Path(_node(state, "node1")["log"]).read_text()
    assert "replacing member worker/worker1 left by a dead incarnation" in log, log
    assert "waiting for its session to expire" not in log, log
    assert health(_node(state, "node1")["address"], "worker1", state["tls_dir"]) == "SERVING"


def test_members_register_again_after_zookeeper_expired_their_sessions(tmp_path: Path, cluster_dir: Path,
                                                                       cluster_name: str) -> None:
    server = ZooKeeperServer(tmp_path / "zookeeper")
    server.start()
    try:
        zookeeper = server.address
        _up(cluster_dir, zookeeper, cluster_name)
        assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper,
                   "--cluster", cluster_name).returncode == 0
        assert _counts(zookeeper, cluster_name, ["x y"], "g", 2) == [("x", 1), ("y", 1)]
        with ClusterStore(zookeeper, cluster=cluster_name) as store:
            before = {name: info["address"] for name, info in store.members("front").items()}
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGSTOP)  # longer than the 10 s session timeout: every session expires
        time.sleep(12)
        os.killpg(server.pid, signal.SIGCONT)
        with ClusterStore(zookeeper, cluster=cluster_name) as store:
            # Positive signal first: the members came back (with a new session: their nodes were re-created).
            eventually(lambda: {n: i["address"] for n, i in store.members("front").items()} == before and
                       len(store.members("worker")) == 2, "the members to register again", timeout=60)
        counts = _counts(zookeeper, cluster_name, ["x z"], "g", 4)
        assert counts == [("x", 1), ("x", 2), ("y", 1), ("z", 1)]
        _down(cluster_dir)
    finally:
        server.stop()


def test_up_refuses_a_zookeeper_where_a_live_cluster_of_that_name_runs(tmp_path: Path, cluster_dir: Path,
                                                                        zookeeper: str, cluster_name: str) -> None:
    state = _up(cluster_dir, zookeeper, cluster_name)
    other = tmp_path / "other"
    up = cli("up", "--nodes", "1", "--data-dir", str(other), "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert up.returncode != 0
    assert f"cluster {cluster_name!r} already runs" in up.stderr and "front/front0" in up.stderr
    assert not (other / "cluster.json").exists()
    assert health(_node(state, "node0")["address"], "", state["tls_dir"]) == "SERVING"  # the running one is untouched


def test_a_tick_that_cannot_be_loaded_is_reported_and_a_good_deploy_recovers(cluster_dir: Path, zookeeper: str,
                                                                             cluster_name: str) -> None:
    state = _up(cluster_dir, zookeeper, cluster_name)
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    node1 = _node(state, "node1")
    # As the cluster's own services write (a secured cluster's subtree refuses writes without its digest).
    recorded = launcher.load_state(cluster_dir)
    assert recorded is not None
    with ClusterStore(zookeeper, cluster=cluster_name, **launcher.store_auth(recorded)) as store:
        latest = store.latest_tick()
        assert latest is not None
        bad = json.loads(json.dumps(latest[1]).replace("examples.wordcount:", "no_such_module_anywhere:"))
        assert bad != latest[1]
        bad.pop("previous", None)
        store.publish_tick(bad)  # as if written by hand: deploy itself would refuse it
    eventually(lambda: health(node1["address"], "worker1", state["tls_dir"]) == "NOT_SERVING",
               "worker1 to report the bad tick")
    log = Path(node1["log"]).read_text()
    assert "cannot deploy tick" in log and "no_such_module_anywhere" in log
    assert _node(state, "node1")["pid"] and os.kill(node1["pid"], 0) is None  # reported, not crashed
    # The bad tick started afresh and never ran: there is no state to hand over from it.
    deploy = cli("deploy", "examples/wordcount.py", "--fresh", "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert deploy.returncode == 0, deploy.stderr
    eventually(lambda: health(node1["address"], "", state["tls_dir"]) == "SERVING",
               "node1 to serve again after a good deploy")
    assert _counts(zookeeper, cluster_name, ["p q p"], "g", 3) == [("p", 1), ("p", 2), ("q", 1)]


SPARE = ["-m", "flamestream", "spare"]


def _spares(supervisor: int) -> dict[int, str]:
    """pid -> command line of the supervisor's warm spares."""
    spares = {}
    for child in psutil.Process(supervisor).children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[1:4] == SPARE:
                spares[child.pid] = " ".join(child.cmdline())
    return spares


def test_a_restart_is_a_warm_spare_that_becomes_the_node(cluster_dir: Path, zookeeper: str,
                                                          cluster_name: str) -> None:
    """The supervisor keeps a spare per node (``flamestream.runtime.spares``); a killed node's restart is its
    spare, with the node's command line and output file, and the cluster recovers exactly; ``down`` leaves no
    spare behind."""
    state = _up(cluster_dir, zookeeper, cluster_name)
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    assert _counts(zookeeper, cluster_name, ["a"], "g", 1) == [("a", 1)]
    supervisor = _node(state, "supervisor")["pid"]
    spares = eventually(lambda: (found := _spares(supervisor)) and len(found) == 2 and found, "a spare per node")
    os.kill(_node(state, "node1")["pid"], signal.SIGKILL)
    eventually(lambda: _node(json.loads((cluster_dir / "cluster.json").read_text()), "node1")["restarts"] == 1,
               "node1's restart")
    node1 = _node(json.loads((cluster_dir / "cluster.json").read_text()), "node1")
    assert node1["pid"] in spares
    # What it was started as, naming its cluster; its process name says which node it became.
    assert psutil.Process(node1["pid"]).cmdline()[1:] == [*SPARE, "--data-dir", str(cluster_dir.resolve())]
    eventually(lambda: psutil.Process(node1["pid"]).name() == "fs node1", "the spare named as the node it became")
    assert "a warm spare" in (cluster_dir / "logs" / "supervisor.out").read_text()
    assert _counts(zookeeper, cluster_name, ["a"], "g", 2) == [("a", 1), ("a", 2)]  # recovered, exactly
    assert health(node1["address"], "worker1", state["tls_dir"]) == "SERVING"
    remaining = list(_spares(supervisor))
    _down(cluster_dir)
    for pid in remaining:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(10)  # raises TimeoutExpired if a spare outlives its supervisor


def test_stopping_from_the_state_read_at_up_also_stops_a_node_restarted_since(cluster_dir: Path, zookeeper: str,
                                                                              cluster_name: str) -> None:
    """A bench stops its cluster with the state ``up`` returned; a node the supervisor restarted after that runs
    under a pid only the state file knows, and was once left running (using CPU in the next bench's run)."""
    at_up = launcher.ClusterState.from_json(json.dumps(_up(cluster_dir, zookeeper, cluster_name)))
    os.kill(_node(asdict(at_up), "node1")["pid"], signal.SIGKILL)
    restarted = eventually(lambda: (node := _node(json.loads((cluster_dir / "cluster.json").read_text()), "node1"))
                           ["restarts"] == 1 and node, "node1's restart")
    assert launcher.is_alive(restarted["pid"], restarted["started"])
    launcher.stop_cluster(at_up, cluster_dir)
    assert not launcher.is_alive(restarted["pid"], restarted["started"])
    assert not launcher.alive_processes(at_up)


def test_a_spare_runs_the_command_it_is_handed_and_a_dead_one_is_refused(tmp_path: Path) -> None:
    dead = Spare.start(tmp_path)
    dead.process.kill()
    dead.process.wait()
    assert not dead.become(["-m", "flamestream", "--help"], str(tmp_path / "dead.out"), tmp_path)

    spare = Spare.start(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    assert spare.become(["-m", "flamestream", "status", "--data-dir", "here"], str(tmp_path / "spare.out"), work)
    assert spare.process.wait(60) != 0  # no cluster in work/here: status says so, on the output it was handed
    assert f"no cluster is recorded in {work / 'here'}" in (tmp_path / "spare.out").read_text()


ZOMBIE_LEADER = """
import ctypes, fcntl, os, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("locked", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # the main thread (the leader) exits; the other thread holds on
"""


def _locked(directory: Path) -> bool:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_process_whose_leader_exited_first_is_alive_until_its_last_thread_is(tmp_path: Path) -> None:
    """A SIGKILLed node's leader thread can be a zombie while another thread is still exiting (busy in an fsync):
    its files and their locks are not released yet, so its successor must not start (it found the input log
    locked and failed)."""
    process = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"locked\n"
        eventually(lambda: (launcher._proc_stat(process.pid) or ["gone"])[0] == "Z", "the leader a zombie")
        assert _locked(tmp_path), "the remaining thread holds the lock"
        assert launcher.is_alive(process.pid, launcher.start_time(process.pid))
        process.kill()
        eventually(lambda: not launcher.is_alive(process.pid, None), "the whole process gone")
        assert not _locked(tmp_path)
    finally:
        process.kill()
        process.wait()
