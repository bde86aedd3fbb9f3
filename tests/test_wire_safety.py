"""No code execution from the wire (issue #12): item batches decode to plain values or are refused, exactly.

Three levels.  The codec: any plain payload round-trips with its exact types; garbage, a pickle whose
``__reduce__`` runs a shell command and every malformed shape are refused with ``ValueError`` (``BatchError``),
and the command never runs.  The handlers in-process: a bad batch aborts its own call, and envelopes must fit
the graph and tick that take them.  A real cluster (slow):
hostile batches sent straight to ``Worker.Exchange`` and ``Barrier.Deliver`` end with INVALID_ARGUMENT, every
process stays alive and SERVING, and a word count pushed around them is still exactly the oracle's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import pickle
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import inverted_index, wordcount
from flamestream.barrier.service import BarrierService
from flamestream.core import values
from flamestream.core.graph import Graph
from flamestream.core.hashing import INT32_MAX, INT32_MIN
from flamestream.core.item import Envelope, Item
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.core.worker import Worker
from flamestream.runtime.channels import LocalEndpoints
from flamestream.runtime.hosting import LocalAbort, LocalContext
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.workers import service as worker_service
from flamestream.workers.service import WorkerService
from tests.test_cluster_e2e import (
    Cluster,
    _alive,
    as_multiset,
    consume_all,
    expected_from_input_logs,
    running,
)
from tests.test_nodes import health

G = GlobalTime(1_700_000_000_000, 0)
stubs: Any = rpc  # generated without annotations


def over_the_wire(batch: pb.ItemBatch) -> pb.ItemBatch:
    return pb.ItemBatch.FromString(batch.SerializeToString())


def exact(a: Any, b: Any) -> bool:
    """Equal *and* of the same types all the way down; NaN equals NaN and -0.0 differs from 0.0 (``repr``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(exact(x, y) for x, y in zip(a, b, strict=True)) and \
            all(exact(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


# -- payloads and batches, generated --------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**64, max_value=2**200),
                    st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8))
hashables = st.recursive(scalars, lambda inner: st.one_of(st.tuples(inner, inner), st.frozensets(inner, max_size=3)),
                         max_leaves=5)
payloads = st.recursive(
    # bytearray: not hashable, so no key, but plain (pickle builds it without a global, see values)
    st.one_of(scalars, st.just(math.nan), st.binary(max_size=8).map(bytearray)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner), st.tuples(),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3),
                            st.dictionaries(hashables, inner, max_size=3), st.sets(hashables, max_size=3),
                            st.frozensets(hashables, max_size=3)),
    max_leaves=15)
times = st.builds(GlobalTime, st.integers(-(2**63), 2**63 - 1), st.integers(0, INT32_MAX))
traces = st.lists(st.integers(0, 2**70), max_size=6).map(tuple)
hashes = st.one_of(st.none(), st.integers(INT32_MIN, INT32_MAX))
envelope_lists = st.lists(st.tuples(st.integers(0, INT32_MAX), hashes,
                                    st.tuples(payloads, times, traces, st.booleans())), max_size=12)


@st.composite
def record_lists(draw: st.DrawFn) -> list[Item]:
    """Barrier items: a serialized record, or None for a tombstone; a few times shared, as a step makes them."""
    pool = draw(st.lists(times, min_size=1, max_size=3))
    tombstones = draw(st.lists(st.booleans(), max_size=12))
    return [(None if t else draw(st.binary(max_size=30)), draw(st.sampled_from(pool)), draw(traces), t)
            for t in tombstones]


@settings(max_examples=300, deadline=None)
@given(entries=envelope_lists, sender=st.integers(-(2**31), INT32_MAX))
def test_envelopes_round_trip_exactly(entries: list[Envelope], sender: int) -> None:
    acks = codec.new_acks({item[1] for _op, _h, item in entries})
    batch = over_the_wire(codec.encode_batch(entries, acks, sender, 0))
    decoded, got = codec.decode_envelopes(batch)
    assert exact(decoded, entries) and all(type(e[2][1]) is GlobalTime for e in decoded)
    assert got == acks and batch.sender == sender
    assert exact(codec.decode_batch(batch)[0], entries)


@settings(max_examples=200, deadline=None)
@given(items=record_lists())
def test_barrier_items_round_trip_exactly(items: list[Item]) -> None:
    decoded, _acks = codec.decode_items(over_the_wire(codec.encode_batch(items, {}, 0, 0)))
    assert exact(decoded, items) and all(type(item[1]) is GlobalTime for item in decoded)


