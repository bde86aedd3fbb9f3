"""No input can stall the stream (issue #12), on a real cluster: ZooKeeper, node processes, gRPC — and in Spark
replay, which must balance (and fail) exactly like the cluster.

Events a worker could not handle are refused by the front with INVALID_ARGUMENT naming the event; balancing
functions returning None, a str or an int far outside int32 give dead letters or folded hashes; a sink payload
no plain JSON encoder writes is written as its repr, as null for NaN, or as its dead letter.  After each, plain
word count still flows: the topic must equal the oracle over what the fronts logged, record for record, and
every node must still be up.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from flamestream import Graph, run_oracle
from flamestream.client import Client
from flamestream.core.dead_letter import RECORD, is_dead_letter
from flamestream.core.front import stamp_inputs
from flamestream.core.payload import decode_payload, encode_payload
from flamestream.storage.input_log import read_input_logs
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from tests import poisonfns
from tests.test_cluster_e2e import Cluster, _alive, as_multiset, consume_all, running
from tests.test_replay import ROOT, replayed, write_input_logs

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[Cluster]:
    """Two nodes: node 0 hosts the acker, worker 0, the front and the barrier; node 1 worker 1 (so items cross
    gRPC between workers and stay in-process to the barrier)."""
    with running(tmp_path / "cluster", zookeeper, cluster_name, "--nodes", "2") as started:
        yield started


def expected_records(cluster: Cluster) -> list[tuple[Any, Any]]:
    """The oracle over every logged event, each payload as a consumer reads its record."""
    output, rejected = run_oracle(poisonfns.graph(), read_input_logs(cluster.data))
    assert rejected == []  # the front let nothing in that the oracle would refuse
    return [(gt, decode_payload(encode_payload(payload))) for gt, payload in output]


def released_exactly(cluster: Cluster, client: Client, group: str) -> list[Any]:
    """Everything the oracle says, nothing more: the topic as a multiset of (global time, payload)."""
    expected = expected_records(cluster)
    got = [(r.time, r.payload) for r in consume_all(client, group, len(expected), timeout=90)]
    assert as_multiset(got) == as_multiset(expected)
    return [payload for _gt, payload in expected]


def word_counts(lines: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in " ".join(lines).split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def test_poison_never_stalls_the_stream(cluster: Cluster) -> None:
    cluster.deploy("tests/poisonfns.py")
    processes = cluster.state()["processes"]
    plain = [f"the dog {i % 5} saw the cat {i % 3}" for i in range(60)]
    with cluster.channel(cluster.address("front")) as channel, cluster.client() as client:
        front = rpc.FrontStub(channel)
        fine = pb.Event(payload=b'"fine words"')
        refused = {
            b'["\\ud800"]': "payload holds a lone surrogate",  # legal JSON text, not encodable as UTF-8
            b'{"w": "a\\udfff"}': "payload holds a lone surrogate",
            b"[NaN]": "payload holds NaN",
            b'{"r": -Infinity}': "payload holds -Infinity",
            b"[" * 500 + b"]" * 500: "payload nests arrays/objects deeper than 64 levels",
            b"[" * 900 + b"]" * 900: "payload nests arrays/objects deeper than 64 levels",
            b'"\xed\xa0\x80"': "payload holds a lone surrogate",  # as bytes: json reads it with surrogatepass
            b'"\xff"': "payload is not valid JSON",  # invalid UTF-8
        }
        for payload, message in refused.items():
            with pytest.raises(grpc.RpcError) as info:
                front.Push(pb.PushRequest(events=[fine, pb.Event(payload=payload)]))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            assert (info.value.details() or "").startswith(f"event 1: {message}"), info.value.details()
        assert list(front.Push(pb.PushRequest(events=[fine])).admitted) == [True]
        client.push(plain[:30])
        released_exactly(cluster, client, "after-refusals")  # nothing of a refused batch got in; the rest flows

        poison = [" ".join(poisonfns.POISON_WORDS[(i + j) % 8] if j % 2 else f"w{(i * j) % 4}" for j in range(6))
                  for i in range(40)]
        client.push(poison)
        client.push(plain[30:])
        payloads = released_exactly(cluster, client, "after-poison")

        words = word_counts(["fine words", *plain, *poison])
        letters = [p["dead_letter"] for p in payloads if is_dead_letter(p)]
        balance_letters = [d for d in letters if d["operation"] == "grouping0"]
        assert len(balance_letters) == words["none"] + words["str"]  # None and "x" from the balancing function
        assert {d["payload"] for d in balance_letters} == {"'none'", "'str'"}
        assert all(d["error"].startswith("BalanceError: balancing function returned ") for d in balance_letters)
        record_letters = [d for d in letters if d["operation"] == RECORD]
        assert len(record_letters) == words["lone"] + words["deep"]  # unwritable sink payloads
        counts = [p for p in payloads if isinstance(p, dict) and "word" in p]
        assert max(p["count"] for p in counts if p["word"] == "big") == words["big"]  # folded: one bucket
        assert max(p["count"] for p in counts if p["word"] == "neg") == words["neg"]
        assert max(p["count"] for p in counts if p["word"] == "the") == words["the"]  # plain counting went on
        assert [p["ratio"] for p in counts if p["word"] == "nan"] == [None] * words["nan"]  # NaN written as null
        tuples = sorted(p for p in payloads if isinstance(p, str))
        assert tuples == sorted(repr({("tuple", n): n}) for n in range(1, words["tuple"] + 1))  # tuple keys: repr

        # After all of it, a plain word count push is still released exactly, and nothing else shows up.
        client.push(["the end"])
        expected = expected_records(cluster)
        tail = consume_all(client, "after-poison", 2, timeout=60)
        assert sorted(json.dumps(r.payload) for r in tail) == sorted(
            json.dumps({"word": w, "count": words.get(w, 0) + 1}) for w in ("the", "end"))
        assert len(expected) == len(payloads) + 2
        assert consume_all(client, "after-poison", 1, timeout=6) == []
    for process in processes:  # no node died on the way
        assert _alive(process["pid"]), process


def test_an_output_that_cannot_cross_workers_is_its_dead_letter(cluster: Cluster) -> None:
    """A map output that is no plain value (a namedtuple) cannot be encoded for another worker: it becomes its
    item's dead letter, with its ack, and the worker goes on (it used to stop its node).  Where the same output
    stays on its worker it is processed as the oracle processes it, so only the dead letters differ from the
    oracle; every other word is counted exactly."""
    graph = poisonfns.unplain()
    graph.sys_path = [str(ROOT)]  # the nodes import tests.poisonfns from the source tree
    lines = [f"nt a {i}" for i in range(40)]
    processes = cluster.state()["processes"]
    with cluster.client() as client:
        client.deploy(graph)
        client.push(lines)
        expected, _ = run_oracle(graph, read_input_logs(cluster.data))
        got = [r.payload for r in consume_all(client, "unplain", len(expected), timeout=90)]
    letters = [p["dead_letter"] for p in got if is_dead_letter(p)]
    assert letters and all(d["operation"] == "counts" and "Word cannot be encoded" in d["error"] for d in letters)
    counted = [p for p in got if not is_dead_letter(p)]
    assert sorted(p["count"] for p in counted if p["word"] == "a") == list(range(1, 41))
    assert sorted(p["count"] for p in counted if p["word"] == "nt") == list(range(1, 41 - len(letters)))
    assert len(got) == len(expected)  # each dead letter stands for one oracle record
    for process in processes:
        assert _alive(process["pid"]), process


@pytest.mark.parametrize("graph", [poisonfns.graph(), poisonfns.carried(balanced_entry=True),
                                   poisonfns.carried(balanced_entry=False)], ids=["poison", "balanced", "replicated"])
def test_spark_replay_balances_and_fails_like_the_oracle(spark: Any, tmp_path: Path, graph: Graph) -> None:
    """Replay's entry pass and stages fold hashes and reject events as the oracle does, and write records with
    the same encoding (dead letters included)."""
    from flamestream.spark.replay import replay

    if graph.name == "poison":
        events: list[Any] = [" ".join(poisonfns.POISON_WORDS[(i + j) % 8] if j % 2 else f"w{(i * j) % 4}"
                                      for j in range(6)) for i in range(30)]
    else:
        results: list[Any] = [None, "x", 2**40 + 3, -(2**40) - 1, 7, True, 2.5, [1], 2**31, -(2**31) - 1]
        events = [{"k": i, "hs": [results[i % 10], results[(i * 3) % 10], results[(i * 7 + 1) % 10]]}
                  for i in range(40)]
    graph.sys_path = [str(ROOT)]  # executors import the test's business logic too
    stamped = stamp_inputs(events, 2, per_ms=2)
    write_input_logs(tmp_path, stamped)
    output, _rejected = run_oracle(graph, stamped)
    expected = [(gt, decode_payload(encode_payload(payload))) for gt, payload in output]
    replay(spark, tmp_path, str(tmp_path / "out"), graph=graph, partitions=3, progress=lambda line: None)
    got = replayed(spark, tmp_path / "out")
    assert as_multiset(got) == as_multiset(expected)
    assert any(is_dead_letter(payload) for _gt, payload in expected)
