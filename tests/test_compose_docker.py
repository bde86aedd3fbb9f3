"""The compose deployment for real, secured: `scripts/compose up`, word count through the `client` service (with
the credentials tls-init made), plaintext refused from the host, a crashed node container, `scripts/compose down`
(needs Docker: skipped only where `scripts/compose` says Docker cannot run here).

Each run is its own compose project (and host port), so a deployment already running on the daemon, or another
run, is left alone; the module's fixture takes the project down whatever happens.

The first deploy goes through `compose run --rm client`, as the README shows; every later CLI call is a `docker exec`
into one `client` container the fixture keeps running. Each `compose run` creates a container, which on the vfs
storage driver is a copy of the whole image: 15-55 s each here, against ~0.2 s for an exec.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.loopback import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compose"
UNAVAILABLE = 3
"""scripts/compose's exit code when Docker cannot run here."""
ZOOKEEPER = "zookeeper:2181"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
         "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
         "xray", "yankee", "zulu"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first `up` builds the image (minutes on vfs)


PROJECT = f"flamestreamtest{os.getpid()}"
CLIENT_PORT = free_port()
ENV = dict(os.environ, COMPOSE_PROJECT_NAME=PROJECT, FLAMESTREAM_CLIENT_PORT=str(CLIENT_PORT))


def compose(*args: str, stdin: str | None = None, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], input=stdin, capture_output=True, text=True, env=ENV,
                          timeout=timeout, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args} exited with {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def client(tools: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`flamestream ARGS --zookeeper zookeeper:2181` in the `client` container ``tools`` on the project network."""
    result = subprocess.run(["docker", "exec", "-i", tools, "flamestream", *args, "--zookeeper", ZOOKEEPER],
                            input=stdin, capture_output=True, text=True, timeout=300, check=False)
    ok(result)
    return result


def docker(*args: str) -> str:
    return ok(subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=False)).strip()


def corpus(seed: int, lines: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(lines)]


def consume(tools: str, group: str, expected: int, deadline: float) -> list[dict[str, Any]]:
    """Records of ``group`` until ``expected`` arrived or the deadline passed (the group resumes where it committed)."""
    records: list[dict[str, Any]] = []
    while len(records) < expected and time.monotonic() < deadline:
        out = client(tools, "consume", "--group", group, "--limit", str(expected - len(records)), "--timeout",
                     "10").stdout
        records += [json.loads(line) for line in out.splitlines() if line.strip()]
    return records


def assert_exact(records: list[dict[str, Any]], lines: list[str]) -> None:
    """Each word's counts are 1..n exactly once, n being its true count."""
    truth = Counter(word for line in lines for word in line.split())
    counts: dict[str, list[int]] = defaultdict(list)
    for record in records:
        counts[record["word"]].append(record["count"])
    assert {word: sorted(seen) for word, seen in counts.items()} == \
        {word: list(range(1, n + 1)) for word, n in truth.items()}


def container(service: str) -> str:
    return ok(compose("ps", "-q", service)).strip()


def state(container_id: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(docker("inspect", "-f", "{{json .}}", container_id))
    return result


@pytest.fixture(scope="module")
def deployment() -> Iterator[str]:
    """The deployment, up; yields the name of a running `client` container to exec the CLI in."""
    try:
        up = compose("up")
        if up.returncode == UNAVAILABLE:
            pytest.skip(up.stderr.strip().splitlines()[-1])
        ok(up)
        yield ok(compose("run", "-d", "--entrypoint", "sleep", "client", "infinity")).strip().splitlines()[-1]
    finally:
        down = compose("down", timeout=300)
        assert down.returncode == 0, down.stderr


FIRST = corpus(seed=1)
SECOND = corpus(seed=2)


def test_word_count_is_exact_through_the_client_service(deployment: str) -> None:
    ok(compose("run", "--rm", "-T", "client", "deploy", "examples/wordcount.py", "--zookeeper", ZOOKEEPER,
               timeout=300))
    pushed = client(deployment, "push", "--producer", "ci-first", stdin="\n".join(FIRST) + "\n")
    assert "pushed 200 events" in pushed.stderr
    words = sum(len(line.split()) for line in FIRST)
    records = consume(deployment, "ci", words, time.monotonic() + 180)
    assert len(records) == words
    assert_exact(records, FIRST)


def test_only_node0_is_published_on_loopback_and_answers_from_the_host(deployment: str) -> None:
    for service in ("zookeeper", "node0", "node1"):
        ports = state(container(service))["NetworkSettings"]["Ports"] or {}
        bound = [(binding["HostIp"], int(binding["HostPort"])) for bindings in ports.values() for binding in
                 bindings or []]
        assert bound == ([("127.0.0.1", CLIENT_PORT)] if service == "node0" else []), service
    address = f"127.0.0.1:{CLIENT_PORT}"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as plaintext:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE  # TLS only: no handshake, no answer
    # The clients' certificate, out of the credentials volume (what the client service mounts): node0's certificate
    # names 127.0.0.1 too, so the host reaches it through the published port.
    ca, cert, key = (docker("exec", deployment, "cat", f"/tls/{name}").encode()
                     for name in ("ca.pem", "client.pem", "client.key"))
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    with grpc.secure_channel(address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_crashed_node_is_restarted_and_its_topic_survives(deployment: str) -> None:
    """SIGKILL node0's process (the acker, front, barrier): Docker restarts it, and the topic is all there.

    A crash, not `docker kill`: Docker counts `docker kill` as a manual stop, which restart policies ignore.
    """
    node0 = container("node0")
    before = state(node0)
    os.kill(before["State"]["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 180
    while True:
        now = state(node0)
        restarted = now["RestartCount"] > before["RestartCount"]
        if restarted and now["State"]["Running"] and now["State"]["Health"]["Status"] == "healthy":
            break
        assert time.monotonic() < deadline, f"node0 not restarted and healthy: {now['State']}"
        time.sleep(1)
    words = sum(len(line.split()) for line in FIRST)
    # A new group reads the topic from the start.
    records = consume(deployment, "ci-after-crash", words, time.monotonic() + 120)
    assert len(records) == words
    assert_exact(records, FIRST)


def test_the_output_stays_exact_across_the_crash(deployment: str) -> None:
    client(deployment, "push", "--producer", "ci-second", stdin="\n".join(SECOND) + "\n")
    words = sum(len(line.split()) for line in SECOND)
    records = consume(deployment, "ci", words, time.monotonic() + 45)  # the first corpus took ~10 s
    assert len(records) == words
    everything = consume(deployment, "ci-all", sum(len(line.split()) for line in FIRST + SECOND),
                         time.monotonic() + 60)
    assert_exact(everything, FIRST + SECOND)


def test_down_leaves_no_container_network_or_volume(deployment: str) -> None:
    ok(compose("down", timeout=300))
    daemon = subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False)
    if daemon.returncode != 0:
        return  # down stopped the daemon `up` started, after checking that nothing of the project was left
    label = f"label=com.docker.compose.project={PROJECT}"
    assert docker("ps", "-aq", "--filter", label) == ""
    assert docker("network", "ls", "-q", "--filter", label) == ""
    assert docker("volume", "ls", "-q", "--filter", label) == ""
