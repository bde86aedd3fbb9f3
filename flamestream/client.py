"""The FlameStream SDK: deploy graphs, push events to the fronts, consume the output topic.

``AsyncClient`` is the implementation (grpc.aio); ``Client`` gives the same
operations to synchronous code by running an ``AsyncClient`` on an event loop
in a background thread, so both behave identically.

Processes are found through their ZooKeeper membership (``members/<role>/``),
read once and re-read after a member becomes unreachable, so a restarted
front or barrier is picked up without recreating the client.

Exactly-once pushing: with a producer id the client numbers the events itself,
``0, 1, 2, ...`` across calls, and the front admits each (producer, sequence)
once.  That deduplication state lives in one front, so all events of a
producer go to the same front (chosen by a stable hash of the id), while
anonymous pushes are spread over the fronts round-robin (each under one of
a few ids per front, so concurrent pushes are all admitted).  The counter only
advances past batches the front acknowledged: after a failed ``push`` the
``ClientError`` says how many events went through (``pushed``), and pushing
the rest again with the same producer id reuses their sequence numbers.  An
anonymous push that failed leaves its id behind instead (its lane takes a new
one): the next push on that lane may be another caller's, with other events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import re
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from kazoo.exceptions import KazooException, NoAuthError  # type: ignore[import-untyped]

from flamestream.cluster import ACKER, BARRIER, FRONT, WORKER, ClusterStore, LeaseMoved
from flamestream.core import BUILD, columns
from flamestream.core.functions import Allowed
from flamestream.core.graph import Graph, changed_groupings, dropped_groupings
from flamestream.core.hashing import stable_hash
from flamestream.core.limits import MAX_NAME_BYTES, RETRY_HINT, group_fault
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.payload import PayloadError, decode_payload, encode_event
from flamestream.core.tick import Layout, Tick, weight_fault
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire.security import ENV, Credentials, discover, find_credentials
from flamestream.wire.transport import channel as open_channel

T = TypeVar("T")

ANONYMOUS = "~anon-"
"""Prefix of the internal producer ids of anonymous pushes (user producer ids may not use it)."""
LANES = 4
"""Anonymous producer ids a client uses per front at most, so pushes to a front in flight at once: each id is a
producer a front remembers for good (its last sequence; ``fronts/producers.py``)."""
PUSH_BATCH = 500
"""Events per Push request: big enough to amortise the front's fsync, small enough to retry cheaply."""
PUSH_BYTES = 4 * 1024 * 1024
"""Payload bytes per Push request at most (fewer events when they are large): half the fronts' default
``--max-push-bytes``, so a batch of large events is split rather than refused."""
_QUEUED_MESSAGES = 4
"""Barrier messages (up to 1000 records each) a consumer buffers before the subscriptions wait for it."""
_MAX_DELAY = 0.5
"""Seconds between retries at most: a restarted member is noticed within this long of coming back (a cluster's
recovery takes 1-3 s, and with 2 s here a consumer often resumed seconds after the stream had)."""

RETRIES = 64
"""Retries of one request by default: about 30 s at ``_MAX_DELAY`` apart.  A kill's recovery takes 1-3 s, but
up to 20 s on a loaded machine or under Docker's vfs storage, and a push that gives up there is the user's to
retry; 5 s (13 retries) was too little for docker-compose's restarted node."""

# FAILED_PRECONDITION is what a front answers until it has seen the first tick
# (right after a deploy); UNAVAILABLE is a member that is restarting or gone, or a restarted front
# waiting for its recovery tick.
_RETRYABLE = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE})


def _chunks(encoded: list[bytes]) -> Iterable[tuple[int, list[bytes]]]:
    """(index of the first event, events) of each Push request: ``PUSH_BATCH`` events or ``PUSH_BYTES`` at most
    (a single larger event goes alone; the front judges it by ``--max-event-bytes``)."""
    start = 0
    while start < len(encoded):
        end, size = start, 0
        while end < len(encoded) and end - start < PUSH_BATCH and \
                (end == start or size + len(encoded[end]) <= PUSH_BYTES):
            size += len(encoded[end])
            end += 1
        yield start, encoded[start:end]
        start = end


class StateWarning(UserWarning):
    """A deploy hands state over to a grouping whose functions are referenced differently: maybe a renamed file,
    maybe keys that mean something else now."""


class InvalidName(ValueError):
    """A consumer group or producer id the cluster would refuse, refused before any request."""


def _check_group(group: str) -> None:
    """Refuse a consumer-group name the barriers refuse (``limits.group_fault``) before any request."""
    fault = group_fault(group)
    if fault is not None:
        raise InvalidName(fault)


def _method(service: str, method: str) -> str:
    """gRPC method path taken from the compiled proto, so it cannot disagree with the servers.

    Multicallables are built from the path because the generated stubs are
    untyped; this keeps requests and responses typed.
    """
    return f"/{pb.DESCRIPTOR.services_by_name[service].full_name}/{method}"


