"""10,000 hypothesis-generated requests against every RPC of a running ``--tls`` cluster (issue #12).

What is fuzzed: every method of every service in the generated descriptors
(``flamestream_pb2`` and the standard health service), so a new RPC is fuzzed
without touching this file, on every node of a two-node cluster.  A request is
one message (unary and server-streaming methods) or zero to three (client
streams), each either a random protobuf message of the method's request type
(every field random: extreme ints, odd strings, nested and repeated messages,
payloads that are JSON, nearly JSON or not at all, item batches that are
garbage, plain values or crafted envelopes) or raw bytes (random, or a message
cut short or with bytes inserted), sent through identity serializers.

Who sends: mostly the cluster's own credentials — a node certificate plus the
admin token — so requests get past authentication and reach the handlers,
whose robustness is the point; the rest with the clients' certificate and no
token, a bogus token or the push token, and over plaintext, which must all be
refused before any handler runs.

What must hold: every call ends with a status within its deadline, with a
message unless OK; none is UNKNOWN (an exception a handler did not turn into
its request's status); only server streams, which legitimately wait for more
(``Subscribe`` follows the topic live, ``WatchMinTime`` and health ``Watch``
wait for changes), and the one call in twenty whose client gives up after
20 ms may end with DEADLINE_EXCEEDED.  Afterwards no process died
or was restarted, every node and role is SERVING, and a word count pushed
through the SDK comes out exactly as the oracle says.

What the fuzzer may not send, and why.  A member (node certificate) is trusted
to keep the exactly-once protocol: a forged ack with a non-zero value holds the
min time back forever, a false report releases and trims too early, and a
well-formed item batch injects items into the stream.  Those are legitimate
mutations, not robustness bugs, so a member's internal requests are defused
(``defused``): its acks carry zero (XOR with zero changes nothing), a report
names a front no tick has (refused before its acks count), and an item batch
that would decode to items the receiver takes is replaced by garbage — what is
left reaches every check the handlers make, and refusals.  Public requests go
unchanged: pushes the fronts admit are in their input logs, which the oracle
reads, so the word count check covers the fuzzed events too (the clean events
use their own producer and words that no fuzzed event can hold); commits go to
random groups, and the check reads with a group of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from examples import wordcount
from flamestream.client import Client
from flamestream.core import values
from flamestream.core.meta import GlobalTime
from flamestream.wire import codec, transport
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.security import ADMIN, PUBLIC_METHODS, PUSH, Credentials
from tests.test_cluster_e2e import (
    Cluster,
    _alive,
    as_multiset,
    cli,
    consume_all,
    expected_from_input_logs,
    running,
)
from tests.test_nodes import health

pytestmark = pytest.mark.slow

REQUESTS = 10_000
CONCURRENCY = 64
"""Calls in flight at once: most are answered at once, the server streams wait out their deadline."""
DEADLINE = 30.0
"""Seconds for unary and client-streaming calls: generous, since none of them may legitimately wait long and the
machine is shared; running over it is a failure."""
WAITING_DEADLINE = 1.0
"""Seconds for server streams, which legitimately wait for more (and then end with DEADLINE_EXCEEDED)."""
HURRIED_DEADLINE = 0.02
"""Seconds for one call in 20: the client gives up while the handler is at work, so the handlers' cancellation
paths run too (a push that began is admitted all the same: the word count check covers it)."""
HANG_GRACE = 15.0
"""Seconds past its deadline after which a call counts as hung (the client stopped waiting for a status)."""
FOREIGN = 1_000_000
"""A front, partition and operation number that no tick of this test has: what defused requests name."""
EARLY_TS = 10**12
"""Timestamps below this (September 2001) are below any tick's start: a misfit batch there is refused at once
instead of waiting for a newer tick that could fit it."""


# -- the RPCs, from the descriptors ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rpc:
    path: str
    request: Descriptor
    client_streaming: bool
    server_streaming: bool


def every_rpc() -> list[Rpc]:
    """Every method the nodes can serve: the wire contract's services and the standard health service."""
    found = [Rpc(f"/{service.full_name}/{method.name}", method.input_type, method.client_streaming,
                 method.server_streaming)
             for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR)
             for service in file.services_by_name.values() for method in service.methods]
    return sorted(found, key=lambda rpc: rpc.path)


# -- who calls ---------------------------------------------------------------------------------------------------