def test_a_batch_keeps_what_json_would_lose() -> None:
    payload = ({1: "int key", (2, 3): "tuple key"}, 2**100, -0.0, math.nan, {frozenset({1}), "s"}, b"\x00", ())
    envelopes = [(4, -5, (payload, G, (0, 1 << 32), False)), (0, None, ("w", G, (), True))]
    decoded, _ = codec.decode_envelopes(codec.encode_batch(envelopes, {}, 1, 0))
    assert exact(decoded, envelopes)


# -- refused ------------------------------------------------------------------------------------------------------

class Exploit:
    """Unpickling this runs ``touch <marker>``: what a crafted batch did to a pickle-decoding receiver."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def crafted_batch(marker: Path, items: bool = False) -> pb.ItemBatch:
    """A pickled batch of the old shape whose payload is an ``Exploit``."""
    item = (Exploit(marker), G, (0,), False)
    return pb.ItemBatch(items=pickle.dumps([item] if items else [(0, None, item)], protocol=pickle.HIGHEST_PROTOCOL),
                        tick=0)


def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    control = tmp_path / "CONTROL"
    pickle.loads(crafted_batch(control).items)  # the old decoder: the exploit is real
    assert control.exists()
    marker = tmp_path / "MARKER"
    for decode in (codec.decode_envelopes, codec.decode_items, codec.decode_batch):
        for batch in (crafted_batch(marker), crafted_batch(marker, items=True)):
            with pytest.raises(ValueError, match=r"refusing to load (os|posix)\.system"):
                decode(batch)
    # The same through other opcodes that name a callable: protocol 0 GLOBAL + REDUCE, INST.
    for data in (b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.",
                 b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n."):
        with pytest.raises(codec.BatchError, match=r"refusing to load os\.system"):
            codec.decode_envelopes(pb.ItemBatch(items=data, tick=0))
    assert not marker.exists()


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_garbage_is_refused_with_value_error_only(data: bytes) -> None:
    for decode in (codec.decode_envelopes, codec.decode_items, codec.decode_batch):
        with pytest.raises(codec.BatchError):
            decode(pb.ItemBatch(items=data, tick=0))


def test_every_truncation_of_a_batch_is_refused() -> None:
    data = codec.encode_batch([(1, 7, ({"k": (1, 2)}, G, (3,), False))], {}, 0, 0).items
    for end in range(len(data)):
        with pytest.raises(codec.BatchError):
            codec.decode_envelopes(pb.ItemBatch(items=data[:end], tick=0))
    with pytest.raises(codec.BatchError, match="2 values"):
        codec.decode_envelopes(pb.ItemBatch(items=data + data, tick=0))


def envelope_body(**changes: Any) -> tuple[Any, ...]:
    """The columns of a valid two-envelope batch (see codec._ENVELOPES), with ``changes`` applied."""
    columns = {"ops": (1, 2), "hashes": (5, None), "payloads": ("a", ("b",)), "times": [G.ts, G.front],
               "time_of": [0, 0], "traces": ((0,), (0, 1)), "tombstones": (False, True)}
    columns.update(changes)
    return (1, *columns.values())


def items_body(**changes: Any) -> tuple[Any, ...]:
    columns = {"payloads": (b"record", None), "times": [G.ts, G.front], "time_of": [0, 0], "traces": ((0,), (1,)),
               "tombstones": (False, True)}
    columns.update(changes)
    return (2, *columns.values())


def test_the_valid_bodies_below_are_valid() -> None:
    assert len(codec.decode_envelopes(pb.ItemBatch(items=values.encode(envelope_body()), tick=0))[0]) == 2
    assert len(codec.decode_items(pb.ItemBatch(items=values.encode(items_body()), tick=0))[0]) == 2


BIG = b"r" * 1000

MALFORMED_ENVELOPES = {
    "operation index negative": (envelope_body(ops=(-1, 2)), "operation index"),
    "operation index a str": (envelope_body(ops=("1", 2)), "operation index"),
    "operation index a float": (envelope_body(ops=(1.0, 2)), "operation index"),
    "hash beyond int32": (envelope_body(hashes=(2**31, None)), "int32"),
    "hash below int32": (envelope_body(hashes=(INT32_MIN - 1, None)), "int32"),
    "hash a str": (envelope_body(hashes=("", None)), "int32"),
    "hash a bool": (envelope_body(hashes=(False, None)), "int32"),
    "trace a list": (envelope_body(traces=([0], (0, 1))), "trace"),
    "trace of floats": (envelope_body(traces=((0.5,), (0, 1))), "trace"),
    "trace of strs": (envelope_body(traces=(("x",), (0, 1))), "trace"),
    "trace of bytes": (envelope_body(traces=((b"x",), (0, 1))), "trace"),
    "trace a dict": (envelope_body(traces=({0: 0}, (0, 1))), "trace"),
    "tombstone an int": (envelope_body(tombstones=(0, True)), "tombstone"),
    "timestamp beyond int64": (envelope_body(times=[2**63, 0]), "out of range"),
    "front negative": (envelope_body(times=[1, -1]), "out of range"),
    "front beyond int32": (envelope_body(times=[1, 2**31]), "out of range"),
    "time a str": (envelope_body(times=["1", 0]), "pairs of ints"),
    "half a time": (envelope_body(times=[1]), "pairs of ints"),
    "time index out of range": (envelope_body(time_of=[0, 1]), "global time"),
    "time index a str": (envelope_body(time_of=[0, "0"]), "global time"),
    "time index a float": (envelope_body(time_of=[0, 0.0]), "global time"),
    "a column short": (envelope_body(payloads=("a",)), "length"),
    "a column a dict": (envelope_body(ops={1: 1, 2: 2}), "neither a list nor a tuple"),
    "a column a str": (envelope_body(payloads="ab"), "neither a list nor a tuple"),
    "a column missing": (envelope_body()[:-1], "not an item batch"),
    "an unknown kind": ((9, 1, 2), "not an item batch"),
    "a kind that is a bool": ((True, *envelope_body()[1:]), "not an item batch"),
    "not a tuple": ([1, 2, 3], "not an item batch"),
    "items where envelopes belong": (items_body(), "items where envelopes belong"),
    "what the encoder could not shape": ((3, "why"), "neither all envelopes nor all items: why"),
}

MALFORMED_ITEMS = {
    "a record that is a str": (items_body(payloads=("text", None)), "serialized record"),
    "a record that is a bytearray": (items_body(payloads=(bytearray(b"r"), None)), "serialized record"),
    "a record of a tombstone": (items_body(payloads=(b"r", b"t")), "tombstone"),
    "no record, not a tombstone": (items_body(payloads=(None, None)), "tombstone"),
    "one record referenced by every item": (
        items_body(payloads=(BIG,) * 50, time_of=[0] * 50, traces=((0,),) * 50, tombstones=(False,) * 50),
        "more bytes than the message"),
    "envelopes where items belong": (envelope_body(), "envelopes where items belong"),
}


@pytest.mark.parametrize("body, reason", MALFORMED_ENVELOPES.values(), ids=list(MALFORMED_ENVELOPES))
def test_malformed_envelopes_are_refused_with_the_reason(body: tuple[Any, ...], reason: str) -> None:
    with pytest.raises(codec.BatchError, match=reason):
        codec.decode_envelopes(pb.ItemBatch(items=values.encode(body), tick=0))


@pytest.mark.parametrize("body, reason", MALFORMED_ITEMS.values(), ids=list(MALFORMED_ITEMS))
def test_malformed_barrier_items_are_refused_with_the_reason(body: tuple[Any, ...], reason: str) -> None:
    # pickle.dumps keeps the memo (values.encode writes a shared record once per reference): a crafted batch
    # may come from any pickler.
    with pytest.raises(codec.BatchError, match=reason):
        codec.decode_items(pb.ItemBatch(items=pickle.dumps(body, pickle.HIGHEST_PROTOCOL), tick=0))


def test_what_cannot_cross_is_named_when_encoded_and_wrong_shapes_are_refused_when_decoded() -> None:
    point = collections.namedtuple("point", "x y")
    with pytest.raises(codec.BatchError, match="type point cannot be encoded"):
        codec.encode_batch([(0, None, (point(1, 2), G, (0,), False))], {}, 0, 0)
    not_a_time = codec.encode_batch([(b"r", (G.ts, G.front), (0,), False)], {}, 0, 0)  # a plain tuple is no time
    with pytest.raises(codec.BatchError, match=r"nor an item .*: \(b'r', \(1700000000000, 0\)"):
        codec.decode_items(not_a_time)
    mixed = codec.encode_batch([(0, None, ("a", G, (0,), False)), (b"r", G, (0,), False)], {}, 0, 0)
    with pytest.raises(codec.BatchError, match="envelopes and items mixed"):
        codec.decode_batch(mixed)
    assert codec.decode_batch(codec.encode_batch([], {G: 5}, 0, 0)) == ([], {G: 5})


def test_a_sender_bug_in_a_global_time_is_refused_by_the_receiver_never_passed_on_as_another_time() -> None:
    """The encoder rebuilds global times, so it must not let a wrong one through as its neighbour's time: an
    item whose time is None after (or before) a good one, or a time of floats, is refused by every decoder."""
    good = (0, None, ("a", G, (0,), False))
    for entries in ([(0, None, ("b", None, (0,), False)), good], [good, (0, None, ("b", None, (0,), False))]):
        with pytest.raises(codec.BatchError, match="nor an item"):
            codec.decode_envelopes(codec.encode_batch(entries, {}, 0, 0))
    with pytest.raises(codec.BatchError, match="pairs of ints"):
        codec.decode_envelopes(codec.encode_batch([(0, None, ("a", GlobalTime(1.5, 0), (0,), False))], {}, 0, 0))
    as_tuple = codec.encode_batch((good,), {}, 0, 0)  # type: ignore[arg-type]  # a caller's tuple of entries
    assert codec.decode_envelopes(as_tuple)[0] == [good]


# -- the handlers, in-process --------------------------------------------------------------------------------

async def requests(*batches: pb.ItemBatch) -> AsyncIterator[pb.ItemBatch]:
    for batch in batches:
        yield batch


def test_handlers_abort_their_own_call_on_a_bad_batch(tmp_path: Path) -> None:
    """The in-process path (a node's own front or workers): the same refusal, as a LocalAbort."""
    marker = tmp_path / "MARKER"

    async def run() -> None:
        worker = WorkerService(0, LocalEndpoints())
        barrier = BarrierService({}, LocalEndpoints())
        for batch in (crafted_batch(marker), pb.ItemBatch(items=b"\x80\x05garbage", tick=0)):
            with pytest.raises(LocalAbort) as aborted:
                await worker.Exchange(requests(batch), cast(Any, LocalContext()))
            assert aborted.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "worker0 refused the batch" in aborted.value.details
            with pytest.raises(LocalAbort) as aborted:
                await barrier.Deliver(requests(batch), cast(Any, LocalContext()))
            assert aborted.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert worker.inbox.empty()

    asyncio.run(run())
    assert not marker.exists()


def deployment(graph: Graph, start: GlobalTime) -> Any:
    tick = Tick(0, start, graph.to_dict(), Layout.even(1), workers=("w",), fronts=(0,), acker="a", barriers=((0, "b"),))
    # No stream is ever opened here, so none can break.
    return worker_service._Deployment(tick, Worker(compile_graph(graph), 0, tick.layout), LocalEndpoints(),
                                      lambda broken: pytest.fail(f"no stream should break: {broken}"))


def test_envelopes_must_fit_the_graph_and_tick_that_take_them(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """What only the worker can check: the operation is the graph's, a balanced one has its hash, the front has a
    barrier.  Envelopes at or after the newest tick's start may be for a tick still on its way, so they wait."""
    monkeypatch.setattr(worker_service, "TICK_WAIT", 0.3)
    start = GlobalTime(100, 0)
    before, after = GlobalTime(50, 0), GlobalTime(150, 0)
    by_word = compile_graph(wordcount.graph()).names.index("by_word")  # a grouping: balanced
    changelog = compile_graph(inverted_index.graph()).names.index("changelog")  # op 6: not in word count's graph

    def env(op: int, gt: GlobalTime, h: int | None = None) -> Envelope:
        return (op, h, ("w", gt, (0,), False))

    async def run() -> None:
        worker = WorkerService(0, LocalEndpoints())
        worker.current = deployment(wordcount.graph(), start)
        worker.ready.set()
        assert await worker._refusal([env(1, after), env(by_word, after, 5)]) is None
        refusal = await worker._refusal([env(99, before)])  # below the start: at once
        assert refusal is not None and "operation 99 is not one of the 6 operations" in refusal
        refusal = await worker._refusal([env(by_word, before)])
        assert refusal is not None and "has no hash" in refusal
        refusal = await worker._refusal([env(1, GlobalTime(50, 5))])
        assert refusal is not None and "front 5 has no barrier" in refusal
        waited = time.monotonic()
        refusal = await worker._refusal([env(changelog, after)])
        assert refusal is not None and "no newer tick came within 0.3s" in refusal
        assert time.monotonic() - waited >= 0.3
        # A newer tick, taken up while the stream waits, fits it.
        pending = asyncio.create_task(worker._refusal([env(changelog, after)]))
        await asyncio.sleep(0.1)
        worker.current = deployment(inverted_index.graph(), GlobalTime(120, 0))
        assert await pending is None
        # And what was checked before a tick came that it does not fit is dropped, not run, with a warning.
        worker.current = deployment(wordcount.graph(), start)
        with caplog.at_level(logging.WARNING):
            assert worker._fitting([env(1, after), env(changelog, after)]) == [env(1, after)]
        assert "dropped 1 of 2 envelopes" in caplog.text

    asyncio.run(run())


# -- a real cluster ----------------------------------------------------------------------------------------------

@pytest.fixture
def two_nodes(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[Cluster]:
    """Node 0: acker, worker 0, front 0, barrier 0; node 1: worker 1 — both workers reachable over gRPC."""
    with running(tmp_path / "cluster", zookeeper, cluster_name, "--nodes", "2") as started:
        yield started


def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    return failure.value.code(), failure.value.details() or ""


@pytest.mark.slow
def test_hostile_batches_end_only_their_own_call(two_nodes: Cluster, tmp_path: Path) -> None:
    cluster = two_nodes
    cluster.deploy("examples/wordcount.py")
    processes = cluster.state()["processes"]
    members = {name: (role, p["address"]) for p in processes for role, name in p.get("members", [])}
    marker = tmp_path / "MARKER"
    early = GlobalTime(1, 0)  # below the tick's start: no newer tick can own it, so a misfit is refused at once
    to_workers = {
        "a crafted pickle": crafted_batch(marker),
        "garbage": pb.ItemBatch(items=os.urandom(64), tick=0),
        "an operation the graph does not have": codec.encode_batch([(99, None, ("a", early, (0,), False))], {}, -1, 0),
        "a hash beyond int32": codec.encode_batch([(0, 2**40, ("a", early, (0,), False))], {}, -1, 0),
        "barrier items": codec.encode_batch([(b"r", early, (0,), False)], {}, -1, 0),
    }
    to_barriers = {
        "a crafted pickle": crafted_batch(marker, items=True),
        "garbage": pb.ItemBatch(items=b"\x80\x05\x95garbage", tick=0),
        "envelopes": to_workers["an operation the graph does not have"],
        "an item of a partition it does not own": codec.encode_batch([(b"r", GlobalTime(1, 7), (0,), False)], {}, 0, 0),
    }
    lines = [f"the dog {i % 5} saw the cat {i % 3}" for i in range(80)]
    with cluster.client() as client:
        client.push(lines[:40])
        for name, (role, address) in members.items():
            attacks = to_workers if role == "worker" else to_barriers if role == "barrier" else {}
            with cluster.channel(address, node=True) as channel:  # a peer's certificate: past authentication
                for what, batch in attacks.items():
                    call = stubs.WorkerStub(channel).Exchange if role == "worker" else \
                        stubs.BarrierStub(channel).Deliver
                    code, details = status_of(lambda c=call, b=batch: c(iter([b]), timeout=30))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, what, code, details)
                    assert f"{name} refused the batch" in details, (name, what, details)
        assert not marker.exists()
        for p in processes:
            assert _alive(p["pid"]), p
            if p.get("address"):
                for service in ["", *(name for _role, name in p["members"])]:
                    assert health(p["address"], service, cluster.state()["tls_dir"]) == "SERVING", (p["name"], service)
        client.push(lines[40:])
        expected = expected_from_input_logs(cluster, wordcount.graph())
        assert len(expected) == sum(len(line.split()) for line in lines)
        got = consume_all(client, "after", len(expected) + 1, timeout=60)  # one more: nothing extra may come
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    logs = "".join(path.read_text() for path in (cluster.data / "logs").glob("*.log"))
    assert logs.count("refused a batch") == 2 * len(to_workers) + len(to_barriers), logs[-3000:]