class ClientError(Exception):
    """The cluster refused a request or could not serve it.

    ``code``/``details`` are the gRPC status when the failure came from a call
    (None for e.g. an unreachable ZooKeeper); ``pushed`` is how many events of
    the failed ``push`` had been acknowledged before the failure.
    """

    def __init__(self, message: str, code: grpc.StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details
        self.pushed = 0
        self.event: int | None = None
        """The index in the failed ``push`` of the event a front refused, when one event was the reason."""
        self.reason = details
        """Why, without the event's index (``details`` with it)."""


_REFUSED_EVENT = re.compile(r"event (\d+): ")
"""How a front names the event it refused: by its index in the request, which the client alone can turn into
its index in the push (a push goes in several requests)."""


def _name_refused_event(exc: ClientError, start: int) -> None:
    """Name the event a front refused by its index in the push, not in the request that began at ``start``."""
    match = _REFUSED_EVENT.match(exc.details)
    if match is None or exc.code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return
    exc.event, exc.reason = start + int(match[1]), exc.details[match.end():]
    exc.args = (str(exc).replace(exc.details, f"event {exc.event}: {exc.reason}", 1),)


@dataclass(frozen=True)
class PushResult:
    """``events`` acknowledged, of which ``duplicates`` had been admitted before; each event's global time."""

    events: int
    duplicates: int
    times: tuple[GlobalTime, ...] = field(repr=False)  # one per event: thousands of entries in a repr

    @property
    def admitted(self) -> int:
        return self.events - self.duplicates


@dataclass(frozen=True)
class Record:
    """One released record of the output topic: partition = front id of its global time."""

    partition: int
    offset: int
    time: GlobalTime
    payload: Any
    group: str | None = field(default=None, compare=False)
    """The consumer group it was read for: what ``commit`` stores its offset in."""


_new_record = object.__new__


def _record(partition: int, offset: int, time: GlobalTime, payload: Any, group: str | None) -> Record:
    """``Record(partition, offset, time, payload, group)``, built the way a consumer builds every record it reads.

    Why not the dataclass's ``__init__``: a frozen dataclass sets each field
    through ``object.__setattr__``, 1.2 us a record, a third of what
    consuming a record cost (the payload's JSON and the message's fields the
    rest).  Filling the new instance's ``__dict__`` at once is what those
    calls amount to, in 0.5 us; the record is the same frozen ``Record``
    (equal, hashed and shown alike: ``tests/test_client_records.py``).
    """
    record = _new_record(Record)
    record.__dict__.update(partition=partition, offset=offset, time=time, payload=payload, group=group)
    return record


_COMPILED = BUILD == "compiled"
"""Whether the core's compiled reader of record batches runs (``_read_records``)."""


def _read_records(data: bytes, partition: int, group: str, records: list[Record]) -> None:
    """Append the records of the ``RecordBatch`` in ``data`` to ``records`` (so that those before a payload that does
    not decode are kept); ``ClientError`` for bytes that are no ``RecordBatch``.

    Why one ``GlobalTime`` for a run of records with the same time: the
    records of one input share it (a page's changelog, a line's counts), and
    making one for each was a fifth of what the SDK spent a record of the
    inverted index (3.0 -> 2.4 us a record).  Why ``columns.record_fields``
    before protobuf where the core runs compiled: it reads the form a barrier
    writes straight from the bytes, where reading each record's fields out of
    protobuf's message objects cost more than the parse (a word count record:
    1.8 -> 1.5 us); other bytes are protobuf's to read or refuse.  Interpreted
    (the pure build) it would cost five times protobuf's way (2.7 against 0.5 us).
    """
    fields = columns.record_fields(data) if _COMPILED else None
    if fields is None:
        try:
            batch = pb.RecordBatch.FromString(data)
        except DecodeError as exc:
            raise ClientError(f"partition {partition}: the barrier sent a malformed record batch ({exc})") from None
        fields = [(m.partition, m.offset, m.time.ts, m.time.front, m.payload) for m in batch.records]
    when = GlobalTime(0, 0)  # a first record at this time gets this one, equal
    for of, offset, ts, front, payload in fields:
        if ts != when.ts or front != when.front:
            when = GlobalTime(ts, front)
        records.append(_record(of, offset, when, decode_payload(payload), group))


@dataclass(frozen=True)
class BarrierStats:
    received: int
    """Items that reached the barriers (replays included)."""
    released: int
    """Records appended to the output topic."""
    retractions: int
    """Tombstones that reached the barriers."""

    @property
    def replay_overhead(self) -> float | None:
        return self.received / self.released if self.released else None


def _anonymous_id(front: int) -> str:
    """A fresh anonymous producer id (a random 128-bit token) for pushes to ``front``; its sequences start at 0."""
    return f"{ANONYMOUS}{uuid.uuid4().hex}-{front}"


@dataclass
class _Lane:
    """One anonymous producer id of a client at one front: its pushes go one at a time, so in sequence order."""

    producer: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Pushes holding or waiting for ``lock``."""

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncGenerator[None, None]:
        self.users += 1
        try:
            async with self.lock:
                yield
        finally:
            self.users -= 1


class _Unresolved(ClientError):
    """No member serves what is needed right now; retried, since a restarting member re-registers soon."""


def _field(role: str, name: str, info: dict[str, Any], key: str) -> Any:
    try:
        return info[key]
    except KeyError:
        raise ClientError(f"member {role}/{name} registered no {key!r}: {info}") from None


def _numbered(role: str, members: dict[str, dict[str, Any]], key: str) -> list[tuple[int, str]]:
    """(number registered under ``key``, address) of every member, sorted: workers by index, fronts by id."""
    return sorted((int(_field(role, name, info, key)), str(_field(role, name, info, "address")))
                  for name, info in members.items())


def _weights(workers: dict[str, dict[str, Any]], count: int) -> list[float]:
    """The registered weights of workers ``0 .. count-1`` (``Layout.weighted``; 1 for a worker that registered none,
    as one of a version before weights did); a weight that is not one is the member's error, named."""
    weights = [1.0] * count
    for name, info in workers.items():
        index = int(_field(WORKER, name, info, "index"))
        if 0 <= index < count:
            weight = info.get("weight", 1.0)
            fault = weight_fault(weight)
            if fault is not None:
                raise ClientError(f"member {WORKER}/{name} registered a bad weight: {fault}")
            weights[index] = float(weight)
    return weights


class _Backoff:
    """The waits between attempts of one operation: doubling from ``first`` up to ``_MAX_DELAY``, ``retries`` at most.

    Shared by the request retries and the resubscriptions of ``consume`` so
    both ride out a restarting member alike; ``reset`` starts over after
    progress, so only consecutive failures count.
    """

    def __init__(self, first: float, retries: int) -> None:
        self.first = first
        self.retries = retries
        self.reset()

    def reset(self) -> None:
        self.failures = 0
        self.delay = self.first

    @property
    def exhausted(self) -> bool:
        """Whether the latest failure is one too many: give up instead of sleeping."""
        return self.failures >= self.retries

    async def sleep(self) -> None:
        """Count a failure and wait before the next attempt."""
        self.failures += 1
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, _MAX_DELAY)