class Identity(NamedTuple):
    name: str
    certificate: str | None
    """``node`` (a member), ``client`` (the clients' shared certificate), or None: plaintext."""
    token: str | None
    """The token role sent (``bogus``: a token the cluster never issued), or None."""

    def may_call(self, path: str) -> bool:
        """Whether the cluster's rules let this identity reach the handler of ``path``."""
        if self.certificate is None:
            return False
        if path not in PUBLIC_METHODS:
            return self.certificate == "node"
        role = PUBLIC_METHODS[path]
        return role is None or self.token in (role, ADMIN)


MEMBER = Identity("member", "node", ADMIN)
IDENTITIES = ([MEMBER] * 6 + [Identity("admin client", "client", ADMIN)] * 2 +
              [Identity("no token", "client", None), Identity("bogus token", "client", "bogus"),
               Identity("push token", "client", PUSH), Identity("plaintext", None, None)])
"""Half the requests come from a member with the admin token, which reaches every handler."""

REFUSALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED,
            grpc.StatusCode.UNAVAILABLE}
"""What a call the rules refuse may end with (UNIMPLEMENTED: the node hosts no such service)."""
NOT_SERVED = "Method not found!"
"""gRPC's message for a method the node does not serve (a handler's own UNIMPLEMENTED says something else)."""


# -- what they send ----------------------------------------------------------------------------------------------

def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [low, low + 1, -1, 0, 1, high - 1, high]
    return st.one_of(st.sampled_from([e for e in edges if low <= e <= high]), st.integers(low, high))


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1), FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1), FieldDescriptor.TYPE_ENUM: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1), FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1), FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1), FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}

_SIZES = st.sampled_from([0, 1, 255, 256, 257, 4096, 65536] * 28 + [(1 << 20) - 1, 1 << 20, (1 << 20) + 1, 9 << 20])
"""Lengths around the limits (names: 256 bytes; events: 1 MiB; pushes: 8 MiB), the megabytes 1 in 50."""

_TEXT = st.characters(exclude_categories=["Cs"])
"""Characters without lone surrogates, which no UTF-8 holds: what protobuf strings and admitted payloads carry."""

_ODD_TEXT = st.one_of(
    st.text(_TEXT, max_size=40),
    st.sampled_from(["", ".", "..", "/", "a/b", "/zookeeper", "\x00", "~", "~anon-", "~anon-" + "0" * 32 + "-0",
                     "g" * 256, "g" * 257, "é" * 128, "\u2028", "worker0", "front0", "barrier0", "acker"]),
    st.builds(str.__mul__, st.sampled_from(["a", "/", "é", "\x00"]), _SIZES))

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def _dumps(value: Any, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


_VALID = st.one_of(
    st.builds(lambda value, ascii_only: json.dumps(value, ensure_ascii=ascii_only), st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) |
        st.text(_TEXT, max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(_TEXT, max_size=8), inner, max_size=4),
        max_leaves=12), st.booleans()),
    st.builds(lambda words: json.dumps(" ".join(words)), st.lists(  # lines the word count splits into words
        st.sampled_from(["the", "dog", "a", "é", "İ", "ß", "x" * 100]) | st.text(_TEXT, min_size=1, max_size=6),
        max_size=20)),
    st.builds(lambda depth: "[" * depth + "]" * depth, st.integers(60, 64)))  # nesting up to the limit
"""Payloads the front admits, ``ensure_ascii`` or not: the fuzzed events that reach the workers and the topic."""

_PAYLOAD = st.one_of(
    _VALID.map(str.encode), _VALID.map(str.encode), _VALID.map(str.encode),
    st.builds(_dumps, _JSON, st.booleans()),                     # NaN, lone surrogates and all
    st.binary(max_size=64),
    st.builds(lambda depth, kind: kind[0] * depth + kind[1] * depth, st.integers(0, 3000),
              st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")])),  # nesting around the limit and far past it
    st.builds(lambda digits: b"9" * digits, st.sampled_from([19, 20, 400, 4300, 4301, 100_000])),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"\\ud800"', b"\xff", b'"\xed\xa0\x80"',
                     b"", b" ", b"null", b"[]", b"{}"]),
    st.builds(lambda n: b'"' + b"x" * n + b'"', _SIZES))
"""Event payloads: admissible three times in eight, else each way the front must refuse, and sizes around its
limits."""


