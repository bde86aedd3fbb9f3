"""Secured clusters, `flamestream up`'s default: mTLS between nodes, role tokens for clients, ZooKeeper digest ACLs
(issue #12).

Each test checks one promise of the secure mode from the outside: the word
count is exact with credentials (given, or found by the CLI and the SDK
without being told), and each way around them (no token, the wrong token,
plaintext, a foreign certificate, ZooKeeper without a digest, a digest
offered to a ZooKeeper its directory does not name) is refused; `--insecure`
says so wherever one looks.  The two-host test runs ZooKeeper and node0 in
one network namespace and node1 in another, so certificates are checked
against real non-loopback addresses.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import NoAuthError  # type: ignore[import-untyped]

from examples import wordcount
from flamestream.client import Client, ClientError
from flamestream.runtime import tls
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.security import Credentials, clusters_of
from flamestream.wire.transport import GRPC_OPTIONS
from tests.netns import veth_pair
from tests.test_cluster_e2e import ROOT, Cluster, as_multiset, cli, consume_all, expected_from_input_logs

pytestmark = pytest.mark.slow

LINES = [f"the dog {i % 7} saw the cat {i % 3}" for i in range(200)]


@pytest.fixture
def secure(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[Cluster]:
    """A cluster `up` secured, as it does unless told `--insecure`."""
    data = tmp_path / "cluster"
    done = cli("up", "--nodes", "2", "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"credentials in {data / 'tls'}" in done.stderr
    assert f"export FLAMESTREAM_CREDENTIALS={data / 'tls'}\n" in done.stderr
    assert "INSECURE" not in done.stderr
    try:
        yield Cluster(data, zookeeper, cluster_name)
    finally:
        down = cli("down", "--data-dir", str(data))
        assert down.returncode == 0, down.stderr


def _deploy(cluster: Cluster) -> None:
    done = cli("deploy", "examples/wordcount.py", "--zookeeper", cluster.zookeeper, "--cluster", cluster.name,
               "--credentials", str(cluster.data / "tls"))
    assert done.returncode == 0, done.stderr


def _push_call(address: str, credentials: grpc.ChannelCredentials | None, token: str | None) -> grpc.StatusCode:
    """One raw Front.Push: the status it ends with (OK when admitted)."""
    with (grpc.secure_channel(address, credentials, options=GRPC_OPTIONS) if credentials
          else grpc.insecure_channel(address, options=GRPC_OPTIONS)) as channel:
        push = channel.unary_unary("/flamestream.Front/Push", request_serializer=pb.PushRequest.SerializeToString,
                                   response_deserializer=pb.PushResponse.FromString)
        metadata = [("authorization", f"Bearer {token}")] if token else None
        try:
            push(pb.PushRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            assert isinstance(exc, grpc.Call)
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("flag", ["--insecure", "--no-tls"])
def test_up_insecure_says_so_at_up_in_every_node_log_and_in_status(flag: str, tmp_path: Path, zookeeper: str,
                                                                   cluster_name: str) -> None:
    data = tmp_path / "cluster"
    (data / "tls").mkdir(parents=True)  # what a secured run left behind must not make clients talk TLS
    tls.init(data / "tls")
    done = cli("up", flag, "--nodes", "2", "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster",
               cluster_name)
    try:
        assert done.returncode == 0, done.stderr
        assert "WARNING: this cluster is INSECURE (--insecure)" in done.stderr
        status = cli("status", "--data-dir", str(data))
        assert "INSECURE" in status.stdout, status.stdout
        for node in ("node0", "node1"):
            assert "INSECURE: plaintext gRPC" in (data / "logs" / f"{node}.log").read_text(), node
        deploy = cli("deploy", "examples/wordcount.py", "--data-dir", str(data))
        assert deploy.returncode == 0, deploy.stderr
        with Client(zookeeper, cluster_name) as client:  # plaintext: the nodes advertise no credentials
            client.push(["an insecure word"])
            assert client.credentials is None
        consumed = cli("consume", "--data-dir", str(data), "--limit", "3", "--timeout", "30")
        assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == 3, consumed.stderr
    finally:
        cli("down", "--data-dir", str(data))


def test_up_tls_is_the_default_spelled_out(tmp_path: Path, zookeeper: str, cluster_name: str) -> None:
    """`up --tls` stays accepted: the same secured cluster, with a --tls-dir of the user's choice here."""
    data, own = tmp_path / "cluster", tmp_path / "own-tls"
    done = cli("up", "--tls", "--tls-dir", str(own), "--nodes", "1", "--data-dir", str(data), "--zookeeper",
               zookeeper, "--cluster", cluster_name)
    try:
        assert done.returncode == 0, done.stderr
        assert f"credentials in {own}" in done.stderr and not (data / "tls").exists()
        assert f"secured, credentials in {own}" in cli("status", "--data-dir", str(data)).stdout
        assert clusters_of(own) == [(zookeeper, cluster_name)]  # where its ZooKeeper digests may go
    finally:
        cli("down", "--data-dir", str(data))


