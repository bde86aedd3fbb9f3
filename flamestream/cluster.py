"""The cluster's shared state in ZooKeeper: membership, ticks, leases and snapshot registrations.

Layout under ``<root>/<cluster>/``::

    members/<role>/<name>              ephemeral, JSON info such as {"address": "127.0.0.1:5001"}
    ticks/<n>                          JSON tick, n = 0000000000, 0000000001, ...
    ticks/<n>/snapshots/<b>/worker<i>  worker i of tick n wrote its snapshot below boundary b (file, checksum)
    leases/front<f>                    ephemeral: front f stamps nothing at or after {"until": ts} unrenewed
    fences/fence-<seq>                 ephemeral: a hand-over being published asks the fronts to stamp nothing at
                                       or after {"until": ts} before they know a tick above {"after": n}
    load/worker<i>                     ephemeral: items worker i processed per hash bucket (for rebalancing)

Consumer offsets are not here: each barrier keeps its partitions' (``flamestream.storage.offsets``).

Membership nodes are ephemeral so a crashed process drops out of the cluster by
itself once its session expires.  Ticks are numbered by one transaction that
creates the next free ``ticks/<n>`` (with the stamping-lease checks a
hand-over needs), so concurrent publishers can never take the same number,
and the zero-padded names sort in publication order.  Several clusters can
share one ZooKeeper ensemble because everything lives under the cluster's own
prefix.  Tick contents are opaque JSON here; ``flamestream.core.tick`` gives them
meaning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState  # type: ignore[import-untyped]
from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.retry import KazooRetry  # type: ignore[import-untyped]
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl  # type: ignore[import-untyped]

from flamestream.core.meta import boundary_of

log = logging.getLogger(__name__)

ACKER = "acker"
WORKER = "worker"
FRONT = "front"
BARRIER = "barrier"
SERVICE_ROLES = (ACKER, WORKER, FRONT, BARRIER)
"""Member roles in ZooKeeper (``members/<role>/<name>``), in start order."""

TickCallback = Callable[[int, dict[str, Any]], None]

RECONNECT_EVERY = 1.0
"""Seconds between attempts to reach ZooKeeper again after losing it, at most."""


def _check_name(kind: str, value: str) -> str:
    """Reject names that would change the path structure or that ZooKeeper refuses.

    Checked before any request so a bad name fails with a message naming the
    argument instead of a kazoo error about some composed path.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    if "/" in value:
        raise ValueError(f"{kind} must not contain '/', got {value!r}")
    if value in (".", ".."):
        raise ValueError(f"{kind} must not be '.' or '..'")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise ValueError(f"{kind} must not contain control characters, got {value!r}")
    return value