_TIMES = st.builds(GlobalTime, _ints(-(1 << 64), 1 << 64), _ints(-(1 << 32), 1 << 32))
_TRACES = st.lists(_ints(-(1 << 64), 1 << 64), max_size=3).map(tuple)
_ENVELOPES = st.lists(st.tuples(_ints(-1, 1 << 32), st.none() | _ints(-(1 << 32), 1 << 32),
                                st.tuples(_JSON, _TIMES, _TRACES, st.booleans())), max_size=4)
_RECORDS = st.lists(st.tuples(st.none() | st.binary(max_size=40), _TIMES, _TRACES, st.booleans()), max_size=4)
_ENCODED_BATCHES = st.builds(lambda entries: codec.encode_batch(entries, {}, 0, 0).items, _ENVELOPES | _RECORDS)
"""The ``items`` of well-formed batches of envelopes or of barrier items, their values anywhere in their ranges
or past them (the acks travel in their own protobuf field)."""

_BATCH_BYTES = st.one_of(
    st.binary(max_size=200),
    st.builds(values.encode, st.tuples(st.integers(-1, 4), st.lists(_JSON, max_size=3))),  # plain, wrongly shaped
    _ENCODED_BATCHES)

_PARTITIONS = st.one_of(st.sampled_from([0, 0, 1, -1]), _ints(-(1 << 31), (1 << 31) - 1))

_OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "flamestream.Event.payload": _PAYLOAD,
    "flamestream.Event.producer": st.sampled_from(["", "", "p0", "p1"]) | _ODD_TEXT,  # some producers in common
    "flamestream.Event.sequence": st.integers(0, 20) | _ints(0, (1 << 64) - 1),
    "flamestream.ItemBatch.items": _BATCH_BYTES,
    "flamestream.SubscribeRequest.partition": _PARTITIONS,
    "flamestream.CommitRequest.partition": _PARTITIONS,
    "flamestream.CommittedRequest.partition": _PARTITIONS,
    "flamestream.SubscribeRequest.from_offset": st.one_of(st.integers(-2, 20), _ints(-(1 << 63), (1 << 63) - 1)),
    "flamestream.CommitRequest.offset": st.one_of(st.integers(-2, 20), _ints(-(1 << 63), (1 << 63) - 1)),
    "grpc.health.v1.HealthCheckRequest.service": st.one_of(
        st.sampled_from(["", "worker0", "worker1", "front0", "barrier0", "acker"]), _ODD_TEXT),
}
"""Fields whose values are steered towards what the handlers look at (the rest are random over their type)."""


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.full_name in _OVERRIDES:
        return _OVERRIDES[field.full_name]
    if field.type in _INT_RANGES:
        return _ints(*_INT_RANGES[field.type])
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=64 if field.type == FieldDescriptor.TYPE_DOUBLE else 32)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _ODD_TEXT
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=100) | _PAYLOAD
    raise AssertionError(f"{field.full_name}: a field type the fuzzer does not know ({field.type})")


_MESSAGES: dict[str, st.SearchStrategy[Message]] = {}


