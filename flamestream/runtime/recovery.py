"""Crash recovery (issue #11): a restarted process makes the whole tick restart from its last complete snapshot.

Like Flink's full restart and the later FlameStream's replay from the fronts,
recovery trades a short stall for a simple invariant: after it, no process
holds anything from before the crash.  The steps, all decided from ZooKeeper
alone so that ``up``'s supervisor and docker's ``restart: on-failure`` take
the same path:

1. A process that restarts (its node ran on this data dir before: the node
   lock file exists) while a tick it belongs to is deployed cannot take that
   tick over (its grouping state, acks and buffers died with its
   predecessor).  It registers with ``recovering: n`` (n = the latest tick)
   and ignores ticks up to n.
2. Every node watches the roster of the latest tick.  A node that runs tick
   n and sees a member of n's roster that is recovering from n or later
   exits (code 1), to be restarted as a fresh process too: it holds state
   and in-flight items its restarted peer has lost, so it cannot go on.
3. Once every member of the roster is a recovering one, one node (under a
   ZooKeeper lock) publishes the recovery tick: the latest tick's graph and
   layout, starting at the boundary T of the last complete snapshot
   (``previous`` = the tick that wrote it).  Workers load that snapshot, the
   acker starts an empty table at T, the fronts send their logged events
   from T on again with their original stamps, and the barriers release only
   what their topic does not hold yet.

Why restart survivors instead of resetting them in place: items and acks of
the old incarnation may still be in flight to them, and with every process
fresh nothing from before the recovery tick can arrive at all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flamestream.cluster import ACKER, BARRIER, FRONT, SERVICE_ROLES, WORKER, ClusterStore
from flamestream.core.meta import GlobalTime, boundary_of
from flamestream.core.tick import Tick
from flamestream.runtime.logs import role_logger

log = role_logger("recovery")

RECOVERING = "recovering"
"""Member info key: the latest tick when the member's process started (it cannot take that tick over)."""


def in_roster(tick: Tick, kind: str, info: dict[str, Any]) -> bool:
    """Whether a member of role ``kind`` with registered ``info`` takes part in ``tick``."""
    if kind == ACKER:
        return True
    if kind == WORKER:
        return int(info.get("index", -1)) < len(tick.workers)
    if kind == FRONT:
        return int(info.get("id", -1)) in tick.fronts
    if kind == BARRIER:
        return bool({int(p) for p in info.get("partitions", ())} & {p for p, _ in tick.barriers})
    return False


def check(store: ClusterStore, applied: int | None) -> str | None:
    """One look at the cluster (blocking; run it off the event loop): the member of the tick this node runs that
    restarted (so this node must restart too), or None after publishing the recovery tick if its time has come.

    ``applied`` is the latest tick this node runs (None: none, e.g. it is
    recovering itself).
    """
    latest = store.latest_tick()
    if latest is None:
        return None
    number, data = latest
    tick = Tick.from_dict({**data, "number": number})
    roster = {(kind, name): info for kind in SERVICE_ROLES for name, info in store.members(kind).items()
              if in_roster(tick, kind, info)}
    recovering = {member for member, info in roster.items() if int(info.get(RECOVERING, -1)) >= number}
    if applied is not None:
        for kind, name in sorted(recovering):
            if int(roster[kind, name][RECOVERING]) >= applied:
                return f"{kind} {name}"
    if not recovering or recovering != roster.keys() or not _complete(tick, roster):
        return None
    with store.recovery_lock():
        again = store.latest_tick()
        if again is None or again[0] != number:
            return None  # another node published it
        recovery = recovery_tick(store, tick, roster)
        published = store.publish_tick(recovery.to_dict())
    log.warning("every process of tick %d restarted: published recovery tick %d from %s (snapshot of tick %s)",
                number, published, recovery.start, recovery.previous)
    return None


def _complete(tick: Tick, roster: dict[tuple[str, str], dict[str, Any]]) -> bool:
    """Whether every part of ``tick`` has a member: the acker, each worker index, each front, each partition."""
    kinds = [kind for kind, _ in roster]
    workers = {int(info["index"]) for (kind, _), info in roster.items() if kind == WORKER}
    fronts = {int(info["id"]) for (kind, _), info in roster.items() if kind == FRONT}
    partitions = {int(p) for (kind, _), info in roster.items() if kind == BARRIER for p in info["partitions"]}
    return ACKER in kinds and workers >= set(range(len(tick.workers))) and fronts >= set(tick.fronts) and \
        partitions >= {p for p, _ in tick.barriers}


def recovery_tick(store: ClusterStore, tick: Tick, roster: dict[tuple[str, str], dict[str, Any]]) -> Tick:
    """``tick`` again, on the restarted processes' addresses, from the last complete snapshot after its state's
    origin (the latest tick that started empty: nothing before it counts)."""
    ticks = [Tick.from_dict({**data, "number": n}) for n, data in store.ticks()]
    origin = max((t for t in ticks if t.previous is None), key=lambda t: t.number, default=ticks[0])
    best: tuple[GlobalTime, int] | None = None
    for t in ticks:
        if t.number < origin.number:
            continue
        for name in store.complete_snapshots(t.number, len(t.workers)):
            boundary = boundary_of(name)
            # ``>=``: of two ticks that registered one boundary, the later wrote the files now in its directory.
            if boundary >= origin.start and (best is None or boundary >= best[0]):
                best = (boundary, t.number)
    start, previous = best if best is not None else (origin.start, None)
    address = {(kind, name): str(info["address"]) for (kind, name), info in roster.items()}
    workers = {int(info["index"]): address[member] for member, info in roster.items() if member[0] == WORKER}
    barriers = {int(p): address[member] for member, info in roster.items() if member[0] == BARRIER
                for p in info["partitions"]}
    acker = next(address[member] for member in roster if member[0] == ACKER)
    return replace(tick, number=0, start=start, previous=previous, recovery=True, acker=acker,
                   workers=tuple(workers[i] for i in range(len(tick.workers))),
                   barriers=tuple((p, barriers[p]) for p, _ in tick.barriers))
