"""Bounded resources on a real cluster (issue #12 part 4): amplification, names and sequences, a full disk.

Slow: each test starts nodes with ``flamestream up`` against the session's ZooKeeper.  The pure-core side (the
output cap in the oracle and the local runtime) is ``test_limits.py``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import wordcount
from flamestream.client import Client, ClientError
from flamestream.core.dead_letter import is_dead_letter
from flamestream.storage.input_log import read_input_logs
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from tests.test_cluster_e2e import Cluster, as_multiset, cli, consume_all, expected_from_input_logs
from tests.test_limits import wordcount as wordcount_graph

pytestmark = pytest.mark.timeout(600)

RSS_BOUND_KB = 1_500_000
"""What a node may grow to while 100 events of 400 KB go through word count: the outside tester saw 6.1 GB."""


def _up(data: Path, zookeeper: str, cluster: str, *args: str) -> Cluster:
    done = cli("up", *args, "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    return Cluster(data, zookeeper, cluster)



def rss_kb(cluster: Cluster) -> dict[str, int]:
    """VmRSS of every node process (``DIR/cluster.json``), by name."""
    out = {}
    for p in cluster.state()["processes"]:
        status = Path(f"/proc/{p['pid']}/status")
        if p["name"].startswith("node") and status.exists():
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
            out[p["name"]] = int(line.split()[1])
    return out


def big_line(rng: random.Random, size: int) -> str:
    words = []
    total = 0
    while total < size:
        word = f"w{rng.randrange(50_000)}"
        words.append(word)
        total += len(word) + 1
    return " ".join(words)


def front_stub(cluster: Cluster) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(cluster.address("front"), options=[
        ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
    return channel, rpc.FrontStub(channel)


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def event(payload: Any, producer: str = "", sequence: int = 0) -> pb.Event:
    return pb.Event(payload=json.dumps(payload).encode(), producer=producer, sequence=sequence)


def test_amplification_is_cut_and_memory_stays_bounded(cluster_dir: Path, zookeeper: str, cluster_name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster = _up(cluster_dir, zookeeper, cluster_name, "--nodes", "2")
    cluster.deploy("examples/wordcount.py")
    rng = random.Random(12)
    lines = [big_line(rng, 400_000) for _ in range(100)]  # ~57,000 words each, the cap is 10,000 outputs
    before = rss_kb(cluster)
    channel, stub = front_stub(cluster)
    with channel:
        # The tester's request: 100 events of 400 KB in one Push, 40 MB in all.
        code, details = code_of(lambda: stub.Push(pb.PushRequest(events=[event(x) for x in lines]), timeout=60))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-push-bytes" in details, details
    peak: dict[str, int] = dict(before)
    with cluster.client() as client:
        client.push(lines)  # the SDK splits by bytes: 4 MB per request
        small = [f"the dog {i % 7} saw the cat {i % 3}" for i in range(200)]
        client.push(small)
        expected = expected_from_input_logs(cluster, wordcount.graph())
        assert len(expected) == 100 + sum(len(x.split()) for x in small)
        got: list[Any] = []
        deadline = time.monotonic() + 240
        while len(got) < len(expected) and time.monotonic() < deadline:
            got += consume_all(client, "amplified", len(expected) - len(got), timeout=10)
            for name, kb in rss_kb(cluster).items():
                peak[name] = max(peak.get(name, 0), kb)
    after = rss_kb(cluster)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    dead = [r.payload["dead_letter"] for r in got if is_dead_letter(r.payload)]
    assert len(dead) == 100 and all("more than 10000 outputs" in d["error"] for d in dead)
    assert max(r.payload["count"] for r in got if not is_dead_letter(r.payload) and r.payload["word"] == "the") == 400
    with capsys.disabled():
        print(f"\nRSS kB before {before}, peak {peak}, after {after}")
    assert max(peak.values()) < RSS_BOUND_KB, peak


def test_producer_ids_sequences_and_group_names_are_bounded(cluster_dir: Path, zookeeper: str,
                                                            cluster_name: str) -> None:
    cluster = _up(cluster_dir, zookeeper, cluster_name, "--nodes", "1")
    cluster.deploy("examples/wordcount.py")
    channel, stub = front_stub(cluster)
    with channel:
        push = stub.Push

        def refused(*events: pb.Event) -> str:
            code, details = code_of(lambda: push(pb.PushRequest(events=list(events)), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            return details

        assert "longer than 256 bytes" in refused(event("a"), event("b", "p" * 257, 1))
        assert "reserved" in refused(event("a", "~anon-someone-elses-0", 1))
        assert "above the largest allowed" in refused(event("a", "seq", 2**64 - 1))
        assert "above the largest allowed" in refused(event("a", "seq", 2**63))
        ok = push(pb.PushRequest(events=[event("a b", "p" * 256, 1), event("c", "seq", 2**63 - 1)]), timeout=30)
        assert list(ok.admitted) == [True, True]
        again = push(pb.PushRequest(events=[event("c", "seq", 2**63 - 1), event("d", "seq", 5)]), timeout=30)
        assert list(again.admitted) == [False, False]  # retries, answered with their times
    barrier = grpc.insecure_channel(cluster.address("barrier"), options=[
        ("grpc.max_send_message_length", 64 << 20)])
    with barrier:
        stub_b = rpc.BarrierStub(barrier)
        for group in ("g" * 2_000_000, "a/b", "..", "sp ace"):
            code, details = code_of(lambda group=group: stub_b.Commit(
                pb.CommitRequest(group=group, partition=0, offset=0), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            code, _ = code_of(lambda group=group: stub_b.Committed(
                pb.CommittedRequest(group=group, partition=0), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
    with cluster.client() as client:  # the barrier kept its ZooKeeper session: consuming and committing work
        records = consume_all(client, "after-bad-names", 3, timeout=30)
        assert sorted(r.payload["word"] for r in records) == ["a", "b", "c"]
        assert client.committed("after-bad-names", 0) == 3


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs at DIR/input, where the front keeps its input log (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data = tmp_path / "cluster"
    mount = data / "input"
    mount.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr}")
    try:
        yield data
    finally:
        if (data / "cluster.json").exists():
            cli("down", "--data-dir", str(data))
        if _mounted(mount):
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_pushes_and_recovers(small_disk: Path, zookeeper: str, cluster_name: str) -> None:
    cluster = _up(small_disk, zookeeper, cluster_name, "--nodes", "1")
    cluster.deploy("examples/wordcount.py")
    filler = small_disk / "input" / "filler"
    with open(filler, "wb") as f:  # leave ~0.5 MB: the input log fills after a few hundred lines
        f.write(b"\0" * (3 * 1024 * 1024 + 512 * 1024))
    node = next(p for p in cluster.state()["processes"] if p["name"].startswith("node"))
    pushed: list[str] = []
    refused: ClientError | None = None
    with Client(zookeeper, cluster_name, retries=1) as client:
        for batch in range(200):
            lines = [f"line {batch} {i} " + "pad " * 200 for i in range(20)]
            try:
                client.push(lines, producer="disk")
            except ClientError as exc:
                refused = exc
                break
            pushed += lines
        assert refused is not None and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert "disk full" in str(refused)
        assert Path(f"/proc/{node['pid']}").exists(), "the front's node must survive a full disk"
        logged = [r[3] for r in read_input_logs(small_disk)]
        assert logged[:len(pushed)] == pushed  # every acknowledged event is durable, once, in order
        assert len(logged) - len(pushed) < 20  # at most a prefix of the refused batch reached the log
        filler.unlink()  # space returns: the same batch again (same producer sequences) is admitted once
        client.push(lines, producer="disk")
        pushed += lines
        assert [r[3] for r in read_input_logs(small_disk)] == pushed
        expected = expected_from_input_logs(cluster, wordcount.graph())
        got = consume_all(client, "disk", len(expected), timeout=120)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    assert len(expected) == sum(len(x.split()) for x in pushed)


def slow_split(line: str) -> list[str]:
    """A slow map, so admitted events stay in flight long enough to use up the front's credit."""
    time.sleep(1.0)
    return line.split()