def _check_count(kind: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{kind} must be a non-negative integer, got {value!r}")
    return value


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _decode(path: str, data: bytes) -> dict[str, Any]:
    """Parse a node's JSON, insisting on an object so callers can rely on the declared type."""
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds {type(value).__name__}, expected a JSON object")
    return value


_PUBLISH_ATTEMPTS = 100


def placement(data_dir: Path | None) -> dict[str, str]:
    """Where a member runs, as its info records it: the host and the data dir.  A node restarted there knows
    members with this placement (and its name) as its dead predecessor's; ``up`` knows any other as another
    live cluster's."""
    return {"host": socket.gethostname(), "data_dir": str(data_dir.resolve()) if data_dir else ""}


class LeaseMoved(Exception):
    """A front's stamping lease changed between reading it and publishing a tick: choose a later start."""


class Unauthorized(Exception):
    """ZooKeeper refused this session on a secured cluster: a process started without its credentials."""


@dataclass
class SnapshotsSeen:
    """What one look for the oldest complete snapshot (``ClusterStore.oldest_complete_snapshot``) tells the next.

    ``since``: the first tick that may still hold registrations.  A tick that
    holds none while a later tick has a complete snapshot is one the workers'
    retention swept, and no worker registers there again (its own retention
    starts past it too), so looks start after the unbroken run of such ticks.
    ``workers``: each tick's number of workers (a published tick never
    changes).  ``complete``: tick -> the boundaries seen complete, with the
    names that registered them (what ``registered_snapshots`` skips); a
    snapshot stays complete until retention forgets it, so they are not read
    again while registered.  Were one forgotten and registered again partly
    between two looks, it would still count as complete: the oldest boundary
    can then only come out older, and the fronts keep more of their logs.
    """

    since: int = 0
    workers: dict[int, int] = field(default_factory=dict)
    complete: dict[int, dict[str, dict[str, None]]] = field(default_factory=dict)


class ClusterStore:
    """A ZooKeeper session bound to one cluster's subtree.

    ``timeout`` is both how long ``start()`` waits for a connection and the
    session timeout, i.e. how long a crashed member's ephemeral nodes linger.
    Operations are not retried on connection loss: publishing a tick is not
    idempotent, so a blind retry could publish it twice.
    """

    def __init__(self, hosts: str, cluster: str = "default", root: str = "/flamestream", timeout: float = 10.0,
                 *, auth: str | None = None, writers: Sequence[str] = ()) -> None:
        """``auth``: this session's digest credential ``user:password`` (a ``--tls`` cluster's nodes and admins).
        ``writers``: digest credentials that get all rights on every node this session creates; with them,
        the world may only read (nothing in the subtree is secret, and the SDK reads membership without
        credentials).  Without ``writers`` but with ``auth``, ``auth`` alone writes.  Neither: open ACLs (today's
        default, an insecure cluster)."""
        writers = list(writers) or ([auth] if auth else [])
        self._auth = auth
        self._acl: list[Any] | None = ([make_digest_acl(*w.split(":", 1), all=True) for w in writers]
                                       + [make_acl("world", "anyone", read=True)]) if writers else None
        if not root.startswith("/"):
            raise ValueError(f"root must be an absolute ZooKeeper path such as '/flamestream', got {root!r}")
        for part in root[1:].split("/"):
            _check_name("root path component", part)
        self.hosts = hosts
        self.cluster = _check_name("cluster", cluster)
        self.root = root
        self.timeout = timeout
        self.base = f"{root}/{cluster}"
        self._client: Any = None
        self._registered: dict[str, bytes] = {}
        """Member path -> info of every member this session registered (registered again after expiry)."""
        self._expired = False

    # -- session -------------------------------------------------------------

    def start(self) -> None:
        """Connect and create the cluster's top-level nodes.

        The parents are created up front because watches (``watch_ticks``) need an
        existing node to watch.
        """
        if self._client is not None:
            raise RuntimeError(f"ClusterStore for {self.base} is already started")
        # Reconnect attempts at most RECONNECT_EVERY apart (kazoo's default backs off to a minute): a service
        # must be back within seconds of ZooKeeper, not of its retry schedule.
        client = KazooClient(hosts=self.hosts, timeout=self.timeout, default_acl=self._acl,
                             auth_data=[("digest", self._auth)] if self._auth else None,
                             connection_retry=KazooRetry(max_tries=-1, max_delay=RECONNECT_EVERY))
        try:
            client.start(timeout=self.timeout)
        except client.handler.timeout_exception:
            raise TimeoutError(f"could not connect to ZooKeeper at {self.hosts} within {self.timeout:g}s") from None
        try:
            if self._acl is not None:
                # The shared root stays open (other clusters live there too); only our subtree is guarded.
                client.ensure_path(self.root, acl=OPEN_ACL_UNSAFE)
            for child in ("members", "ticks"):
                client.ensure_path(f"{self.base}/{child}")
            if self._acl is not None:
                # A subtree an insecure run created earlier is still open: guard its top nodes now.
                for path in (self.base, *(f"{self.base}/{child}" for child in ("members", "ticks"))):
                    with contextlib.suppress(NoAuthError):
                        client.set_acls(path, self._acl)
        except BaseException:
            client.stop()
            client.close()
            raise
        client.add_listener(self._on_state)
        self._client = client

    def stop(self) -> None:
        """Close the session; its ephemeral member nodes disappear and its watches end."""
        client, self._client = self._client, None
        if client is not None:
            client.stop()
            client.close()

    def __enter__(self) -> ClusterStore:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def _zk(self) -> Any:
        if self._client is None:
            raise RuntimeError(f"ClusterStore for {self.base} is not started; call start() first")
        return self._client

    # -- membership ----------------------------------------------------------

    def register(self, role: str, name: str, info: dict[str, Any], *, stale: Callable[[dict[str, Any]], bool]
                 | None = None) -> None:
        """Announce this process as ``role``/``name`` for as long as the session lives, and again after the
        session expired (ZooKeeper away longer than the session timeout drops ephemeral nodes; the process
        itself lived on, so it must not drop out of the cluster for good).

        A name already held by another session is refused rather than overwritten,
        since two processes claiming one identity would split its traffic — unless
        ``stale(info)`` says the holder is a dead incarnation of this very process
        (the caller knows: a node holds a lock on its data dir while it lives), whose
        session merely has not expired yet.  Then the node is replaced at once
        instead of after a session timeout of refusals.
        """
        path = f"{self._role_path(role)}/{_check_name('member name', name)}"
        data = _encode(info)
        while True:
            try:
                self._zk.create(path, data, ephemeral=True, makepath=True)
                break
            except NoAuthError:
                raise Unauthorized(f"ZooKeeper refused to register {role} {name!r}: the cluster's znodes are "
                                   "secured (digest ACLs) and this session does not hold its credentials") from None
            except NodeExistsError:
                try:
                    held, stat = self._zk.get(path)
                except NoNodeError:
                    continue  # the holder's session just ended: take the name
                if stale is None or not stale(_decode(path, held)):
                    raise ValueError(f"member {role}/{name} is already registered in cluster {self.cluster!r} "
                                     f"by {_decode(path, held).get('node', 'another process')}") from None
                log.warning("replacing member %s/%s left by a dead incarnation of this node", role, name)
                with contextlib.suppress(NoNodeError, BadVersionError):
                    self._zk.delete(path, version=stat.version)
        self._registered[path] = data

    def _on_state(self, state: str) -> None:
        """kazoo's connection listener (its own thread): after an expired session, re-register the members."""
        if state == KazooState.LOST:
            self._expired = True
        elif state == KazooState.CONNECTED and self._expired:
            self._expired = False
            self._zk.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        for path, data in list(self._registered.items()):
            try:
                self._zk.create(path, data, ephemeral=True, makepath=True)
                log.warning("ZooKeeper session expired; registered %s again", path)
            except NodeExistsError:
                log.error("ZooKeeper session expired and %s is now held by another process", path)
            except Exception:
                log.exception("ZooKeeper session expired; registering %s again failed", path)

    def members(self, role: str) -> dict[str, dict[str, Any]]:
        """Current members of ``role`` by name, with the info they registered."""
        return {name: info for name, (info, _version) in self._read_children(self._role_path(role)).items()}

    def watch_members(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from kazoo's event thread) whenever a member of any role joins or leaves, and once
        per role now; until ``stop()``.  A member's info changes only by its node being created again (a restart
        replacing its predecessor, a registration after an expired session), so that is a change too."""
        for role in SERVICE_ROLES:
            self._watch_children(self._role_path(role), callback)

    def _watch_children(self, path: str, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from kazoo's event thread) now and whenever ``path`` gains or loses a child; until
        ``stop()``.  The path is made first: kazoo's watch of a node that does not exist ends at once."""
        self._zk.ensure_path(path)
        self._zk.ChildrenWatch(path, lambda _names: callback())

    def wait_for_members(self, role: str, count: int, timeout: float) -> dict[str, dict[str, Any]]:
        """Block until at least ``count`` members of ``role`` are registered, then return them all.

        Woken by a children watch rather than by polling, so it returns as soon as
        the last member registers.
        """
        _check_count("count", count)
        path = self._role_path(role)
        self._zk.ensure_path(path)
        deadline = time.monotonic() + timeout
        # One event for all rounds: a watch left over from an earlier round can
        # only cause a spurious wake-up, after which the count is checked again.
        changed = threading.Event()

        def wake(_event: Any) -> None:
            changed.set()

        while True:
            changed.clear()
            names = self._zk.get_children(path, watch=wake)
            if len(names) >= count:
                found = self.members(role)
                # Fewer means someone left between the two reads; that removal
                # also fires the watch just set, so the wait below wakes at once.
                if len(found) >= count:
                    return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout:g}s waiting for {count} {role!r} members in cluster "
                    f"{self.cluster!r}: {len(names)} registered {sorted(names)}"
                )
            changed.wait(remaining)

    # -- ticks ---------------------------------------------------------------

    def publish_tick(self, tick: dict[str, Any], leases: dict[int, tuple[int, int]] | None = None) -> int:
        """Append ``tick`` as the next number and return the number.

        With ``leases`` (from ``leases()``), only if none of them changed since:
        raises ``LeaseMoved`` otherwise, and nothing is published.  One
        transaction creates ``ticks/<n>`` for the next free n, so two
        publishers can never take the same number (the loser retries with the
        next one).
        """
        for _ in range(_PUBLISH_ATTEMPTS):
            numbers = self._tick_numbers()
            n = numbers[-1] + 1 if numbers else 0
            transaction = self._zk.transaction()
            for front, (_until, version) in (leases or {}).items():
                transaction.check(f"{self.base}/leases/front{front}", version)
            transaction.create(f"{self.base}/ticks/{n:010d}", _encode(tick))
            results = transaction.commit()
            if not any(isinstance(result, Exception) for result in results):
                return n
            if any(isinstance(result, (BadVersionError, NoNodeError)) for result in results[:-1]):
                raise LeaseMoved(f"a front's stamping lease changed while tick {n} was published")
            if not isinstance(results[-1], NodeExistsError):
                raise results[-1]
        raise RuntimeError(f"could not publish a tick in cluster {self.cluster!r}: "
                           f"{_PUBLISH_ATTEMPTS} concurrent publications took every number first")

    def ticks(self, after: int = -1) -> list[tuple[int, dict[str, Any]]]:
        """The published ticks numbered above ``after`` (default: all), in increasing number."""
        result: list[tuple[int, dict[str, Any]]] = []
        for n in self._tick_numbers():
            if n <= after:
                continue
            tick = self._read_tick(n)
            if tick is not None:
                result.append((n, tick))
        return result

    def latest_tick(self) -> tuple[int, dict[str, Any]] | None:
        """The highest-numbered tick, or None before the first one is published."""
        for n in reversed(self._tick_numbers()):
            tick = self._read_tick(n)
            if tick is not None:
                return n, tick
        return None

    def watch_ticks(self, callback: TickCallback) -> None:
        """Call ``callback(n, tick)`` once for every tick, existing and future, in increasing n.

        Existing ticks are delivered before this returns; later ones from kazoo's
        event thread.  ZooKeeper only reports that the children changed, possibly
        coalescing several changes or repeating the list after a reconnect, so a
        cursor of the next undelivered number is what keeps delivery exactly-once
        and ordered.  An exception from ``callback`` is logged and does not stop
        delivery of later ticks: raised on the event thread it would reach no one,
        and retrying the tick would deliver it twice.  The watch ends with
        ``stop()``.
        """
        lock = threading.Lock()
        next_n = 0

        def on_children(names: list[str]) -> None:
            nonlocal next_n
            # kazoo already serialises calls of one watch; the lock makes the
            # cursor's safety independent of that implementation detail.
            with lock:
                for n in sorted(int(name) for name in names):
                    if n < next_n:
                        continue
                    tick = self._read_tick(n)
                    next_n = n + 1
                    if tick is None:
                        continue
                    try:
                        callback(n, tick)
                    except Exception:
                        log.exception("tick callback failed on tick %d of cluster %r", n, self.cluster)

        self._zk.ChildrenWatch(f"{self.base}/ticks", on_children)

    def tick(self, n: int) -> dict[str, Any] | None:
        """Tick ``n``, or None if there is no such tick."""
        return self._read_tick(_check_count("tick", n))

    # -- stamping leases ----------------------------------------------------

    def renew_lease(self, front: int, until_ts: int) -> None:
        """Front ``front`` will stamp no global time at or after ``until_ts`` without renewing this first.

        Ephemeral (a dead front holds no lease).  A hand-over tick must start
        after every lease, and is published in one transaction with a check
        of the leases' versions (``publish_tick(..., leases=...)``): a renewal
        in between fails the publication, and a front reads the ticks after
        each renewal, so no front ever stamps at or after a tick's start
        without knowing the tick.
        """
        path = f"{self.base}/leases/front{_check_count('front', front)}"
        data = _encode({"until": _check_count("until", until_ts)})
        try:
            self._zk.set(path, data)
        except NoNodeError:
            self._zk.create(path, data, ephemeral=True, makepath=True)

    def leases(self) -> dict[int, tuple[int, int]]:
        """Front -> (lease end in ms, node version) of every live front."""
        return {int(name.removeprefix("front")): (int(info["until"]), version)
                for name, (info, version) in self._read_children(f"{self.base}/leases").items()}

    def fence(self, after_tick: int, until_ts: int) -> str:
        """Ask every front to cut its stamping lease back to ``until_ts`` (or to its clock, if that is later)
        until it knows a tick numbered above ``after_tick``; returns the fence's path, for ``unfence``.

        Why: a lease reaches seconds ahead so that a front rides out a ZooKeeper
        pause (``flamestream.fronts.lease``), and a hand-over tick must start
        past every lease; a fence lets it start within a fraction of a second
        instead.  Ephemeral: a publisher that dies lifts its fence with its
        session, and a front ignores a fence once it knows a newer tick.
        """
        data = _encode({"after": _check_count("tick", after_tick), "until": _check_count("until", until_ts)})
        path: str = self._zk.create(f"{self.base}/fences/fence-", data, ephemeral=True, sequence=True,
                                    makepath=True)
        return path

    def unfence(self, path: str) -> None:
        with contextlib.suppress(NoNodeError):
            self._zk.delete(path)

    def fences(self) -> list[tuple[int, int]]:
        """(after tick, until ts) of every fence up (see ``fence``)."""
        return [(int(info["after"]), int(info["until"]))
                for info, _version in self._read_children(f"{self.base}/fences").values()]

    def watch_fences(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from kazoo's event thread) now and whenever a fence goes up or comes down; until
        ``stop()``.  A front renews its lease at once then (``flamestream.fronts.lease``) instead of polling."""
        self._watch_children(f"{self.base}/fences", callback)

    # -- load statistics -----------------------------------------------------

    def report_load(self, worker: int, buckets: list[int]) -> None:
        """Worker ``worker`` processed ``buckets[b]`` items of hash bucket ``b`` (cumulative; ephemeral)."""
        self._put_ephemeral(f"{self.base}/load/worker{_check_count('worker', worker)}",
                            _encode({"buckets": [_check_count("load", n) for n in buckets]}))

    def loads(self) -> list[int]:
        """Items per hash bucket, summed over every live worker's report (empty when nobody reported)."""
        total: list[int] = []
        for info, _version in self._read_children(f"{self.base}/load").values():
            buckets = [int(n) for n in info["buckets"]]
            total = [a + b for a, b in zip(total, buckets, strict=True)] if total else buckets
        return total

    # -- memory pressure -----------------------------------------------------

    def report_pressure(self, worker: int, reason: str | None) -> None:
        """Worker ``worker`` is over its memory budget (``reason`` says how far), or with None no longer.
        Ephemeral, so a dead worker holds nothing back; a worker over its budget says so again every time it
        measures, which also puts the node back after an expired session dropped it."""
        path = f"{self.base}/pressure/worker{_check_count('worker', worker)}"
        if reason is None:
            with contextlib.suppress(NoNodeError):
                self._zk.delete(path)
        else:
            self._put_ephemeral(path, _encode({"reason": reason}))

    def pressure(self) -> dict[str, str]:
        """Worker name -> why, for every worker over its memory budget now."""
        return {name: str(info.get("reason", "")) for name, (info, _version) in
                self._read_children(f"{self.base}/pressure").items()}

    def watch_pressure(self, callback: Callable[[dict[str, str]], None]) -> None:
        """Call ``callback(self.pressure())`` (from kazoo's event thread) now and whenever a worker goes over its
        memory budget or back under it; until ``stop()``."""
        self._watch_children(f"{self.base}/pressure", lambda: callback(self.pressure()))

    def _put_ephemeral(self, path: str, data: bytes) -> None:
        try:
            self._zk.set(path, data)
        except NoNodeError:
            self._zk.create(path, data, ephemeral=True, makepath=True)

    # -- snapshots -----------------------------------------------------------

    def register_snapshot(self, tick: int, boundary: str, worker: int, info: dict[str, Any]) -> None:
        """Record that ``worker`` of ``tick`` wrote its snapshot below ``boundary`` (a ``<ts>-<front>`` name).

        The snapshot of a boundary is complete once every worker of the tick
        registered it; only then may a new tick start from it.

        One transaction creates the boundary's node with the registration, so
        the first worker to register a boundary makes one request where
        ``makepath`` made five (a failed create, two existence checks and two
        creates); they landed, with retention's, in the burst after every
        snapshot boundary.  The others find the node there and create only
        their registration.
        """
        node = f"{self._snapshots_path(tick)}/{_check_name('boundary', boundary)}"
        path = f"{node}/worker{_check_count('worker', worker)}"
        data = _encode(info)
        transaction = self._zk.transaction()
        transaction.create(node)
        transaction.create(path, data)
        if not any(isinstance(result, Exception) for result in transaction.commit()):
            return
        try:  # the node was there (another worker was first) or the tick's had none yet
            self._zk.create(path, data, makepath=True)
        except NodeExistsError:  # written again (a restarted worker): the file was replaced atomically too
            self._zk.set(path, data)

    def snapshots(self, tick: int) -> dict[str, dict[str, dict[str, Any]]]:
        """Boundary -> worker member name -> the info it registered, for every snapshot of ``tick``."""
        root = self._snapshots_path(tick)
        try:
            boundaries = self._zk.get_children(root)
        except NoNodeError:
            return {}
        return {boundary: {name: info for name, (info, _version) in self._read_children(f"{root}/{boundary}").items()}
                for boundary in boundaries}

    def complete_snapshots(self, tick: int, workers: int) -> list[str]:
        """The boundaries (``<ts>-<front>`` names) of ``tick``'s complete snapshots, oldest first.

        Complete: every one of the tick's ``workers`` workers (``worker0`` ..)
        registered its file, so the snapshot holds the state of the whole hash
        space; only such a snapshot may be started from, and retention counts
        only these.  The one definition every reader uses (hand-over, retention,
        the client waiting for a hand-over; the fronts' input-log retention
        through ``complete_boundaries`` itself).
        """
        return list(complete_boundaries(self.registered_snapshots(tick), workers))

    def registered_snapshots(self, tick: int, complete: Mapping[str, dict[str, None]] | None = None
                             ) -> dict[str, dict[str, None]]:
        """Boundary -> the member names (``worker<i>``) that registered it, for every snapshot of ``tick``: what
        ``complete_boundaries`` counts, without reading the registrations themselves.

        Why: retention asks this after every periodic snapshot, on every
        worker; reading each registration too cost a request per worker and
        boundary (ten a second per worker, where this takes four), and those
        requests, the kazoo threads serving them and their hand-overs of the
        interpreter lock, landed on the node in the burst after every boundary.

        ``complete``: boundaries the caller saw complete before, with their
        names.  A complete snapshot's registrations change no more until it is
        forgotten, so they are not listed again; retention and the fronts' look
        (``oldest_complete_snapshot``) pass what they saw last time and list only
        the boundaries that are new since.
        """
        root = self._snapshots_path(tick)
        try:
            boundaries = self._zk.get_children(root)
        except NoNodeError:
            return {}
        known = complete or {}
        found = {boundary: known[boundary] if boundary in known else self._registrants(root, boundary)
                 for boundary in boundaries}
        return {boundary: names for boundary, names in found.items() if names is not None}

    def _registrants(self, root: str, boundary: str) -> dict[str, None] | None:
        """The member names that registered the snapshot ``boundary`` under ``root``, or None if it was forgotten
        meanwhile."""
        try:
            return dict.fromkeys(self._zk.get_children(f"{root}/{boundary}"))
        except NoNodeError:
            return None

    def oldest_complete_snapshot(self, seen: SnapshotsSeen | None = None) -> str | None:
        """The oldest boundary of any tick's complete snapshot still registered, or None if there is none.

        What the fronts' input-log retention keeps the log from: a hand-over
        falling back to an older snapshot, or a replay from any retained one,
        needs every event from there on.  Every tick counts (retention forgets
        an older tick's snapshots once a later one has enough of its own), so
        this errs on keeping more.

        ``seen`` carries what one look tells the next (see ``SnapshotsSeen``):
        a front looks every second, and ticks are never deleted, so asking
        about every tick and every registration each time made its ZooKeeper
        requests grow with the cluster's history.
        """
        seen = SnapshotsSeen() if seen is None else seen
        ticks = [n for n in self._tick_numbers() if n >= seen.since]
        oldest: str | None = None
        swept: set[int] = set()
        newest_complete = -1
        complete_now: dict[int, dict[str, dict[str, None]]] = {}
        for n in ticks:
            registered = self.registered_snapshots(n, seen.complete.get(n))
            if not registered:
                swept.add(n)
                continue
            workers = seen.workers.get(n)
            if workers is None:
                tick = self._read_tick(n)
                if tick is None:
                    continue
                workers = seen.workers[n] = len(tick.get("workers", []))
            complete = complete_boundaries(registered, workers)
            if complete:
                complete_now[n] = complete
                newest_complete = n
                first = next(iter(complete))  # oldest first
                if oldest is None or boundary_of(first) < boundary_of(oldest):
                    oldest = first
        seen.complete = complete_now
        for n in ticks:
            if n >= newest_complete or n not in swept:
                break
            seen.since = n + 1
        seen.workers = {n: w for n, w in seen.workers.items() if n >= seen.since}
        return oldest

    def forget_snapshot(self, tick: int, boundary: str, names: Iterable[str] = ()) -> None:
        """Remove a snapshot's registrations (its files are gone or going): retention.

        ``names``: the registrations retention read (``registered_snapshots``).
        With them one transaction deletes them and the node, where a
        recursive delete lists the node first and deletes each in a request of
        its own.  If that fails (another worker of the tick was first, or a
        registration came meanwhile), the recursive delete does what is left.
        """
        node = f"{self._snapshots_path(tick)}/{_check_name('boundary', boundary)}"
        if names:
            transaction = self._zk.transaction()
            for name in names:
                transaction.delete(f"{node}/{_check_name('registration', name)}")
            transaction.delete(node)
            if not any(isinstance(result, Exception) for result in transaction.commit()):
                return
        with contextlib.suppress(NoNodeError):  # another worker of the tick was first
            self._zk.delete(node, recursive=True)

    def legacy_offsets(self, topic: str, partition: int) -> dict[str, int]:
        """Group -> offset committed as ``offsets/<group>/<topic>/<partition>``, where consumer offsets lived until
        they moved beside the topic: a barrier adopts them once, so the groups of an upgraded cluster resume where
        they were rather than read the topic again from 0.  Unreadable values are left out."""
        found: dict[str, int] = {}
        within = f"{_check_name('topic', topic)}/{_check_count('partition', partition)}"
        try:
            groups = self._zk.get_children(f"{self.base}/offsets")
        except NoNodeError:
            return found
        for group in sorted(groups):
            with contextlib.suppress(NoNodeError, ValueError):  # ValueError: a value that is no integer
                data, _ = self._zk.get(f"{self.base}/offsets/{group}/{within}")
                found[group] = int(data)
        return found

    # -- paths ---------------------------------------------------------------

    def _role_path(self, role: str) -> str:
        return f"{self.base}/members/{_check_name('role', role)}"

    def _read_children(self, path: str) -> dict[str, tuple[dict[str, Any], int]]:
        """Every child of ``path`` by name, in name order, with its JSON object and node version; a child that
        goes away between listing and reading is left out."""
        try:
            names = self._zk.get_children(path)
        except NoNodeError:
            return {}
        result: dict[str, tuple[dict[str, Any], int]] = {}
        for name in sorted(names):
            try:
                data, stat = self._zk.get(f"{path}/{name}")
            except NoNodeError:
                continue
            result[name] = (_decode(f"{path}/{name}", data), stat.version)
        return result

    def _snapshots_path(self, tick: int) -> str:
        return f"{self.base}/ticks/{_check_count('tick', tick):010d}/snapshots"

    def _tick_numbers(self) -> list[int]:
        return sorted(int(name) for name in self._zk.get_children(f"{self.base}/ticks"))

    # -- crash recovery ------------------------------------------------------

    def recovery_lock(self) -> Any:
        """The lock a recovery is published under, so two nodes that see the same crash publish one tick."""
        return self._zk.Lock(f"{self.base}/locks/recovery")

    def _read_tick(self, n: int) -> dict[str, Any] | None:
        """Tick ``n``, or None if it was removed behind this module's back (ticks are never deleted here)."""
        path = f"{self.base}/ticks/{n:010d}"
        try:
            data, _ = self._zk.get(path)
        except NoNodeError:
            return None
        return _decode(path, data)


_Registrations = TypeVar("_Registrations", bound=Mapping[str, Any])


def complete_boundaries(snapshots: Mapping[str, _Registrations], workers: int) -> dict[str, _Registrations]:
    """The complete ones of a tick's ``snapshots`` (boundary -> the names that registered it, with or without
    their registrations: ``ClusterStore.registered_snapshots`` or ``snapshots``), oldest first, each with what
    ``snapshots`` holds for it: see ``ClusterStore.complete_snapshots``.  Apart, so that the readers, which all
    need only the names (retention, once a second on every worker; the fronts' ``oldest_complete_snapshot``), read
    no more than those; with the names, so that both keep what they saw complete for their next read
    (``registered_snapshots``'s ``complete``)."""
    _check_count("workers", workers)
    needed = {f"worker{i}" for i in range(workers)}
    return {boundary: snapshots[boundary] for boundary in sorted(
        (boundary for boundary, registered in snapshots.items() if needed <= registered.keys()), key=boundary_of)}


def host_port(address: str) -> tuple[str, int]:
    """A member's ``host:port`` (an IPv6 host in brackets) as the host to connect to and the port: the one reading
    of the addresses members register, for whoever dials, binds or probes one.  ValueError if there is no port."""
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError(f"address {address!r} has no port (HOST:PORT)")
    return host.strip("[]"), int(port)


def zookeeper_serving(address: str, timeout: float = 1.0) -> bool:
    """Whether the ZooKeeper at HOST:PORT accepts sessions yet.

    ``ruok`` answers ``imok`` before the server can serve, and a session opened
    in between is dropped; ``srvr`` reports a version only once it serves.
    """
    try:
        with socket.create_connection(host_port(address), timeout=timeout) as sock:
            sock.sendall(b"srvr")
            reply = b""
            while chunk := sock.recv(256):
                reply += chunk
    except (OSError, ValueError):
        return False
    return reply.startswith(b"Zookeeper version")
