"""Snapshot files: one worker's grouping state below a boundary, durable and verifiable.

A snapshot is what a new tick (a redeploy, a rescale, a recovery) starts
from, so a file that is torn or bit-rotted must be *detected*, never loaded:
the file carries a format version and a SHA-256 of its body, and is written
to a temporary name, fsynced and renamed (then the directory fsynced), so a
crash leaves the old file or the new one.  The body is
``flamestream.core.values`` in chunks of buckets: exact for tuples and
non-string keys, and decoding can build only plain values (nothing read back
may run code).

Layout: ``DIR/snapshots/<boundary ts>-<boundary front>/worker-<i>.snap``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flamestream.core import values
from flamestream.core.meta import GlobalTime
from flamestream.core.worker import WorkerState

MAGIC = b"flamestream-snapshot\n"
VERSION = 1


class SnapshotError(Exception):
    """A snapshot file is missing, truncated, corrupted or of an unknown format; the message names it."""


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot file says about itself (its header)."""

    boundary: GlobalTime
    worker: int
    tick: int
    keys: int
    """Buckets in it, over all groupings."""
    items: int
    body_bytes: int
    sha256: str


def boundary_name(boundary: GlobalTime) -> str:
    """How a boundary is named in paths and in ZooKeeper: ``<ts>-<front>``."""
    return f"{boundary.ts}-{boundary.front}"


def boundary_of(name: str) -> GlobalTime:
    ts, _, front = name.partition("-")
    return GlobalTime(int(ts), int(front))


def snapshot_dir(data_dir: Path, boundary: GlobalTime) -> Path:
    return data_dir / "snapshots" / boundary_name(boundary)


def snapshot_path(data_dir: Path, boundary: GlobalTime, worker: int) -> Path:
    return snapshot_dir(data_dir, boundary) / f"worker-{worker}.snap"


CHUNK = 512
"""Buckets per encoded chunk: each chunk is one short stretch of GIL-holding C code (see values.decode_all)."""


def _chunks(state: WorkerState) -> Iterator[bytes]:
    for name, buckets in state.items():
        yield values.encode([name])  # a grouping with no buckets still says it exists
        for start in range(0, len(buckets), CHUNK):
            yield values.encode([name, [[h, key, [[gt.ts, gt.front, list(trace), payload]
                                                  for (gt, trace), payload in entries]]
                                        for h, key, entries in buckets[start:start + CHUNK]]])


def _state(chunks: list[Any]) -> WorkerState:
    state: WorkerState = {}
    for chunk in chunks:
        name, *buckets = chunk
        mine = state.setdefault(str(name), [])
        for h, key, entries in buckets[0] if buckets else []:
            mine.append((int(h), key, [((GlobalTime(int(ts), int(front)), tuple(int(t) for t in trace)), payload)
                                       for ts, front, trace, payload in entries]))
    return state


def write_snapshot(path: Path, state: WorkerState, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
    """Write ``state`` durably and atomically to ``path``; returns its header."""
    body = b"".join(_chunks(state))
    info = SnapshotInfo(boundary=boundary, worker=worker, tick=tick,
                        keys=sum(len(buckets) for buckets in state.values()),
                        items=sum(len(entries) for buckets in state.values() for _h, _k, entries in buckets),
                        body_bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
    header = json.dumps({"version": VERSION, "boundary": list(boundary), "worker": worker, "tick": tick,
                         "keys": info.keys, "items": info.items, "body_bytes": info.body_bytes,
                         "sha256": info.sha256}).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + header + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return info


def read_snapshot(path: Path) -> tuple[SnapshotInfo, WorkerState]:
    """The header and state of the snapshot at ``path``; SnapshotError if it is not whole and intact."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"snapshot {path} cannot be read: {exc}") from exc
    if not data.startswith(MAGIC):
        raise SnapshotError(f"{path} is not a flamestream snapshot (bad magic)")
    header_end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):header_end])
        if header["version"] != VERSION:
            raise SnapshotError(f"snapshot {path} has format version {header['version']}; this build reads "
                                f"{VERSION}")
        info = SnapshotInfo(boundary=GlobalTime(*map(int, header["boundary"])), worker=int(header["worker"]),
                            tick=int(header["tick"]), keys=int(header["keys"]), items=int(header["items"]),
                            body_bytes=int(header["body_bytes"]), sha256=str(header["sha256"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"snapshot {path} has a damaged header: {exc!r}") from exc
    body = data[header_end + 1:]
    if len(body) != info.body_bytes:
        raise SnapshotError(f"snapshot {path} is truncated: {len(body)} of {info.body_bytes} body bytes")
    if hashlib.sha256(body).hexdigest() != info.sha256:
        raise SnapshotError(f"snapshot {path} is corrupted: its checksum does not match")
    try:
        return info, _state(values.decode_all(body))
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"snapshot {path} has a damaged body: {exc}") from exc