def slow_wordcount() -> Any:
    """Word count (``test_limits.wordcount``) with a slow split; all functions in this package, which the
    graph's own package makes allowed everywhere."""
    return wordcount_graph(fn=slow_split)


def test_credit_backpressure_refuses_then_the_sdk_retries(tmp_path: Path, zookeeper: str, cluster_name: str) -> None:
    data = tmp_path / "node"
    root = Path(__file__).resolve().parents[1]
    common = ["python", "-m", "flamestream", "node", "--zookeeper", zookeeper, "--cluster", cluster_name]
    # The worker on a node of its own: a slow map blocks its node's event loop, and the front must stay responsive.
    procs = [subprocess.Popen(common + args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for args in (["--acker", "--front", "0", "--barrier", "0", "--data-dir", str(data),
                           "--max-in-flight-events", "5"], ["--worker", "0"])]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")
        graph = slow_wordcount()
        with Client(zookeeper, cluster_name, retries=0) as impatient, Client(zookeeper, cluster_name) as client:
            client.deploy(graph)
            client.push([f"a b {i}" for i in range(5)], producer="bp")  # 5 events: 5 s of work, credit used up
            with pytest.raises(ClientError) as refused:
                impatient.push(["c d"], producer="other")
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-in-flight-events" in str(refused.value) and "retry" in str(refused.value)
            client.push([f"e f {i}" for i in range(12)], producer="bp")  # waits and retries: all admitted
            expected = expected_from_input_logs(Cluster(data, zookeeper, cluster_name), graph)
            got = consume_all(client, "bp", len(expected), timeout=60)
        assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
        assert len(expected) == 3 * 17
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
            assert proc.stdout is not None
            proc.stdout.close()