def messages(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Random messages of ``descriptor``'s type: each field unset or random, repeated fields with 0 to 5 values
    (now and then 50), nested messages the same way."""
    if descriptor.full_name not in _MESSAGES:
        _MESSAGES[descriptor.full_name] = st.deferred(lambda: _build(descriptor))
    return _MESSAGES[descriptor.full_name]


def _repeated(one: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """0 to 5 values, and 1 time in 100 fifty."""
    few, many, pick = st.lists(one, max_size=5), st.lists(one, min_size=50, max_size=50), st.integers(0, 99)
    return st.composite(lambda draw: draw(many if draw(pick) == 0 else few))()


def _build(descriptor: Descriptor) -> st.SearchStrategy[Message]:
    cls = message_factory.GetMessageClass(descriptor)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        one = messages(field.message_type) if field.type == FieldDescriptor.TYPE_MESSAGE else _scalar(field)
        if field.is_repeated:
            fields[field.name] = _repeated(one)
        else:
            fields[field.name] = st.none() | one

    def make(drawn: dict[str, Any]) -> Message:
        message = cls()
        for name, value in drawn.items():
            if value is None:
                continue
            target = getattr(message, name)
            if isinstance(value, list):
                target.extend(value)
            elif isinstance(value, Message):
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries(fields).map(make)


def _raw(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes that need not parse: random, or a serialized message cut short or with junk inserted."""
    serialized = messages(descriptor).map(lambda m: m.SerializeToString())
    return st.one_of(
        st.binary(max_size=300),
        st.builds(lambda data, cut: data[:cut], serialized, st.integers(0, 64)),
        st.builds(lambda data, at, junk: data[:at] + junk + data[at:], serialized, st.integers(0, 64),
                  st.binary(min_size=1, max_size=8)))


def defused(path: str, data: bytes) -> bytes:
    """``data`` as a member may send it to ``path`` without changing the stream (see the module docstring).

    Every check is the one the handler makes itself: what the handler refuses
    before it takes anything goes unchanged.
    """
    if path == transport.ACK:
        try:
            acks = pb.AckBatch.FromString(data)
        except DecodeError:
            return data  # never reaches the handler
        if acks.HasField("report"):
            if 0 <= acks.report.front < FOREIGN:
                acks.report.front += FOREIGN  # refused before its acks count
        else:
            for ack in acks.acks:
                ack.xor = 0
        return acks.SerializeToString()
    if path not in (transport.EXCHANGE, transport.DELIVER):
        return data
    try:
        batch = pb.ItemBatch.FromString(data)
    except DecodeError:
        return data
    try:
        entries = (codec.decode_envelopes(batch) if path == transport.EXCHANGE else codec.decode_items(batch))[0]
    except codec.BatchError:
        return data  # refused before anything is taken
    if not entries:
        for ack in batch.acks:
            ack.xor = 0
        return batch.SerializeToString()
    if path == transport.EXCHANGE and all(op >= FOREIGN and item[1].ts < EARLY_TS for op, _h, item in entries):
        return data  # no graph has that operation, and below any tick's start: refused at once
    if path == transport.DELIVER and any(item[1].front >= FOREIGN for item in entries):
        return data  # a partition no barrier owns: the whole batch is refused
    batch.items = b"defused: a batch the receiver would take"
    return batch.SerializeToString()


class Request(NamedTuple):
    rpc: Rpc
    node: int
    identity: Identity
    messages: tuple[bytes, ...]
    hurried: bool
    """The client gives up after ``HURRIED_DEADLINE``."""

    def deadline(self) -> float:
        if self.hurried:
            return HURRIED_DEADLINE
        # Only a server stream that reaches its handler may legitimately wait: a refusal comes at once.
        return WAITING_DEADLINE if self.rpc.server_streaming and self.may_wait() else DEADLINE

    def may_wait(self) -> bool:
        """Whether ending with DEADLINE_EXCEEDED is legitimate: the client hurried, or the call is a server stream
        that reached its handler (which waits for more to send)."""
        return self.hurried or (self.rpc.server_streaming and self.identity.may_call(self.rpc.path))


def request_bodies(rpc: Rpc) -> st.SearchStrategy[bytes]:
    """One message of ``rpc``'s request: a random message three times in four, else raw bytes."""
    structured = messages(rpc.request).map(lambda m: m.SerializeToString())
    return st.one_of(structured, structured, structured, _raw(rpc.request))


def requests(bodies: dict[Rpc, st.SearchStrategy[bytes]], nodes: int) -> st.SearchStrategy[Request]:
    """Requests for any of ``bodies``' RPCs, from any identity, to any of ``nodes`` nodes (every strategy made
    once: making them is most of what drawing costs)."""
    rpcs = st.sampled_from(sorted(bodies, key=lambda rpc: rpc.path))
    identities, counts, node = st.sampled_from(IDENTITIES), st.integers(0, 3), st.integers(0, nodes - 1)
    hurried = st.sampled_from([False] * 19 + [True])

    @st.composite
    def one(draw: st.DrawFn) -> Request:
        rpc, identity = draw(rpcs), draw(identities)
        sent = [draw(bodies[rpc]) for _ in range(draw(counts) if rpc.client_streaming else 1)]
        if identity is MEMBER:
            sent = [defused(rpc.path, data) for data in sent]
        return Request(rpc, draw(node), identity, tuple(sent), draw(hurried))

    return one()


PER_EXAMPLE = 10
"""Requests drawn per hypothesis example: the engine's own cost per example is what generation mostly spends."""


def generate(count: int, nodes: int, run_seed: int) -> list[Request]:
    """``count`` requests, drawn by hypothesis (generation only: the calls are made afterwards, concurrently)."""
    drawn: list[Request] = []
    strategy = requests({rpc: request_bodies(rpc) for rpc in every_rpc()}, nodes)

    @seed(run_seed)
    @settings(max_examples=-(-count // PER_EXAMPLE), phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def collect(batch: list[Request]) -> None:
        drawn.extend(batch)

    collect()
    return drawn[:count]


# -- making the calls --------------------------------------------------------------------------------------------

class Outcome(NamedTuple):
    request: Request
    code: grpc.StatusCode | None
    """None: no status came within the deadline and the grace after it."""
    details: str


def _metadata(identity: Identity, credentials: Credentials) -> tuple[tuple[str, str], ...]:
    if identity.token is None:
        return ()
    token = credentials.tokens.get(identity.token, "bogus-" + "0" * 43)
    return (("authorization", f"Bearer {token}"),)


async def call_all(batch: list[Request], addresses: list[str], tls: Path) -> list[Outcome]:
    """Every request, ``CONCURRENCY`` at a time, each on a channel of its node and identity.

    Client streams go through grpc's synchronous API, in threads: when the
    server ends such a call before the client's last write (a refusal), the
    asyncio client may report INTERNAL "Internal error from Core" instead of
    the server's status (grpc/grpc#36066), which would hide what the handler
    answered.
    """
    member, client = Credentials.load(tls, node="node1"), Credentials.load(tls)
    channels: dict[tuple[int, str | None, bool], Any] = {}

    def channel(node: int, certificate: str | None, blocking: bool) -> Any:
        key = (node, certificate, blocking)
        if key not in channels:
            api: Any = grpc if blocking else grpc.aio
            if certificate is None:
                channels[key] = api.insecure_channel(addresses[node], options=transport.GRPC_OPTIONS)
            else:
                creds = (member if certificate == "node" else client).channel_credentials(with_tokens=False)
                channels[key] = api.secure_channel(addresses[node], creds, options=transport.GRPC_OPTIONS)
        return channels[key]

    limit = asyncio.Semaphore(CONCURRENCY)
    threads = concurrent.futures.ThreadPoolExecutor(CONCURRENCY // 4)
    loop = asyncio.get_running_loop()

    async def one(request: Request) -> Outcome:
        rpc = request.rpc
        timeout = request.deadline()
        options: dict[str, Any] = {"timeout": timeout, "metadata": _metadata(request.identity, client)}
        on = channel(request.node, request.identity.certificate, rpc.client_streaming)
        async with limit:
            try:
                async with asyncio.timeout(timeout + HANG_GRACE):
                    if rpc.client_streaming:
                        call = on.stream_unary(rpc.path)
                        await loop.run_in_executor(threads, lambda: call(iter(request.messages), **options))
                    elif rpc.server_streaming:
                        async for _reply in on.unary_stream(rpc.path)(request.messages[0], **options):
                            pass
                    else:
                        await on.unary_unary(rpc.path)(request.messages[0], **options)
            except grpc.RpcError as exc:  # AioRpcError, or the blocking API's error (also a grpc.Call)
                assert isinstance(exc, grpc.aio.AioRpcError | grpc.Call)
                return Outcome(request, exc.code(), exc.details() or "")
            except TimeoutError:
                return Outcome(request, None, "")
        return Outcome(request, grpc.StatusCode.OK, "")

    try:
        return await asyncio.gather(*map(one, batch))
    finally:
        threads.shutdown()
        for made in channels.values():
            closed = made.close()
            if closed is not None:
                await closed


def problem(outcome: Outcome) -> str | None:
    """What is wrong with how one call ended, or None."""
    request, code, details = outcome
    rpc = request.rpc
    if code is None:
        return "no status within the deadline"
    if code != grpc.StatusCode.OK and not details.strip():
        return f"{code.name} without a message"
    if code == grpc.StatusCode.UNKNOWN:
        return f"UNKNOWN: an exception the handler did not turn into a status: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return None if request.may_wait() else f"ran over its deadline of {DEADLINE:g}s"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata size" in details:
        return f"the status message is longer than a client takes: {details}"
    if request.identity.certificate is None and code != grpc.StatusCode.UNAVAILABLE:
        return f"plaintext call to a --tls node ended with {code.name}: {details}"
    if not request.identity.may_call(rpc.path) and code not in REFUSALS:
        return f"{request.identity.name} is not allowed, yet the call ended with {code.name}: {details}"
    return None


def reached(outcome: Outcome) -> bool:
    """Whether the call got to a handler: not refused by the rules, and the node serves the method."""
    return outcome.details != NOT_SERVED and outcome.code not in REFUSALS - {grpc.StatusCode.UNIMPLEMENTED}


def shown(outcome: Outcome) -> str:
    request = outcome.request
    return (f"{request.rpc.path} on node{request.node} as {request.identity.name}: "
            f"{problem(outcome)} (messages: {[m[:200].hex() for m in request.messages]})")


# -- the test ----------------------------------------------------------------------------------------------------

@pytest.fixture
def secure(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[Cluster]:
    with running(tmp_path / "cluster", zookeeper, cluster_name, "--tls", "--nodes", "2") as started:
        done = cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name,
                   "--credentials", str(started.data / "tls"))
        assert done.returncode == 0, done.stderr
        yield started


def test_ten_thousand_fuzzed_requests_leave_the_cluster_serving_and_exact(secure: Cluster) -> None:
    run_seed = int(os.environ.get("FLAMESTREAM_FUZZ_SEED", random.randrange(1 << 32)))
    context = f"(reproduce with FLAMESTREAM_FUZZ_SEED={run_seed})"
    tls = secure.data / "tls"
    before = secure.state()["processes"]
    nodes = [p for p in before if p["role"] == "node"]
    addresses = [p["address"] for p in sorted(nodes, key=lambda p: p["name"])]

    started = time.monotonic()
    batch = generate(REQUESTS, len(addresses), run_seed)
    generated = time.monotonic()
    assert len(batch) == REQUESTS, (len(batch), context)
    outcomes = asyncio.run(call_all(batch, addresses, tls))
    called = time.monotonic()
    codes = Counter((o.request.rpc.path, o.code.name if o.code else "HUNG") for o in outcomes)
    print(f"generated {len(batch)} requests in {generated - started:.1f}s, called in {called - generated:.1f}s "
          f"{context}; outcomes: {sorted(codes.items())}")
    bad = [shown(o) for o in outcomes if problem(o) is not None]
    assert not bad, f"{len(bad)} calls went wrong {context}:\n" + "\n".join(bad[:20])
    for rpc in every_rpc():  # every RPC was reached by a member, past authentication
        assert any(o.request.rpc == rpc and o.request.identity is MEMBER and reached(o) for o in outcomes), \
            (rpc.path, context)

    after = secure.state()["processes"]
    assert [(p["name"], p["pid"], p["restarts"]) for p in after] == \
        [(p["name"], p["pid"], p["restarts"]) for p in before], context
    for p in after:
        assert _alive(p["pid"]), (p, context)
    for p in nodes:
        for service in ["", *(name for _role, name in p["members"])]:
            assert health(p["address"], service, str(tls)) == "SERVING", (p["name"], service, context)

    mark = uuid.uuid4().hex[:8]
    lines = [f"the clean{mark}{i % 7} dog{mark} saw the cat {i % 3}" for i in range(200)]
    with Client(secure.zookeeper, secure.name, credentials=tls) as client:
        client.push(lines, producer=f"check-{mark}")
        expected = expected_from_input_logs(secure, wordcount.graph())
        got = consume_all(client, f"check-{mark}", len(expected) + 1)  # one more: nothing extra may come
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected), context
    counts: dict[str, int] = {}
    for r in sorted(got, key=lambda r: (r.time, r.partition, r.offset)):
        if isinstance(r.payload, dict) and mark in str(r.payload.get("word")):
            counts[r.payload["word"]] = max(counts.get(r.payload["word"], 0), r.payload["count"])
    assert counts == {f"dog{mark}": 200, **{f"clean{mark}{k}": len(range(k, 200, 7)) for k in range(7)}}, context


def test_every_rpc_is_enumerated_from_the_descriptors() -> None:
    """A new RPC in proto/ is fuzzed without a list to update: the enumeration reads the generated descriptors."""
    paths = {rpc.path for rpc in every_rpc()}
    assert {"/flamestream.Front/Push", transport.EXCHANGE, transport.DELIVER, transport.ACK,
            "/flamestream.Acker/WatchMinTime", "/flamestream.Barrier/Subscribe", "/flamestream.Barrier/Commit",
            "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"} <= paths
    assert len(paths) == sum(len(s.methods) for f in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR)
                             for s in f.services_by_name.values())