HANDOVER_ATTEMPTS = 20
HANDOVER_LEAD_MS = 200
"""A hand-over tick starts at least this far past now and past every front's stamping lease."""
FENCE_LEAD_MS = 400
"""How far past now a hand-over's fence lets the fronts stamp: about a lease renewal and its round trips, so a front
that sees the fence in time does not stop stamping at all before the tick is published."""
FENCE_WAIT = 8.0
"""Seconds a hand-over waits for the fronts to cut their leases to its fence, at most: longer than a lease
(``flamestream.fronts.lease.LEASE_MS``), so by then a front that never saw the fence has run out of lease."""
FENCE_POLL = 0.02
"""Seconds between looks at the leases while a fence is up."""


def _publish_handover(store: ClusterStore, tick: Tick) -> int:
    """Publish ``tick`` starting past every lease, retrying when a front renews its lease meanwhile; a fence cuts
    the leases first (``ClusterStore.fence``), so the tick starts within a fraction of a second."""
    assert tick.previous is not None
    until = time.time_ns() // 1_000_000 + FENCE_LEAD_MS
    fence = store.fence(tick.previous, until)
    try:
        deadline = time.monotonic() + FENCE_WAIT
        # A front has cut its lease once the lease is at the fence, or at its clock when it saw the fence late.
        while (time.monotonic() < deadline and
               any(lease > max(until, time.time_ns() // 1_000_000) for lease, _ in store.leases().values())):
            time.sleep(FENCE_POLL)
        return _publish_past_leases(store, tick)
    finally:
        store.unfence(fence)


def _publish_past_leases(store: ClusterStore, tick: Tick) -> int:
    for _ in range(HANDOVER_ATTEMPTS):
        leases = store.leases()
        start = max([time.time_ns() // 1_000_000, *(until for until, _ in leases.values())]) + HANDOVER_LEAD_MS
        try:
            return store.publish_tick(dataclasses.replace(tick, start=GlobalTime(start, 0)).to_dict(), leases)
        except LeaseMoved:
            continue
    raise ClientError(f"the fronts' stamping leases moved during each of {HANDOVER_ATTEMPTS} attempts to publish "
                      "the hand-over tick")


class AsyncClient:
    """Asynchronous access to one cluster; use ``async with`` or call ``close()``.

    ``retries``/``backoff``: how often and how patiently retryable failures
    (FAILED_PRECONDITION, UNAVAILABLE) are retried, the delay doubling from
    ``backoff`` up to 0.5 s; the defaults ride out roughly 30 s (``RETRIES``).

    ``credentials``: the directory ``flamestream up`` made (``DIR/tls``, or a copy with only the tokens this
    user may have); default ``$FLAMESTREAM_CREDENTIALS``.  Neither: the directory the cluster's nodes advertise
    in ZooKeeper, if this process can read it (the cluster's own host), for calls to the nodes, and for ZooKeeper
    writes only if ``up`` recorded this ZooKeeper and cluster in it (``security.discover``); a cluster whose
    nodes advertise none is insecure and talked to in plaintext.  Each call carries the token of the role it
    needs, and ZooKeeper writes (deploy, scale) use its admin digest.
    """

    def __init__(self, zookeeper: str, cluster: str = "default", *, retries: int = RETRIES, backoff: float = 0.1,
                 rpc_timeout: float = 30.0, connect_timeout: float = 10.0,
                 credentials: str | os.PathLike[str] | None = None) -> None:
        path = find_credentials(credentials)
        self._discovering = path is None
        """No credentials were given: take those the members advertise (``_discover``)."""
        self.credentials: Credentials | None = None
        self._channel_credentials: grpc.ChannelCredentials | None = None
        if path is not None:
            self._use(Credentials.load(path))
        self.zookeeper = zookeeper
        self.cluster = cluster
        self.retries = retries
        self.backoff = backoff
        self.rpc_timeout = rpc_timeout
        self.connect_timeout = connect_timeout
        self._store: ClusterStore | None = None
        self._opening = asyncio.Lock()
        """Held while the session opens: calls that start together (a consume's partitions, a gather) would each
        open one otherwise, and all but the last would never be stopped, reconnecting for good once the cluster's
        ZooKeeper is gone."""
        self._retired: list[ClusterStore] = []
        """Sessions replaced by one with the discovered admin digest (``_discover``), stopped by ``close``."""
        self._members: dict[str, dict[str, dict[str, Any]]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sequences: dict[str, int] = {}
        self._producer_locks: dict[str, asyncio.Lock] = {}
        self._round_robin = 0
        self._lanes: dict[int, list[_Lane]] = {}
        """Front -> the anonymous producer ids this client pushes to it under, each one push at a time."""
        self._front_ids: list[int] | None = None
        self._followers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        # Subscriptions of a consume the caller abandoned without closing it.
        followers, self._followers = list(self._followers), set()
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        channels, self._channels = list(self._channels.values()), {}
        for chan in channels:
            await chan.close()
        stores, self._store, self._retired = [*self._retired, *filter(None, [self._store])], None, []
        for store in stores:
            await asyncio.to_thread(store.stop)

    def _use(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self._channel_credentials = credentials.channel_credentials(with_tokens=True)

    async def _discover(self, members: dict[str, dict[str, Any]]) -> None:
        """Take the credentials the first secured members advertise (once; see the class).  Members are read before
        any channel opens, so every channel is opened with them; a session without the admin digest gives way to
        one with it, the old one closed with the client (a call running on it meanwhile finishes)."""
        try:
            found = discover(members.values(), self.zookeeper, self.cluster)
        except ValueError as exc:
            raise ClientError(str(exc)) from None
        if found is None:
            return
        self._discovering = False
        self._use(found)
        if found.zookeeper and self._store is not None:
            self._retired.append(self._store)
            self._store = None  # the next ZooKeeper call opens a session with the admin digest

    # -- membership ----------------------------------------------------------------------------------------

    async def _cluster_store(self) -> ClusterStore:
        async with self._opening:
            if self._store is None:
                self._store = await self._open_store()
            return self._store

    async def _open_store(self) -> ClusterStore:
        auth = self.credentials.zookeeper_auth("admin") if self.credentials else None
        store = ClusterStore(self.zookeeper, cluster=self.cluster, timeout=self.connect_timeout, auth=auth,
                             writers=list(self.credentials.zookeeper.values()) if self.credentials and auth else ())
        starting = asyncio.ensure_future(asyncio.to_thread(store.start))
        try:
            await asyncio.shield(starting)
        except (TimeoutError, ValueError) as exc:
            raise ClientError(f"cannot reach ZooKeeper at {self.zookeeper}: {exc}") from None
        except asyncio.CancelledError:
            # Cancelled (``close`` ends an abandoned consume) while the thread connects: that session would be
            # nobody's to stop, so wait for the start (bounded by connect_timeout) and stop it.
            with contextlib.suppress(Exception):
                await starting
            await asyncio.to_thread(store.stop)
            raise
        return store

    async def _in_zookeeper(self, what: str, call: Callable[[ClusterStore], T]) -> T:
        """Run a blocking ClusterStore call off the loop, reporting a lost ZooKeeper as a ClientError."""
        store = await self._cluster_store()
        try:
            return await asyncio.to_thread(call, store)
        except NoAuthError:
            raise ClientError(f"{what} in ZooKeeper at {self.zookeeper} was refused (NoAuthError): cluster "
                              f"{self.cluster!r} is secured, and its writes need the admin digest of its credentials "
                              f"directory: pass credentials=PATH (CLI: --credentials PATH, or the --data-dir of its "
                              f"`up`) or set {ENV}=PATH") from None
        except KazooException as exc:
            raise ClientError(f"{what} in ZooKeeper at {self.zookeeper} failed: {type(exc).__name__} {exc}") from None

    async def members(self, role: str) -> dict[str, dict[str, Any]]:
        """Registered members of ``role`` by name (cached until a member turns out unreachable)."""
        if role not in self._members:
            found = await self._in_zookeeper(f"reading the {role} members", lambda store: store.members(role))
            if self._discovering:
                await self._discover(found)
            self._members[role] = found
        return self._members[role]

    def _forget_members(self) -> None:
        self._members.clear()
        self._front_ids = None

    async def _tick_front_ids(self) -> list[int]:
        """The front ids of the deployed tick: a fixed set, unlike the live membership.

        Producer deduplication is per front, so a producer must always reach the
        same front; picking among whoever is registered right now would send a
        retry elsewhere while its front restarts, and admit it twice.
        """
        if self._front_ids is None:
            latest = await self._in_zookeeper("reading the deployed tick", lambda store: store.latest_tick())
            if latest is not None:
                self._front_ids = sorted(int(f) for f in latest[1]["fronts"])
            else:  # nothing deployed yet: pushes fail with FAILED_PRECONDITION and are retried anyway
                self._front_ids = sorted(front for front, _ in await self._fronts())
        return self._front_ids

    async def _front_address(self, front: int) -> str:
        for number, address in await self._fronts():
            if number == front:
                return address
        raise _Unresolved(f"front {front} is not registered in cluster {self.cluster!r} (restarting?)")

    async def _fronts(self) -> list[tuple[int, str]]:
        members = await self.members(FRONT)
        if not members:
            raise _Unresolved(f"no front is registered in cluster {self.cluster!r} at {self.zookeeper}")
        return _numbered(FRONT, members, "id")

    async def _barriers(self) -> dict[int, str]:
        """Barrier address by partition."""
        members = await self.members(BARRIER)
        owners: dict[int, str] = {}
        for name, info in members.items():
            address = str(_field(BARRIER, name, info, "address"))
            for partition in _field(BARRIER, name, info, "partitions"):
                owners[int(partition)] = address
        if not owners:
            raise _Unresolved(f"no barrier is registered in cluster {self.cluster!r} at {self.zookeeper}")
        return owners

    async def _barrier_of(self, partition: int) -> str:
        owners = await self._barriers()
        if partition not in owners:
            raise _Unresolved(f"no barrier owns partition {partition} in cluster {self.cluster!r}")
        return owners[partition]

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = open_channel(address, self._channel_credentials)
        return self._channels[address]

    async def _retry(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it succeeds, retrying retryable statuses with exponential backoff."""
        backoff = _Backoff(self.backoff, self.retries)
        while True:
            try:
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
                # A front out of credit or of disk says so (RETRY_HINT); other RESOURCE_EXHAUSTED are permanent.
                transient = code is grpc.StatusCode.RESOURCE_EXHAUSTED and RETRY_HINT in details
                if (code not in _RETRYABLE and not transient) or backoff.exhausted:
                    raise ClientError(f"{what} failed: {code.name}: {details}", code, details) from None
                if code is grpc.StatusCode.UNAVAILABLE:
                    self._forget_members()
            except _Unresolved:
                if backoff.exhausted:
                    raise
                self._forget_members()
            await backoff.sleep()

    async def connect(self, timeout: float | None = None) -> None:
        """Open now what the first push and the first subscription would open on their way: the ZooKeeper
        session, the deployed tick's fronts and the registered barriers, and a ready channel to each of them.

        Why: each is a round trip or more (ZooKeeper's session, a TCP and HTTP/2 handshake, TLS's), and without
        this call the first push pays for all of them while the events behind it wait: in the bench's word count
        the first push took 61 ms, and the events that came due meanwhile were late for the next 0.2 s.  A
        producer that cares about its first events' latency calls it once, before them.

        ``timeout`` (default ``connect_timeout``) bounds the wait for the channels only; the session and the reads
        before it are bounded as every call's are (``connect_timeout``, ``retries``).  Raises ``ClientError``
        (UNAVAILABLE) naming the addresses whose channel is not ready by then.
        """
        fronts = await self._retry("finding the fronts", self._tick_front_ids)
        addresses = {await self._retry("finding the fronts", functools.partial(self._front_address, front))
                     for front in fronts}
        addresses.update((await self._retry("finding the barriers", self._barriers)).values())
        waiting = self.connect_timeout if timeout is None else timeout
        channels = {address: self._channel(address) for address in sorted(addresses)}
        try:
            async with asyncio.timeout(waiting):
                await asyncio.gather(*(channel.channel_ready() for channel in channels.values()))
        except TimeoutError:
            unready = [address for address, channel in channels.items()
                       if channel.get_state() != grpc.ChannelConnectivity.READY]
            if unready:  # else all became ready as the time ran out
                raise ClientError(f"cannot reach {', '.join(unready)} within {waiting:g}s (cluster {self.cluster!r}: "
                                  "down, unreachable, or refusing this client's TLS credentials)",
                                  grpc.StatusCode.UNAVAILABLE) from None

    # -- deploy --------------------------------------------------------------------------------------------

    async def rescale(self, workers: int) -> int:
        """Run the deployed graph on workers 0..``workers``-1 from a hand-over on; returns the new tick's number."""
        latest = await self._in_zookeeper("reading the deployed tick", lambda store: store.latest_tick())
        if latest is None:
            raise ClientError(f"nothing is deployed in cluster {self.cluster!r}: deploy a graph first")
        return await self._deploy(latest[1]["graph"], workers, drop_state=False, rebalance=True)

    async def wait_handover(self, tick: int, timeout: float = 60.0) -> float:
        """Wait until hand-over tick ``tick`` has its state: the previous tick's workers all wrote their snapshot
        below its start (they are done then). Returns the seconds waited."""
        data = await self._in_zookeeper("reading the tick", lambda store: store.tick(tick))
        if data is None:
            raise ClientError(f"cluster {self.cluster!r} has no tick {tick}")
        handover = Tick.from_dict({**data, "number": tick})
        if handover.previous is None:
            return 0.0
        previous = await self._in_zookeeper("reading the tick", lambda store: store.tick(handover.previous or 0))
        workers = len(previous["workers"]) if previous is not None else 0
        boundary = boundary_name(handover.start)
        started = time.monotonic()
        while True:
            complete = await self._in_zookeeper(
                "reading snapshots", lambda store: store.complete_snapshots(handover.previous or 0, workers))
            if boundary in complete:
                return time.monotonic() - started
            # Retention drops the hand-over snapshot once the tick has complete snapshots of its own (which it
            # only takes once it has its state): those say the hand-over is done just as well.
            own = await self._in_zookeeper("reading snapshots",
                                           lambda store: store.complete_snapshots(tick, len(handover.workers)))
            if own:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                snapshots = await self._in_zookeeper("reading snapshots",
                                                     lambda store: store.snapshots(handover.previous or 0))
                written = snapshots.get(boundary, {})
                missing = [f"worker{i}" for i in range(workers) if f"worker{i}" not in written]
                raise ClientError(f"tick {tick} did not get the state of tick {handover.previous} within "
                                  f"{timeout:g}s: {len(written)} of {workers} snapshots; no snapshot from "
                                  f"{', '.join(missing)} (a worker that cannot write one is NOT_SERVING: "
                                  "`flamestream status` and its node's log say why)")
            await asyncio.sleep(0.05)

    async def deploy(self, graph: Graph, workers: int | None = None, drop_state: bool = False,
                     rebalance: bool = False, allow_modules: Iterable[str] = (), *, fresh: bool = False) -> int:
        """Publish a tick running ``graph`` on the registered members; returns its number.

        The tick lists the workers in index order (worker ``i`` owns hash range
        ``i``, sized by the weight it registered, ``--worker-weight``: by
        default half as large for a worker whose node also runs a front, the
        acker or a barrier; ``workers`` takes the first that many), the fronts, the acker and
        the barrier of every front partition; members are re-read so the tick
        reflects the cluster as it is now.  The first tick starts now.  Later
        ones hand over: they start at a global time T past every front's
        stamping lease, and take over the current tick's grouping state below
        T (groupings matched by name), so counts carry on instead of
        restarting.  A grouping of the current graph that the new one lacks
        would lose its state: refused unless ``drop_state``.  A grouping of
        the same name with another window is refused, one with another
        balancing or equivalence function reference (``module:name``) is
        taken over with a ``StateWarning`` (a renamed file is the same code).  With
        ``rebalance``, the hash ranges give each worker an equal share of the
        load the workers measured (``Layout.balanced``), not of the hash space.
        ``fresh`` starts the tick now with empty state instead (no hand-over):
        the way out when the current tick never ran, e.g. its graph could not
        be loaded, so it has no state to hand over.

        The graph's functions must come from its own package, flamestream's
        helpers or ``allow_modules`` (``Allowed``): else ``FunctionNotAllowed``
        and nothing is published.  Checked here so the author gets the message;
        the nodes check again with their own ``--allow-module`` list.
        """
        graph.check_functions(Allowed.of(allow_modules))
        return await self._deploy(graph.to_dict(), workers, drop_state, rebalance, fresh)

    async def _deploy(self, graph: dict[str, Any], workers: int | None, drop_state: bool, rebalance: bool,
                      fresh: bool = False) -> int:
        self._forget_members()
        ackers = await self.members(ACKER)
        worker_members = await self.members(WORKER)
        registered = _numbered(WORKER, worker_members, "index")
        fronts = await self._fronts()
        barriers = await self._barriers()
        if len(ackers) != 1:
            raise ClientError(f"need exactly one acker in cluster {self.cluster!r}, found {sorted(ackers)}")
        by_index = registered[:workers] if workers is not None else registered
        if not by_index or [index for index, _ in by_index] != list(range(workers or len(by_index))):
            raise ClientError(f"need workers 0..{(workers or len(by_index)) - 1} in cluster {self.cluster!r}, "
                              f"found {[i for i, _ in registered]}")
        uncovered = [front for front, _ in fronts if front not in barriers]
        if uncovered:
            raise ClientError(f"no barrier owns the partition of front(s) {uncovered}")
        (acker_name, acker_info), = ackers.items()
        loads = await self._in_zookeeper("reading the load", lambda store: store.loads()) if rebalance else []
        tick = Tick(number=0, start=GlobalTime(time.time_ns() // 1_000_000, 0), graph=graph,
                    layout=Layout.balanced(loads, len(by_index), _weights(worker_members, len(by_index))),
                    workers=tuple(address for _, address in by_index),
                    fronts=tuple(front for front, _ in fronts),
                    acker=str(_field(ACKER, acker_name, acker_info, "address")),
                    barriers=tuple(sorted(barriers.items())))
        latest = await self._in_zookeeper("reading the deployed tick", lambda store: store.latest_tick())
        if latest is None or fresh:
            return await self._in_zookeeper("publishing the tick", lambda store: store.publish_tick(tick.to_dict()))
        current = Tick.from_dict({**latest[1], "number": latest[0]})
        windows = changed_groupings(current.graph, graph, ("window",))
        if windows:
            raise ClientError(f"the new graph's grouping(s) {', '.join(windows)} would take over state kept for "
                              "another window: rename them and pass drop_state=True (--drop-state), so they start "
                              "empty, or deploy with fresh=True (--fresh) to start all state empty")
        functions = changed_groupings(current.graph, graph, ("balance", "equivalence"))
        if functions:
            warnings.warn(f"the new graph's grouping(s) {', '.join(functions)} take over tick {current.number}'s "
                          "state with other function references: if their keys now mean something else, deploy "
                          "again with fresh=True (--fresh), or rename the groupings and pass drop_state=True "
                          "(--drop-state)", StateWarning, stacklevel=2)
        dropped = dropped_groupings(current.graph, graph)
        if dropped and not drop_state:
            raise ClientError(f"the new graph has no grouping named {', '.join(dropped)}: deploying it "
                              "would drop their state; pass drop_state=True (--drop-state) to do so")
        if current.fronts != tick.fronts or current.acker != tick.acker:
            raise ClientError(f"tick {current.number} runs fronts {list(current.fronts)} and acker {current.acker}, "
                              f"the cluster now has fronts {list(tick.fronts)} and acker {tick.acker}: a hand-over "
                              "needs the same ones")
        # One hand-over at a time: the current tick must have its state before it hands it on.
        await self.wait_handover(current.number)
        return await self._in_zookeeper("publishing the hand-over tick", lambda store: _publish_handover(
            store, dataclasses.replace(tick, previous=current.number)))


    # -- push ----------------------------------------------------------------------------------------------

    async def push(self, payloads: Iterable[Any], producer: str | None = None) -> PushResult:
        """Push JSON-encodable payloads in batches of up to ``PUSH_BATCH`` events, in order.

        Every payload is checked before anything is sent, as the front checks it
        (``check_payload``: no lone surrogates, no NaN/Infinity, nesting at most
        ``MAX_DEPTH`` deep): the first faulty one raises ``PayloadError`` (a
        ``ValueError``) naming its index, and nothing is pushed — rather than a
        NaN quietly becoming null, or a batch refused halfway through the push.
        """
        encoded = []
        for i, payload in enumerate(payloads):
            try:
                encoded.append(encode_event(payload))
            except PayloadError as exc:
                raise PayloadError(f"event {i}: {exc}") from None
        if producer is None:
            return await self._push_batches(encoded, None)
        if not producer or producer.startswith("~") or len(producer.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise InvalidName(f"producer id must be a non-empty string of at most {MAX_NAME_BYTES} bytes not starting "
                             "with '~' (reserved for anonymous pushes; or None for anonymous pushes)")
        # One push at a time per producer keeps its sequence numbers contiguous
        # and in order on the front.
        lock = self._producer_locks.setdefault(producer, asyncio.Lock())
        async with lock:
            return await self._push_batches(encoded, producer)

    async def _push_batches(self, encoded: list[bytes], producer: str | None) -> PushResult:
        duplicates = 0
        times: list[GlobalTime] = []
        for start, chunk in _chunks(encoded):
            fronts = await self._retry("finding the fronts", self._tick_front_ids)
            if producer:
                response = await self._push_chunk(chunk, start, fronts[stable_hash(producer) % len(fronts)], producer)
            else:  # spread anonymous batches over the fronts, each on a lane of its front
                front = fronts[self._round_robin % len(fronts)]
                self._round_robin += 1
                lane = self._lane(front)
                async with lane.held():
                    try:
                        response = await self._push_chunk(chunk, start, front, lane.producer)
                    except BaseException:
                        # The front may have admitted the chunk after all (a lost reply, a cancelled call): the next
                        # push on this lane, maybe another caller's waiting for it, must not reuse its sequences.
                        self._sequences.pop(lane.producer, None)
                        lane.producer = _anonymous_id(front)
                        raise
            duplicates += sum(1 for admitted in response.admitted if not admitted)
            times.extend(GlobalTime(t.ts, t.front) for t in response.times)
        return PushResult(events=len(encoded), duplicates=duplicates, times=tuple(times))

    def _lane(self, front: int) -> _Lane:
        """An idle anonymous lane to ``front``, a new one while there are fewer than ``LANES``, else the least busy.

        Why lanes: a front admits a producer's sequence only above the last
        it admitted, so two pushes of one producer id in flight at once lose
        whichever arrives second (its events count as retries).  One id per
        push in flight keeps concurrent ``push`` calls (a ``gather``, threads
        sharing a ``Client``) all admitted, each lane in order.
        """
        lanes = self._lanes.setdefault(front, [])
        idle = next((lane for lane in lanes if not lane.users), None)
        if idle is not None:
            return idle
        if len(lanes) < LANES:
            lanes.append(_Lane(_anonymous_id(front)))
            return lanes[-1]
        return min(lanes, key=lambda lane: lane.users)

    async def _push_chunk(self, chunk: list[bytes], start: int, front: int, sender: str) -> pb.PushResponse:
        """One Push request of ``sender``'s next sequences; the caller makes sure it is the sender's only one."""
        first = self._sequences.get(sender, 0)
        request = pb.PushRequest(events=[pb.Event(payload=data, producer=sender, sequence=first + i)
                                         for i, data in enumerate(chunk)])
        try:
            response = await self._retry("push", functools.partial(self._push_once, request, front))
            if len(response.admitted) != len(chunk) or len(response.times) != len(chunk):
                raise ClientError(f"a front answered a push of {len(chunk)} events with "
                                  f"{len(response.admitted)} admissions and {len(response.times)} times")
        except ClientError as exc:
            exc.pushed = start
            _name_refused_event(exc, start)
            raise
        self._sequences[sender] = first + len(chunk)
        return response

    async def _push_once(self, request: pb.PushRequest, front: int) -> pb.PushResponse:
        call = self._channel(await self._front_address(front)).unary_unary(_method("Front", "Push"),
                                                  request_serializer=pb.PushRequest.SerializeToString,
                                                  response_deserializer=pb.PushResponse.FromString)
        return await call(request, timeout=self.rpc_timeout)

    async def barrier_stats(self) -> BarrierStats:
        """Counters of every barrier since it started, summed: replay overhead = received / released."""
        total = BarrierStats(0, 0, 0)
        for address in sorted(set((await self._barriers()).values())):

            async def attempt(address: str = address) -> pb.BarrierStats:
                call = self._channel(address).unary_unary(
                    _method("Barrier", "Stats"), request_serializer=pb.Empty.SerializeToString,
                    response_deserializer=pb.BarrierStats.FromString)
                return await call(pb.Empty(), timeout=self.rpc_timeout)

            stats = await self._retry(f"reading the stats of barrier {address}", attempt)
            total = BarrierStats(total.received + stats.received, total.released + stats.released,
                                 total.retractions + stats.retractions)
        return total

    # -- consume -------------------------------------------------------------------------------------------

    async def committed(self, group: str, partition: int) -> int:
        """The offset ``group`` resumes ``partition`` from (0 if it never committed)."""
        _check_group(group)

        async def attempt() -> pb.Offset:
            call = self._channel(await self._barrier_of(partition)).unary_unary(
                _method("Barrier", "Committed"), request_serializer=pb.CommittedRequest.SerializeToString,
                response_deserializer=pb.Offset.FromString)
            return await call(pb.CommittedRequest(group=group, partition=partition), timeout=self.rpc_timeout)

        return (await self._retry(f"reading the offset of group {group!r} in partition {partition}", attempt)).offset

    async def commit(self, record: Record, group: str | None = None) -> None:
        """Store ``record.offset + 1`` as where ``group`` resumes ``record.partition``.

        ``group`` defaults to the group the record was consumed for
        (``Record.group``): not the latest ``consume``'s, which was another
        group's when one client reads two, and committed one group's offset
        into the other.  Commits are idempotent (last write wins), so they are
        retried like reads.
        """
        group = group if group is not None else record.group
        if group is None:
            raise ValueError("commit() needs a group: pass one, or commit a record that consume() returned")
        _check_group(group)

        async def attempt() -> pb.Empty:
            call = self._channel(await self._barrier_of(record.partition)).unary_unary(
                _method("Barrier", "Commit"), request_serializer=pb.CommitRequest.SerializeToString,
                response_deserializer=pb.Empty.FromString)
            request = pb.CommitRequest(group=group, partition=record.partition, offset=record.offset + 1)
            return await call(request, timeout=self.rpc_timeout)

        await self._retry(f"committing offset {record.offset + 1} of partition {record.partition}", attempt)

    async def consume(self, group: str, from_committed: bool = True,
                      timeout: float | None = None) -> AsyncGenerator[Record, None]:
        """Records of every partition, merged in arrival order, each partition in offset order.

        Starts each partition at ``group``'s committed offset (or 0 with
        ``from_committed=False``) and follows it live; ends after ``timeout``
        seconds without a record (never with None).  Nothing is committed here:
        the caller commits what it has processed.
        """
        async with contextlib.aclosing(self.consume_batches(group, from_committed, timeout)) as batches:
            async for batch in batches:
                for record in batch:
                    yield record

    async def consume_batches(self, group: str, from_committed: bool = True,
                              timeout: float | None = None) -> AsyncGenerator[list[Record], None]:
        """``consume`` in lists of the records that arrived together (never empty).

        Handing over what has accumulated at once keeps the per-record cost low
        (one await per batch, not per record), which is what lets ``Client``
        cross its thread boundary once per batch.
        """
        _check_group(group)
        # Retried like every call: a consumer (re)started while the cluster recovers finds no barrier for a while.
        partitions = sorted(await self._retry("finding the barriers", self._barriers))
        starts = {p: await self.committed(group, p) if from_committed else 0 for p in partitions}
        # Bounded: a slow consumer holds back the subscriptions instead of buffering without limit.  Entries are
        # the records of one barrier message (one queue operation per message, not per record).
        queue: asyncio.Queue[list[Record] | ClientError] = asyncio.Queue(maxsize=_QUEUED_MESSAGES)
        tasks = [asyncio.create_task(self._follow(group, p, starts[p], queue)) for p in partitions]
        self._followers.update(tasks)
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):  # wait_for could swallow the caller's cancellation (3.11)
                        items = [await queue.get()]
                except TimeoutError:
                    return
                while not queue.empty():
                    items.append(queue.get_nowait())
                batch: list[Record] = []
                for item in items:
                    if isinstance(item, ClientError):
                        if batch:
                            yield batch
                        raise item
                    batch.extend(item)
                yield batch
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._followers.difference_update(tasks)

    async def _follow(self, group: str, partition: int, offset: int,
                      queue: asyncio.Queue[list[Record] | ClientError]) -> None:
        """Feed one partition into ``queue``, resubscribing after the barrier's stream breaks.

        A stream can end because its barrier restarted; resubscribing from the
        next unseen offset loses and repeats nothing.  Only consecutive failures
        count against ``retries``.
        """
        backoff = _Backoff(self.backoff, self.retries)
        while True:
            try:
                # Batches arrive as bytes, parsed in ``_read_records``: gRPC's own parsing of a malformed one only
                # logged it and yielded None, and the consumer waited for records that never came.
                call: grpc.aio.UnaryStreamMultiCallable[pb.SubscribeRequest, bytes] = self._channel(
                    await self._barrier_of(partition)).unary_stream(
                    _method("Barrier", "Subscribe"), request_serializer=pb.SubscribeRequest.SerializeToString)
                async for batch in call(pb.SubscribeRequest(partition=partition, from_offset=offset)):
                    records: list[Record] = []
                    try:
                        _read_records(batch, partition, group, records)
                    finally:  # what decoded before a bad payload is still delivered, in order
                        if records:
                            offset = records[-1].offset + 1
                            await queue.put(records)
                    backoff.reset()
                problem = f"the subscription to partition {partition} ended"
                code: grpc.StatusCode | None = None
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                problem = f"subscribing to partition {partition} failed: {code.name}: {exc.details() or ''}"
                if code not in _RETRYABLE:
                    await queue.put(ClientError(problem, code, exc.details() or ""))
                    return
                self._forget_members()
            except _Unresolved as exc:
                problem, code = str(exc), None
                self._forget_members()
            except (ClientError, PayloadError) as exc:
                await queue.put(exc if isinstance(exc, ClientError) else ClientError(f"partition {partition}: {exc}"))
                return
            if backoff.exhausted:
                await queue.put(ClientError(problem, code))
                return
            await backoff.sleep()


class Client:
    """Synchronous access to one cluster (see ``AsyncClient``); use ``with`` or call ``close()``.

    The calls run on a private event loop in a daemon thread: grpc.aio objects
    belong to the loop that created them, so one long-lived loop lets channels
    be reused across calls.
    """

    def __init__(self, zookeeper: str, cluster: str = "default", *, retries: int = RETRIES, backoff: float = 0.1,
                 rpc_timeout: float = 30.0, connect_timeout: float = 10.0,
                 credentials: str | os.PathLike[str] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="flamestream-client", daemon=True)
        self._thread.start()
        self._client = AsyncClient(zookeeper, cluster, retries=retries, backoff=backoff, rpc_timeout=rpc_timeout,
                                   connect_timeout=connect_timeout, credentials=credentials)
        self._consumers: weakref.WeakSet[Generator[list[Record], None, None]] = weakref.WeakSet()

    def __enter__(self) -> Client:
        return self

    @property
    def credentials(self) -> Credentials | None:
        """The credentials in use, given or found (see ``AsyncClient``); None: none so far, plaintext."""
        return self._client.credentials

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, awaitable: Awaitable[T]) -> T:
        started, finished = threading.Event(), threading.Event()

        async def step() -> T:
            started.set()
            try:
                return await awaitable
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(step(), self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C) while the coroutine runs: cancel it and wait
            # until it has unwound, so the caller's cleanup (closing the stream
            # or the client) never overlaps with it.  The round trip through the
            # loop makes ``started`` reliable: a step in progress has finished.
            if future.cancel():
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result()
                if started.is_set():
                    finished.wait()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        # A consume the caller abandoned is still suspended on the loop; close it
        # while the loop runs, or it would be finalised later on a closed loop.
        for consumer in list(self._consumers):
            consumer.close()
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def deploy(self, graph: Graph, workers: int | None = None, drop_state: bool = False,
               rebalance: bool = False, allow_modules: Iterable[str] = (), *, fresh: bool = False) -> int:
        return self._run(self._client.deploy(graph, workers, drop_state, rebalance, allow_modules, fresh=fresh))

    def connect(self, timeout: float | None = None) -> None:
        self._run(self._client.connect(timeout))

    def rescale(self, workers: int) -> int:
        return self._run(self._client.rescale(workers))

    def wait_handover(self, tick: int, timeout: float = 60.0) -> float:
        return self._run(self._client.wait_handover(tick, timeout))

    def push(self, payloads: Iterable[Any], producer: str | None = None) -> PushResult:
        # Materialised here: the caller's iterable must not be consumed on another thread.
        return self._run(self._client.push(list(payloads), producer))

    def committed(self, group: str, partition: int) -> int:
        return self._run(self._client.committed(group, partition))

    def barrier_stats(self) -> BarrierStats:
        return self._run(self._client.barrier_stats())

    def commit(self, record: Record, group: str | None = None) -> None:
        self._run(self._client.commit(record, group))

    def consume(self, group: str, from_committed: bool = True,
                timeout: float | None = None) -> Generator[Record, None, None]:
        return (record for batch in self.consume_batches(group, from_committed, timeout) for record in batch)

    def consume_batches(self, group: str, from_committed: bool = True,
                        timeout: float | None = None) -> Generator[list[Record], None, None]:
        """Records in the batches they arrived in, so a caller can commit once per batch."""
        consumer = self._consume_batches(group, from_committed, timeout)
        self._consumers.add(consumer)
        return consumer

    def _consume_batches(self, group: str, from_committed: bool,
                         timeout: float | None) -> Generator[list[Record], None, None]:
        stream = self._client.consume_batches(group, from_committed, timeout)
        try:
            while True:
                try:
                    yield self._run(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed():
                self._run(stream.aclose())
