"""Node processes for real: placement, health per role, and failures that show (logged, NOT_SERVING).

The oracle checks of whole workloads over each placement (one node hosting
every role, several nodes, a process per role) are in tests/test_cluster_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2

from flamestream.client import Client
from flamestream.wire.security import Credentials
from tests.loopback import connections_to
from tests.test_cluster_e2e import cli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def health(address: str, service: str, tls_dir: str = "") -> str:
    """The node's health status for ``service``; ``tls_dir``: a secured cluster's credentials (its ``cluster.json``
    ``tls_dir``; "" for plaintext), whose client certificate the health service takes without a token."""
    with (grpc.secure_channel(address, Credentials.load(tls_dir).channel_credentials(with_tokens=False)) if tls_dir
          else grpc.insecure_channel(address)) as channel:
        check = channel.unary_unary(HEALTH_CHECK, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
        reply = check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def eventually(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def two_nodes(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    data = tmp_path / "cluster"
    up = cli("up", "--nodes", "2", "--log-format", "json", "--data-dir", str(data), "--zookeeper", zookeeper,
             "--cluster", cluster_name)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield data, json.loads((data / "cluster.json").read_text())
    finally:
        down = cli("down", "--data-dir", str(data))
        assert down.returncode == 0, down.stderr


def test_up_places_roles_on_nodes_and_each_role_has_health(two_nodes: tuple[Path, dict[str, Any]]) -> None:
    data, state = two_nodes
    nodes = {p["name"]: p for p in state["processes"] if p["role"] == "node"}
    assert {name: [member for _, member in p["members"]] for name, p in nodes.items()} == {
        "node0": ["acker", "worker0", "front0", "barrier0"], "node1": ["worker1"]}
    for node in nodes.values():
        for service in ["", *(member for _, member in node["members"])]:
            assert health(node["address"], service, state["tls_dir"]) == "SERVING", (node["name"], service)
    # The structured log: one JSON object per line, naming node and role.
    entries = [json.loads(line) for line in (data / "logs" / "node0.log").read_text().splitlines()]
    assert any(e["node"] == "node0" and e["level"] == "INFO" and "serving acker, worker0, front0, barrier0" in
               e["message"] for e in entries)


def streams_to(node: dict[str, Any]) -> int:
    """Frames connections (streams) to ``node``: to the port it listens on besides its gRPC address's.  Only its
    peers open those, and with two nodes only the other one."""
    grpc_port = int(node["address"].rsplit(":", 1)[1])
    listening = {c.laddr.port for c in psutil.Process(node["pid"]).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN} - {grpc_port}
    return sum(connections_to(port) for port in listening)


def test_a_deployed_tick_connects_its_streams_between_nodes_before_its_first_event(
        two_nodes: tuple[Path, dict[str, Any]], zookeeper: str, cluster_name: str) -> None:
    """Streams connect on their first write, which made the first event of a tick wait for every connection on
    its path; the node connects the latest tick's streams once it is deployed (``Channels.warm``)."""
    _, state = two_nodes
    node0, node1 = (next(p for p in state["processes"] if p["name"] == name) for name in ("node0", "node1"))
    assert streams_to(node0) == streams_to(node1) == 0  # nothing deployed: no stream yet
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    # The front and worker 0 to worker 1; worker 1 to the barrier and the acker, both on node0.
    eventually(lambda: streams_to(node1) and streams_to(node0), "streams connected both ways")
    with Client(zookeeper, cluster_name) as client:
        client.connect()
        client.push(["a b a"])
        got = [r.payload for _, r in zip(range(3), client.consume(group="g", timeout=30), strict=False)]
    assert sorted(got, key=json.dumps) == sorted([{"word": "a", "count": 1}, {"word": "b", "count": 1},
                                                  {"word": "a", "count": 2}], key=json.dumps)


def test_a_killed_node_makes_its_peer_exit_at_once_with_the_break_logged(
        two_nodes: tuple[Path, dict[str, Any]], zookeeper: str, cluster_name: str) -> None:
    data, state = two_nodes
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    with Client(zookeeper, cluster_name) as client:
        client.push(["a b a"])
        got = [r.payload for _, r in zip(range(3), client.consume(group="g", timeout=30), strict=False)]
    assert sorted(got, key=json.dumps) == sorted([{"word": "a", "count": 1}, {"word": "b", "count": 1},
                                                  {"word": "a", "count": 2}], key=json.dumps)  # it was running
    node0 = next(p for p in state["processes"] if p["name"] == "node0")
    os.kill(node0["pid"], signal.SIGKILL)  # the acker's node: worker1's min-time watch breaks

    def logged(*levels: str) -> list[dict[str, Any]]:
        entries = [json.loads(line) for line in (data / "logs" / "node1.log").read_text().splitlines()]
        return [entry for entry in entries if entry["role"] == "worker1" and entry["level"] in levels]

    # The acker's address refuses connections: node1 stops at once (its restart joins node0's, for recovery).
    # Whichever of worker1's streams to node0 was seen to break first (its acks, its min-time watch) names it,
    # and the node may exit before the other is logged.
    gone = eventually(lambda: logged("CRITICAL"), "node1's exit in its log")[0]
    assert f"{node0['address']} refuses connections: the process there is gone" in gone["message"]
    worker1 = logged("ERROR", "CRITICAL")
    errors = worker1[:worker1.index(gone)]  # before the exit: the node's restart logs on into this file
    assert errors, "no break logged as an error"
    for entry in errors:
        assert entry["node"] == "node1" and "worker1 is NOT_SERVING" in entry["message"]
        assert "StreamBroken" in entry["exc"] and "UNAVAILABLE" in entry["exc"]
        assert entry["exc"].startswith("Traceback")  # a break a watch saw too, not only a task that failed on it
