"""The distributed runtime end to end: real ZooKeeper, real processes, gRPC over loopback.

`flamestream up` starts node processes hosting the acker, workers, fronts and barriers; `deploy` publishes a
tick; the SDK pushes and consumes.  The output topic must hold exactly the oracle's output for the events the
fronts logged: the fronts' input logs give every admitted event with the global time it was stamped with.
Each workload runs on several placements — three nodes with two fronts, one node hosting every role (all
streams in-process), and a process per role (all streams over gRPC) — which must not change the output.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import inverted_index, wordcount
from flamestream import run_oracle
from flamestream.client import Client
from flamestream.core.meta import GlobalTime
from flamestream.storage.input_log import read_input_logs
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.security import Credentials

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, capture_output=True, text=True,
                          input=stdin, timeout=180)


class Cluster:
    def __init__(self, data: Path, zookeeper: str, name: str) -> None:
        self.data, self.zookeeper, self.name = data, zookeeper, name

    def client(self) -> Client:
        """A new SDK client; callers close it (``with``), or its ZooKeeper session outlives the cluster.  Given no
        credentials, as a user on the cluster's host: it finds those its nodes advertise."""
        return Client(self.zookeeper, cluster=self.name)

    def deploy(self, graph: str) -> None:
        """``flamestream deploy`` through ``--zookeeper``, no credentials given: found as the client finds them."""
        done = cli("deploy", graph, "--zookeeper", self.zookeeper, "--cluster", self.name)
        assert done.returncode == 0, done.stderr

    def channel(self, address: str, *, node: bool = False, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A raw gRPC channel to ``address`` as the cluster's clients talk: TLS with the clients' certificate and
        every role's token, or plaintext to an ``--insecure`` cluster.  ``node``: with a node's certificate
        instead, which the internal services (``Worker.Exchange``, ``Barrier.Deliver``, ``Acker.*``) require."""
        tls_dir = self.state()["tls_dir"]
        if not tls_dir:
            return grpc.insecure_channel(address, options=options)
        name = next(p["name"] for p in self.state()["processes"] if p["role"] == "node") if node else None
        credentials = Credentials.load(tls_dir, node=name).channel_credentials(with_tokens=True)
        return grpc.secure_channel(address, credentials, options=options)

    def state(self) -> dict[str, Any]:
        return json.loads((self.data / "cluster.json").read_text())  # type: ignore[no-any-return]

    def address(self, role: str) -> str:
        """The address of the node hosting the first member of ``role``."""
        return next(p["address"] for p in self.state()["processes"] if any(r == role for r, _ in p["members"]))


@contextlib.contextmanager
def running(data: Path, zookeeper: str, name: str, *up_args: str) -> Iterator[Cluster]:
    """A cluster started with ``flamestream up`` for the block, taken down (successfully) after it."""
    done = cli("up", *up_args, "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", name)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield Cluster(data, zookeeper, name)
    finally:
        down = cli("down", "--data-dir", str(data))
        assert down.returncode == 0, down.stderr


PLACEMENTS = {"3 nodes, 2 fronts": ["--nodes", "3", "--fronts", "2"], "1 node, every role": ["--nodes", "1"],
              "a process per role": ["--nodes", "2", "--placement", "separate"]}


@pytest.fixture(params=list(PLACEMENTS))
def cluster(request: pytest.FixtureRequest, tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[Cluster]:
    data = tmp_path / "cluster"
    done = cli("up", *PLACEMENTS[request.param], "--data-dir", str(data), "--zookeeper", zookeeper,
               "--cluster", cluster_name)
    assert done.returncode == 0, done.stdout + done.stderr
    started = Cluster(data, zookeeper, cluster_name)
    processes = started.state()["processes"]
    try:
        yield started
    finally:
        down = cli("down", "--data-dir", str(data))
        assert down.returncode == 0, down.stderr
        for p in processes:  # nothing left running, no port left bound
            assert not _alive(p["pid"]), p
            if p.get("address"):
                host, port = p["address"].rsplit(":", 1)
                assert _port_free(host, int(port)), p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def consume_all(client: Client, group: str, count: int, timeout: float = 60) -> list[Any]:
    """Up to ``count`` records; commits where it stopped in each partition (a partition is read in order)."""
    records = []
    last: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    for record in client.consume(group=group, timeout=30):
        records.append(record)
        last[record.partition] = record
        if len(records) >= count or time.monotonic() > deadline:
            break
    for record in last.values():
        client.commit(record)
    return records


def as_multiset(pairs: list[tuple[GlobalTime, Any]]) -> Counter[tuple[GlobalTime, str]]:
    return Counter((GlobalTime(*gt), json.dumps(p, sort_keys=True, ensure_ascii=False)) for gt, p in pairs)


def expected_from_input_logs(cluster: Cluster, graph: Any) -> list[tuple[GlobalTime, Any]]:
    return run_oracle(graph, read_input_logs(cluster.data))[0]


def test_wordcount_topic_equals_oracle_and_consumers_resume(cluster: Cluster) -> None:
    cluster.deploy("examples/wordcount.py")
    lines = [f"the dog {i % 7} saw the cat {i % 3}" for i in range(300)]
    with cluster.client() as client:
        # From six threads at once: anonymous pushes in flight together used to share a producer id, and whichever
        # reached the front second was taken for a retry of the first (its events dropped as duplicates).
        with ThreadPoolExecutor(6) as pool:
            pushed = list(pool.map(client.push, [lines[i::6] for i in range(6)]))
        assert [result.duplicates for result in pushed] == [0] * 6
        expected = expected_from_input_logs(cluster, wordcount.graph())
        assert len(expected) == sum(len(line.split()) for line in lines)
        first = consume_all(client, "resume", len(expected) // 3)
    with cluster.client() as client:  # a new consumer, same group
        rest = consume_all(client, "resume", len(expected) - len(first))
    got = [(r.time, r.payload) for r in first + rest]
    assert as_multiset(got) == as_multiset(expected)  # nothing lost, nothing twice, across the resume
    per_word: dict[str, int] = {}
    for r in sorted(first + rest, key=lambda r: (r.time, r.partition, r.offset)):
        per_word[r.payload["word"]] = max(per_word.get(r.payload["word"], 0), r.payload["count"])
    assert per_word["the"] == 600


def test_inverted_index_topic_equals_oracle(cluster: Cluster) -> None:
    cluster.deploy("examples/inverted_index.py")
    pages = list(inverted_index.read_input(str(PAGES)))
    with cluster.client() as client:
        for i in range(0, len(pages), 4):  # paced like a real source: one burst of all pages would measure replays
            client.push(pages[i:i + 4])
            time.sleep(0.02)
        expected = expected_from_input_logs(cluster, inverted_index.graph())
        got = consume_all(client, "index", len(expected), timeout=240)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)


def test_retries_and_bad_input(cluster: Cluster) -> None:
    cluster.deploy("examples/wordcount.py")
    with cluster.channel(cluster.address("front")) as channel:
        front = rpc.FrontStub(channel)
        event = pb.Event(payload=json.dumps("retry me").encode(), producer="p1", sequence=1)
        first = front.Push(pb.PushRequest(events=[event]))
        again = front.Push(pb.PushRequest(events=[event]))
        assert list(first.admitted) == [True] and list(again.admitted) == [False]
        assert again.times[0] == first.times[0]
        for bad, code in ((b"{not json", grpc.StatusCode.INVALID_ARGUMENT),
                          (b'"' + b"x" * (2 << 20) + b'"', grpc.StatusCode.RESOURCE_EXHAUSTED)):
            with pytest.raises(grpc.RpcError) as info:
                front.Push(pb.PushRequest(events=[pb.Event(payload=bad)]))
            assert info.value.code() == code and "event 0" in info.value.details()
        assert list(front.Push(pb.PushRequest(events=[pb.Event(payload=b'"after"')])).admitted) == [True]
    with cluster.client() as client:
        records = consume_all(client, "retries", 3)
    assert sorted(r.payload["word"] for r in records) == ["after", "me", "retry"]  # the retry counted once