def test_up_refuses_tls_dir_with_insecure(tmp_path: Path) -> None:
    done = cli("up", "--insecure", "--tls-dir", str(tmp_path / "tls"), "--data-dir", str(tmp_path / "cluster"))
    assert done.returncode == 2 and "--insecure has none" in done.stderr
    assert not (tmp_path / "cluster" / "cluster.json").exists()


def test_secure_wordcount_is_exact_and_every_way_around_the_credentials_is_refused(secure: Cluster) -> None:
    tls_dir = secure.data / "tls"
    for secret in ("tokens.json", "zookeeper.json", "ca.key", "client.key"):
        assert stat.S_IMODE((tls_dir / secret).stat().st_mode) == 0o600, secret
    status = cli("status", "--data-dir", str(secure.data))
    assert f"secured, credentials in {tls_dir}" in status.stdout and "INSECURE" not in status.stdout
    assert status.stdout.count(" SERVING ") == 2, status.stdout  # each node's health, asked over mTLS
    assert not any("INSECURE" in (secure.data / "logs" / f"{node}.log").read_text() for node in ("node0", "node1"))
    _deploy(secure)
    with Client(secure.zookeeper, secure.name, credentials=tls_dir) as client:
        client.push(LINES)
        expected = expected_from_input_logs(secure, wordcount.graph())
        got = [(r.time, r.payload) for r in consume_all(client, "tls", len(expected))]
    assert as_multiset(got) == as_multiset(expected)
    # Told nothing, on the cluster's host: the CLI through --data-dir, the SDK through the nodes' advertisement.
    pushed = cli("push", "--data-dir", str(secure.data), stdin="told nothing\n")
    assert pushed.returncode == 0, pushed.stderr
    with secure.client() as client:
        assert sorted(r.payload["word"] for r in consume_all(client, "tls", 2)) == ["nothing", "told"]
        assert client.credentials is not None and client.credentials.directory == tls_dir

    front = secure.address("front")
    creds = Credentials.load(tls_dir)
    channel_creds = creds.channel_credentials(with_tokens=False)
    assert _push_call(front, channel_creds, None) == grpc.StatusCode.UNAUTHENTICATED
    assert _push_call(front, channel_creds, "not-a-token") == grpc.StatusCode.UNAUTHENTICATED
    assert _push_call(front, channel_creds, creds.tokens["consume"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _push_call(front, channel_creds, creds.tokens["push"]) in (grpc.StatusCode.OK,
                                                                      grpc.StatusCode.INVALID_ARGUMENT)
    assert _push_call(front, None, creds.tokens["push"]) == grpc.StatusCode.UNAVAILABLE  # plaintext: no handshake

    # Internal RPCs: the clients' certificate (signed by the CA) is not enough, a foreign CA's not even that.
    worker = secure.address("worker")

    def exchange(credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
        with grpc.secure_channel(worker, credentials, options=GRPC_OPTIONS) as channel:
            call = channel.stream_unary("/flamestream.Worker/Exchange",
                                        request_serializer=pb.ItemBatch.SerializeToString,
                                        response_deserializer=pb.Empty.FromString)
            try:
                call(iter([pb.ItemBatch()]), timeout=10)
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call)
                return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    assert exchange(channel_creds) == grpc.StatusCode.PERMISSION_DENIED
    foreign = secure.data / "foreign"
    tls.init(foreign, [("node0", "127.0.0.1")])
    own_ca = creds.ca  # trusts our server, presents a certificate our CA never signed
    mine = Credentials.load(foreign, node="node0")
    forged = grpc.ssl_channel_credentials(root_certificates=own_ca, private_key=mine.key, certificate_chain=mine.cert)
    assert exchange(forged) == grpc.StatusCode.UNAVAILABLE

    # ZooKeeper: anyone may read the membership, only the cluster's digests may write.
    raw = KazooClient(hosts=secure.zookeeper)
    raw.start(timeout=10)
    try:
        base = f"/flamestream/{secure.name}"
        assert raw.get_children(f"{base}/members/front") == ["front0"]
        with pytest.raises(NoAuthError):
            raw.create(f"{base}/ticks/9999999999", b"{}")
        with pytest.raises(NoAuthError):
            raw.set(f"{base}/ticks/0000000000", b"{}")
    finally:
        raw.stop()
        raw.close()


def test_a_node_started_without_the_clusters_credentials_says_so_in_one_line(secure: Cluster) -> None:
    """A hand-started node without --tls-dir: ZooKeeper's ACLs refuse its registration (it was a traceback ending in
    kazoo's bare NoAuthError)."""
    done = cli("node", "--zookeeper", secure.zookeeper, "--cluster", secure.name, "--name", "node9", "--worker", "9",
               "--data-dir", str(secure.data / "node9"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "node node9: ZooKeeper refused to register worker 'worker9'" in done.stderr
    assert "start it with --tls-dir DIR" in done.stderr


def test_a_client_without_credentials_is_refused(secure: Cluster) -> None:
    _deploy(secure)
    tls_dir = secure.data / "tls"
    hidden = secure.data / "elsewhere"
    tls_dir.rename(hidden)  # the nodes hold theirs in memory; a client finds none where they point
    try:
        with Client(secure.zookeeper, secure.name, retries=0) as client, pytest.raises(ClientError) as refused:
            client.push(["x"])
        assert "is secured" in str(refused.value) and "FLAMESTREAM_CREDENTIALS" in str(refused.value)
    finally:
        hidden.rename(tls_dir)


def test_discovered_zookeeper_digests_go_only_to_the_zookeeper_up_recorded(secure: Cluster) -> None:
    """The same server by another name is, to the client, another ZooKeeper: it gets the tokens (the TLS handshake
    proves the nodes), but not the admin digest, so it may push and not deploy."""
    port = secure.zookeeper.rpartition(":")[2]
    assert secure.zookeeper == f"127.0.0.1:{port}"
    _deploy(secure)
    with Client(f"localhost:{port}", secure.name) as client:
        client.push(["pushed under another name"])
        with pytest.raises(ClientError) as refused:
            client.deploy(wordcount.graph())
        assert "NoAuthError" in str(refused.value) and "admin digest" in str(refused.value)
    with Client(secure.zookeeper, secure.name) as client:  # the recorded name: the admin digest, a hand-over
        assert client.deploy(wordcount.graph()) >= 1


# -- two hosts ---------------------------------------------------------------------------------------------

NS = ("fs-tls-a", "fs-tls-b")
ADDRESSES = ("10.231.0.1", "10.231.0.2")


@pytest.fixture
def namespaces() -> Iterator[None]:
    with veth_pair(NS, ("fs-tls-va", "fs-tls-vb"), ADDRESSES):
        yield


_ZOOKEEPER = """
import signal, sys, time
from pathlib import Path
from flamestream.coordinator.zookeeper import ZooKeeperServer
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally: the JVM must not outlive the test
server = ZooKeeperServer(Path(sys.argv[1]), host=sys.argv[2], port=int(sys.argv[3]))
server.start()
print("zookeeper", server.address, flush=True)
try:
    while True:
        time.sleep(1)
finally:
    server.stop()
"""


def _in(ns: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _wait_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.2)


def _in_namespace(ns: str, code: str, *args: str) -> Any:
    """Run ``code`` in ``ns`` (the SDK too must reach 10.231.0.x, which exists only there); its JSON output."""
    done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_CLIENT = """
import json, sys
from examples import wordcount
from flamestream.client import Client
from flamestream.storage.input_log import read_input_logs
from flamestream import run_oracle
from pathlib import Path
zookeeper, cluster, credentials, data = sys.argv[1:5]
lines = [f"the dog {i % 7} saw the cat {i % 3}" for i in range(200)]
with Client(zookeeper, cluster, credentials=credentials) as client:
    client.deploy(wordcount.graph(), workers=2)
    client.push(lines)
    expected = run_oracle(wordcount.graph(), read_input_logs(Path(data)))[0]
    got = []
    for record in client.consume(group="two-hosts", timeout=60):
        got.append([[record.time.ts, record.time.front], record.payload])
        if len(got) >= len(expected):
            break
print(json.dumps({"expected": [[list(t), p] for t, p in expected], "got": got}))
"""


def test_two_hosts_with_tls_count_words_exactly(namespaces: None, tmp_path: Path) -> None:
    from flamestream.runtime.launcher import NodePlan, node_args

    data = tmp_path / "data"
    tls_dir = tls.init(tmp_path / "tls")  # the CA only: each node issues its certificate for its own address
    zookeeper = f"{ADDRESSES[0]}:2181"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        zk_log = tmp_path / "zookeeper.out"
        procs.append(_in(NS[0], ["-c", _ZOOKEEPER, str(tmp_path / "zk"), ADDRESSES[0], "2181"], zk_log))
        _wait_line(zk_log, "zookeeper ", procs[0])
        plans = [NodePlan("node0", acker=True, worker=0, front=0, barriers=(0,)), NodePlan("node1", worker=1)]
        for ns, plan, host in zip(NS, plans, ADDRESSES, strict=True):
            log = tmp_path / f"{plan.name}.out"
            procs.append(_in(ns, node_args(plan, zookeeper=zookeeper, cluster="two", data_dir=str(data), host=host,
                                           port=7000, tls_dir=str(tls_dir)), log))
            _wait_line(log, f"ready {plan.name}", procs[-1])
        for name, host in zip(("node0", "node1"), ADDRESSES, strict=True):
            cert = x509.load_pem_x509_certificate((tls_dir / "nodes" / f"{name}.pem").read_bytes())
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert ipaddress.ip_address(host) in sans.get_values_for_type(x509.IPAddress)  # issued by the node
        result = _in_namespace(NS[1], _CLIENT, zookeeper, "two", str(tls_dir), str(data))
        expected = [((t[0], t[1]), p) for t, p in result["expected"]]
        got = [((t[0], t[1]), p) for t, p in result["got"]]
        assert len(expected) == sum(len(line.split()) for line in LINES)
        assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, expected))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
