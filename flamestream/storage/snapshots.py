"""Snapshot files: one worker's grouping state below a boundary, durable and verifiable.

A snapshot is what a new tick (a redeploy, a rescale, a recovery) starts
from, so a file that is torn or bit-rotted must be *detected*, never loaded:
the file carries a format version and a SHA-256, and is written to a
temporary name, fsynced and renamed (then the directory fsynced), so a crash
leaves the old file or the new one.  The checksum covers the header's fields
as well as the body (format 2; format 1 covered the body only and is still
read): a flipped digit in the header would otherwise pass for another
boundary, worker or tick, and a replay would trust it.  The body is
``flamestream.core.values``: exact for tuples and non-string keys, and
decoding can build only plain values (nothing read back may run code).
Since format 3 each grouping is an index of its buckets (hash, key, items,
size) and then their entries, so a restarted worker reads every key and
decodes a bucket's entries only when it needs them (``FrozenBucket``);
formats 1 and 2 hold chunks of whole buckets and are still read.  Since
format 4 the checksum is the SHA-256 of the header's fields and of each
part's own SHA-256 (each grouping's index, each bucket's entries), so a
periodic snapshot hashes only the buckets that changed: hashing the whole
file took 0.09 s of the 0.21 s a write of an 80 MB index cost, every time.

Since format 5 a periodic snapshot may be a *delta*: only the buckets that
changed since the worker's previous file, and the keys that left, on top of
that file (its *base*, named in the header by boundary and checksum; the
chain ends at a whole file).  A reader follows the chain
(``read_snapshot_frozen``), checking that each base is the very file the
delta was written on.  Why: a whole file rewrote the whole state every
second — 10 MB and 20 ms of a core for the index's 300 pages, 49 MB and
40-56 ms at 3,000 — where a second changes a few thousand buckets.  A chain
stays short (``MAX_CHAIN``, ``CHAIN_SHARE``), and retention keeps every file
a kept snapshot builds on (``read_snapshot_header``'s ``base``, file by file).

Layout: ``DIR/snapshots/<boundary ts>-<boundary front>/worker-<i>.snap``; a delta's base is the same worker's file
of the base boundary, ``DIR/snapshots/<base boundary>/worker-<i>.snap``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from itertools import chain, filterfalse, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from flamestream.core import splice, values
from flamestream.core.grouping import Entries
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.worker import WorkerState
from flamestream.storage.log import write_durably

MAGIC = b"flamestream-snapshot\n"
VERSION = 5
READABLE = (1, 2, 3, 4, 5)
"""Format versions this build reads: 1 checksummed the body only, 2 also the header's fields, 3 writes an index of
each grouping's keys and sizes before their entries (``FrozenBucket``), 4 checksums each part's checksum instead
of the body's bytes, 5 may be a delta on a base (the header's ``base``; a row of no items and no
bytes is a key that left)."""
MAX_CHAIN = 8
"""At most this many deltas between a snapshot and the whole file its chain starts at: a recovery reads them all."""
CHAIN_SHARE = 1.0
"""A delta is written while the deltas since the whole file add up to at most this share of the whole state's bytes:
past it, reading the chain costs more than a whole file would, and the whole file is written again."""


class SnapshotError(Exception):
    """A snapshot file is missing, truncated, corrupted or of an unknown format; the message names it."""


_DAMAGE = (ValueError, TypeError, OverflowError, RecursionError)
"""What reading crafted or damaged bytes raises besides: a size of ``Infinity``, a header nested thousands deep."""


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
    base: GlobalTime | None = None
    """The boundary of the file it is a delta on (``base_path``), or None: it is whole."""


def snapshot_dir(data_dir: Path, boundary: GlobalTime) -> Path:
    return data_dir / "snapshots" / boundary_name(boundary)


def snapshot_path(data_dir: Path, boundary: GlobalTime, worker: int) -> Path:
    return snapshot_dir(data_dir, boundary) / f"worker-{worker}.snap"


class FrozenBucket(NamedTuple):
    """One bucket of a snapshot file with its entries still encoded: a worker that takes it over decodes them only
    when an item first reaches the key (``Grouping.restore_lazily``), and its next snapshot writes the same bytes.

    Format 3 writes each grouping as an index ``[name, [[h, key, items,
    size], ...]]`` followed by its buckets' entries, ``size`` bytes each, so
    a reader finds every key without decoding what it holds.  Why one index
    and not a header per bucket: a pickler call per header cost 7 us in
    Python around it, a fifth more CPU for a periodic snapshot of the index.
    """

    row: tuple[int, Hashable, int, int]
    """Its row of the index: (h, key, items, size).  Kept built: a write lists every bucket's."""
    body: bytes | memoryview
    """Read from a file, a view of the file's bytes: copying them out cost more than finding them."""
    digest: bytes
    """SHA-256 of ``body``, computed once: every write's checksum covers it (format 4)."""
    source: str
    """The file it came from, to name in an error."""
    row_code: bytes | None = None
    """``row`` as ``values.fragments`` encodes it, for ``SnapshotImage.write`` to join into the grouping's index;
    None for a bucket read from a file (encoded at its next write) or a row ``fragments`` has none for (a key
    too large for one frame, or one that needs the memo)."""
    parts: splice.Parts | None = None
    """Where the parts of its entries are encoded in ``body`` (``splice``), for the bucket's next encoding to copy
    the unchanged ones; None if it was encoded whole or read from a file.  It holds those parts until the bucket
    changes again: the shards a second of postings replaced, at most, beyond what the state holds."""

    @property
    def h(self) -> int:
        return self.row[0]

    @property
    def key(self) -> Hashable:
        return self.row[1]

    def entries(self) -> Entries:
        try:
            return _entries(values.decode(self.body))
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"snapshot {self.source} has a damaged bucket {self.key!r}: {exc}") from exc


Frozen = dict[str, list[FrozenBucket]]
"""Grouping name -> its buckets as a snapshot file holds them (every grouping the file names, even without any)."""


def _entries(encoded: Any) -> Entries:
    return [((GlobalTime(int(ts), int(front)), tuple(int(t) for t in trace)), payload)
            for ts, front, trace, payload in encoded]


def _frozen(buckets: list[tuple[int, Hashable, Entries]], source: str) -> list[FrozenBucket]:
    """``buckets`` encoded as format 3 writes them, through one pickler (a snapshot encodes thousands each second,
    and a pickler per value would cost more than most of them)."""
    bodies = list(values.encode_each(map(_encodable, buckets)))
    return _built(buckets, bodies, [None] * len(bodies), source)


def _encodable(bucket: tuple[int, Hashable, Entries]) -> list[list[Any]]:
    """A bucket's entries as format 3 encodes them: ``[ts, front, trace, payload]`` each."""
    return [[gt.ts, gt.front, list(trace), payload] for (gt, trace), payload in bucket[2]]


def _built(buckets: list[tuple[int, Hashable, Entries]], bodies: list[bytes], parts: list[splice.Parts | None],
           source: str) -> list[FrozenBucket]:
    rows = [(h, key, len(entries), len(body)) for (h, key, entries), body in zip(buckets, bodies, strict=True)]
    digests = [hashlib.sha256(body).digest() for body in bodies]
    # Built at C level: the named tuple's own constructor is a Python function, a call per bucket.
    return list(map(_NEW_FROZEN, zip(rows, bodies, digests, repeat(source, len(rows)), values.fragments(rows), parts,
                                     strict=True)))


_NEW_FROZEN = partial(tuple.__new__, FrozenBucket)
"""``FrozenBucket`` of a tuple of its six fields."""


SPLICE_ABOVE = 4096
"""A changed bucket whose last encoding took at least this many bytes is encoded again through ``splice``, smaller
ones whole.  Splicing an index word's 64 shards costs 24-30 us whatever their size (in batches, at 3,000 pages),
encoding them whole 27 us below 4 KB, 43 us at 4-8 KB, 67 us at 8-12 KB and 85-150 us at 12-32 KB; unsharded
entries stay below 4 KB (``examples/inverted_index.py`` shards a word's postings past 128 pages)."""


class SnapshotImage:
    """One worker's state as of its last snapshot, kept encoded between snapshots: a bucket is encoded when it
    changes, not at every snapshot.

    Why: a periodic snapshot of an inverted index re-encoded every word
    each second (7.8 MB, 0.2 s of GIL-holding pickling in a 20k-word
    state), and that showed in the latency of every record the worker
    handled meanwhile.  A second of pages changes a few thousand words;
    ``update`` takes what ``Worker.snapshot_changes`` reports, and
    ``write`` joins the encoded buckets into an ordinary snapshot file.
    A large bucket that changed is encoded again with what did not change
    copied from its last encoding (``SPLICE_ABOVE``, ``splice``): a common
    word's posting list grows with the index, and one posting changes one of
    its shards.
    """

    def __init__(self) -> None:
        self._groupings: dict[str, dict[Hashable, FrozenBucket]] = {}
        self._items = 0
        """Items in all buckets, kept as buckets come and go: counting them at a write touched every bucket."""
        self._bytes = 0
        """Bytes of all buckets' entries, kept likewise: what a delta's chain is measured against (``CHAIN_SHARE``)."""
        self._dirty: dict[str, dict[Hashable, int]] = {}
        """Grouping name -> key -> its hash, for every key changed or gone since the last write: a delta's rows."""
        self._written: _Written | None = None
        """The last file written, which the next may be a delta on."""
        self.copied = 0
        """Bytes ``update`` copied from earlier encodings rather than encoded (``splice``), for the benchmarks."""

    def update(self, changes: WorkerState) -> None:
        """Apply a change report: a bucket with entries replaces what the image held for its key, one
        without removes it; a grouping the report names exists even if it has no buckets."""
        for name, buckets in changes.items():
            image = self._groupings.setdefault(name, {})
            dirty = self._dirty.setdefault(name, {})
            whole: list[tuple[int, Hashable, Entries]] = []
            large: list[tuple[tuple[int, Hashable, Entries], FrozenBucket]] = []
            for bucket in buckets:
                dirty[bucket[1]] = bucket[0]
                old = image.get(bucket[1])
                self._drop(old)  # its counts leave here; ``_put`` counts the new encoding's
                if not bucket[2]:
                    image.pop(bucket[1], None)
                elif old is not None and len(old.body) >= SPLICE_ABOVE:
                    large.append((bucket, old))
                else:
                    whole.append(bucket)
            self._put(image, _frozen(whole, "") + self._spliced(large))

    def _spliced(self, large: list[tuple[tuple[int, Hashable, Entries], FrozenBucket]]) -> list[FrozenBucket]:
        """The changed ``large`` buckets encoded with what is unchanged of each copied from its last encoding
        (``splice``); a bucket that cannot be is encoded whole."""
        done = splice.encode_spliced([(_encodable(bucket), old.parts or splice.NO_PARTS, old.body)
                                      for bucket, old in large])
        spliced: list[tuple[int, Hashable, Entries]] = []
        bodies: list[bytes] = []
        parts: list[splice.Parts | None] = []
        whole: list[tuple[int, Hashable, Entries]] = []
        for (bucket, _old), result in zip(large, done, strict=True):
            if result is None:
                whole.append(bucket)
            else:
                spliced.append(bucket)
                bodies.append(result[0])
                parts.append(result[1])
                self.copied += result[2]
        return _built(spliced, bodies, parts, "") + _frozen(whole, "")

    def adopt(self, name: str, bucket: FrozenBucket) -> None:
        """Hold ``bucket`` as it was read from a snapshot: a worker that took it over lazily writes it unchanged
        until it changes, instead of encoding again what it just read (2 s for 89 MB of inverted index)."""
        image = self._groupings.setdefault(name, {})
        self._dirty.setdefault(name, {})[bucket.row[1]] = bucket.row[0]
        self._drop(image.get(bucket.row[1]))
        self._put(image, [bucket])

    def _put(self, image: dict[Hashable, FrozenBucket], buckets: list[FrozenBucket]) -> None:
        """Hold each of ``buckets`` for its key; the caller has taken what they replace out of the counts.  C-level
        loops: an update puts thousands of buckets each second."""
        rows = list(map(_ROW, buckets))
        image.update(zip(map(_KEY, rows), buckets, strict=True))
        self._items += sum(map(_ITEMS, rows))
        self._bytes += sum(map(_SIZE, rows))

    def _drop(self, bucket: FrozenBucket | None) -> None:
        if bucket is not None:
            self._items -= bucket.row[2]
            self._bytes -= bucket.row[3]

    def write(self, path: Path, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
        """Write the image durably and atomically to ``path``; returns its header.  A delta on the last file
        written when that file is this worker's at an earlier boundary and the chain stays short (``MAX_CHAIN``,
        ``CHAIN_SHARE``); the whole image otherwise."""
        delta = self._delta(path, boundary)
        base = None if delta is None else delta[0]
        parts: list[bytes | memoryview] = []
        digests: list[bytes] = []
        for name, image in self._groupings.items():
            if delta is None:
                buckets = _with_row_codes(image, list(image.values()))
                gone: list[tuple[int, Hashable, int, int]] = []
            else:
                dirty = self._dirty.get(name, {})
                buckets = _with_row_codes(image, delta[1].get(name, []))
                gone = [(dirty[key], key, 0, 0) for key in filterfalse(image.__contains__, dirty)]
            index = _index(name, buckets, gone)
            parts.append(index)
            digests.append(hashlib.sha256(index).digest())
            # C-level loops over the buckets: a Python loop over twenty thousand cost a seventh of a snapshot.
            parts.extend(map(_BODY, buckets))
            digests.extend(map(_DIGEST, buckets))
        body_bytes = sum(map(len, parts))
        keys = sum(map(len, self._groupings.values()))
        fields: dict[str, Any] = {"version": VERSION, "boundary": list(boundary), "worker": worker, "tick": tick,
                                  "keys": keys, "items": self._items, "body_bytes": body_bytes,
                                  "base": None if base is None else {"boundary": list(base.boundary),
                                                                     "sha256": base.sha256}}
        fields["sha256"] = _checksum(fields, (b"".join(digests),))
        write_durably(path, MAGIC + json.dumps(fields).encode() + b"\n", *parts)
        self._dirty = {}
        self._written = (_Written(path, boundary, fields["sha256"], 0, 0) if base is None else
                         _Written(path, boundary, fields["sha256"], base.depth + 1, base.chain_bytes + body_bytes))
        return SnapshotInfo(boundary=boundary, worker=worker, tick=tick, keys=keys, items=self._items,
                            body_bytes=body_bytes, sha256=fields["sha256"],
                            base=None if base is None else base.boundary)

    def _delta(self, path: Path, boundary: GlobalTime) -> tuple[_Written, dict[str, list[FrozenBucket]]] | None:
        """The file the write of ``path`` at ``boundary`` may be a delta on and, by grouping, the buckets changed
        since (the delta's), or None to write the whole image."""
        last = self._written
        if (last is None or not last.boundary < boundary or last.depth >= MAX_CHAIN
                or last.path != base_path(path, last.boundary) or not self._dirty_self_equal()):
            return None
        changed = {name: list(filter(None, map(self._groupings[name].get, dirty)))  # a bucket is truthy
                   for name, dirty in self._dirty.items()}
        size = sum(sum(map(_SIZE, map(_ROW, buckets))) for buckets in changed.values())
        return (last, changed) if last.chain_bytes + size <= CHAIN_SHARE * self._bytes else None

    def _dirty_self_equal(self) -> bool:
        """Whether every key changed since the last write equals itself (``_self_equal``); at C level where they
        are all strings, integers, bytes or None, as keys mostly are: this check and the chain's byte count, a
        Python call per key each, took a fiftieth of a worker's CPU on the inverted index."""
        keys = list(chain.from_iterable(self._dirty.values()))
        return set(map(type, keys)).issubset(_ALWAYS_EQUAL) or all(map(_self_equal, keys))


_ALWAYS_EQUAL = (str, int, bytes, type(None))
"""Types whose values always equal themselves once decoded."""


def _self_equal(key: Hashable) -> bool:
    """Whether ``key`` equals itself once decoded: a NaN in it does not, so a delta could not replace or remove its
    bucket (a reader finds a key by equality; the image by the very object) and such a key's changes go whole."""
    if isinstance(key, _ALWAYS_EQUAL):
        return True
    if isinstance(key, tuple | frozenset):
        return all(map(_self_equal, key))
    return bool(key == key)


class _Written(NamedTuple):
    """What a delta needs of the file it builds on, and how long its chain is."""

    path: Path
    boundary: GlobalTime
    sha256: str
    depth: int
    """Deltas between it and the whole file its chain starts at (0: it is whole)."""
    chain_bytes: int
    """Body bytes of those deltas."""


def base_path(path: Path, base: GlobalTime) -> Path:
    """Where the base of the snapshot at ``path`` is: the same worker's file of boundary ``base``."""
    return path.parent.parent / boundary_name(base) / path.name


def _with_row_codes(image: dict[Hashable, FrozenBucket], buckets: list[FrozenBucket]) -> list[FrozenBucket]:
    """``buckets`` of ``image`` with their index rows encoded (``FrozenBucket.row_code``): a bucket read from a file
    gets its code here, kept in ``image`` for the next write; a row ``fragments`` has none for stays without."""
    if None not in map(_ROW_CODE, buckets):  # the Python-level pass only then
        return buckets
    missing = [bucket for bucket in buckets if bucket.row_code is None]
    coded = {bucket.key: bucket._replace(row_code=code)
             for bucket, code in zip(missing, values.fragments([bucket.row for bucket in missing]), strict=True)}
    image.update(coded)
    return [coded.get(bucket.key, bucket) for bucket in buckets]


def _index(name: str, buckets: list[FrozenBucket], gone: list[tuple[int, Hashable, int, int]]) -> bytes:
    """A grouping's index ``[name, [row, ...]]``: the rows of ``buckets``, joined from their encoded rows, then
    the rows of ``gone`` (a delta's keys that left).  Encoded whole while a row has none (``_with_row_codes``):
    that row is tried again at each write, which only a rare key (larger than a frame) costs."""
    codes = list(map(_ROW_CODE, buckets)) + (values.fragments(gone) if gone else [])
    head, = values.fragments([name])
    if head is None or None in codes:
        return values.encode([name, list(map(_ROW, buckets)) + gone])
    return values.encode_pair(head, codes)  # None is not among them: checked above


_ROW, _BODY, _DIGEST, _ROW_CODE = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(4)
"""``FrozenBucket`` fields by position, for C-level loops over an image's buckets."""
_KEY, _ITEMS, _SIZE = itemgetter(1), itemgetter(2), itemgetter(3)
"""Fields of a bucket's row (h, key, items, size), likewise."""


def _state_of_chunks(body: memoryview) -> WorkerState:
    """The state a body of formats 1 and 2 holds: values ``[name, [h, key, entries]...]``."""
    state: WorkerState = {}
    for chunk in values.decode_all(body):
        name, *buckets = chunk
        mine = state.setdefault(str(name), [])
        for h, key, entries in buckets[0] if buckets else []:
            mine.append((int(h), key, _entries(entries)))
    return state


def _frozen_of_body(data: bytes, start: int, source: str) -> tuple[Frozen, dict[str, list[Hashable]], list[bytes]]:
    """The buckets of a format 3, 4 or 5 body, ``data`` from ``start`` on, their entries left encoded: each grouping
    is an index ``[name, [[h, key, items, size], ...]]`` and then its buckets' entries, ``size`` bytes each.  Also
    the keys that left (a delta's rows of no items and no bytes: a bucket always holds an item), by grouping, and
    the SHA-256 of each part, in order: format 4's checksum covers them (``_checksum``)."""
    frozen: Frozen = {}
    gone: dict[str, list[Hashable]] = {}
    digests: list[bytes] = []
    view = memoryview(data)
    stream = io.BytesIO(data)  # shares the bytes, as the views do
    stream.seek(start)
    while (at := stream.tell()) < len(data):
        index = values.decode_next(stream)
        if not isinstance(index, list) or len(index) != 2 or not isinstance(index[1], list):
            raise ValueError(f"byte {at - start}: not a grouping's index")
        mine = frozen.setdefault(str(index[0]), [])
        left = gone.setdefault(str(index[0]), [])
        offset = stream.tell()
        digests.append(hashlib.sha256(view[at:offset]).digest())
        for h, key, items, size in index[1]:
            end = offset + int(size)
            if not offset <= end <= len(data) or int(items) < 0:
                raise ValueError(f"byte {at - start}: a bucket of {size} bytes and {items} items")
            if end == offset and int(items) == 0:
                left.append(key)
                continue
            body = view[offset:end]
            digests.append(hashlib.sha256(body).digest())
            mine.append(FrozenBucket((int(h), key, int(items), int(size)), body, digests[-1], source))
            offset = end
        stream.seek(offset)
    return frozen, gone, digests


def _checksum(fields: dict[str, Any], body: Iterable[bytes | memoryview]) -> str:
    """SHA-256 of the header's fields (all but the checksum, in a canonical form) and then ``body``: the body's
    bytes in formats 2 and 3, each part's SHA-256 in format 4."""
    canonical = json.dumps({k: v for k, v in fields.items() if k != "sha256"}, sort_keys=True,
                           separators=(",", ":")).encode()
    digest = hashlib.sha256(canonical + b"\n")
    for part in body:
        digest.update(part)
    return digest.hexdigest()


def write_snapshot(path: Path, state: WorkerState, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
    """Write ``state`` durably and atomically to ``path``; returns its header."""
    image = SnapshotImage()
    image.update(state)
    return image.write(path, boundary=boundary, worker=worker, tick=tick)


def read_snapshot(path: Path) -> tuple[SnapshotInfo, WorkerState]:
    """The header and state of the snapshot at ``path``; SnapshotError naming the file and what is wrong with it
    if it is not whole and intact (missing, truncated anywhere, a byte changed anywhere, an unknown format)."""
    info, frozen = read_snapshot_frozen(path)
    return info, {name: [(bucket.h, bucket.key, bucket.entries()) for bucket in buckets]
                  for name, buckets in frozen.items()}


def read_snapshot_frozen(path: Path) -> tuple[SnapshotInfo, Frozen]:
    """``read_snapshot`` with every bucket's entries left encoded, for ``Grouping.restore_lazily``: the file is
    checked whole, its keys are read, nothing else is decoded; a delta's chain of bases likewise, each base checked
    to be the file the delta was written on.  A file of format 1 or 2 is decoded and encoded again as format 3 and
    later hold it (once, after an upgrade)."""
    return _read_frozen(path, 0)


def _read_frozen(path: Path, depth: int) -> tuple[SnapshotInfo, Frozen]:
    info, fields, data, start = _opened(path)
    version = int(fields["version"])
    body = memoryview(data)[start:]
    if version < 4:  # the checksum covers the body's bytes as they are
        _checked(path, info, hashlib.sha256(body).hexdigest() if version == 1 else _checksum(fields, (body,)))
    try:
        if version < 3:
            return info, {name: _frozen(buckets, str(path)) for name, buckets in _state_of_chunks(body).items()}
        frozen, gone, digests = _frozen_of_body(data, start, str(path))
    except _DAMAGE as exc:
        if version < 4:
            raise SnapshotError(f"snapshot {path} has a damaged body: {exc}") from exc
        raise SnapshotError(f"snapshot {path} is corrupted: its body does not parse ({exc})") from exc
    if version >= 4:
        _checked(path, info, _checksum(fields, digests))
    if info.base is None:
        if any(gone.values()):
            raise SnapshotError(f"snapshot {path} is corrupted: a whole file with keys that left")
        return info, frozen
    return info, _on_base(path, info, str(fields["base"]["sha256"]), frozen, gone, depth)


def _on_base(path: Path, info: SnapshotInfo, sha256: str, frozen: Frozen, gone: dict[str, list[Hashable]],
             depth: int) -> Frozen:
    """The state of the delta at ``path``: its base's (``info.base``, whose checksum the header says is
    ``sha256``), read and checked, with ``gone``'s keys taken out and ``frozen``'s buckets put in."""
    boundary = info.base
    assert boundary is not None
    if not boundary < info.boundary or depth >= MAX_CHAIN:
        raise SnapshotError(f"snapshot {path} is corrupted: a base at {boundary_name(boundary)} below "
                            f"{boundary_name(info.boundary)}, {depth} deltas deep")
    below = base_path(path, boundary)
    try:
        base_info, state = _read_frozen(below, depth + 1)
    except SnapshotError as exc:
        raise SnapshotError(f"snapshot {path} builds on {below}: {exc}") from exc
    if base_info.sha256 != sha256:
        raise SnapshotError(f"snapshot {path} builds on {below}, but that is another file now (its checksum differs)")
    try:
        for name in [*state, *(name for name in frozen if name not in state)]:  # in file order, not hash order
            buckets = {bucket.row[1]: bucket for bucket in state.get(name, [])}
            for key in gone.get(name, []):
                buckets.pop(key, None)
            buckets.update((bucket.row[1], bucket) for bucket in frozen.get(name, []))
            state[name] = list(buckets.values())
    except TypeError as exc:  # a key that is no hashable value: only a crafted file has one
        raise SnapshotError(f"snapshot {path} is corrupted: {exc}") from exc
    keys = sum(map(len, state.values()))
    items = sum(bucket.row[2] for buckets in state.values() for bucket in buckets)
    if (keys, items) != (info.keys, info.items):
        raise SnapshotError(f"snapshot {path} is corrupted: its chain adds up to {keys} keys and {items} items, "
                            f"its header says {info.keys} and {info.items}")
    return state


def _checked(path: Path, info: SnapshotInfo, expected: str) -> None:
    if expected != info.sha256:
        raise SnapshotError(f"snapshot {path} is corrupted: its checksum does not match")


def _opened(path: Path) -> tuple[SnapshotInfo, dict[str, Any], bytes, int]:
    """The header, its fields, the file's bytes and the body's offset of the snapshot at ``path``, once its magic,
    header and size are right (the checksum is the reader's to check: what it covers depends on the format)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"snapshot {path} cannot be read: {exc}") from exc
    info, fields, start = _header(path, data)
    body = len(data) - start
    if body < info.body_bytes:
        raise SnapshotError(f"snapshot {path} is truncated: {body} of {info.body_bytes} body bytes")
    if body > info.body_bytes:
        raise SnapshotError(f"snapshot {path} is corrupted: {body - info.body_bytes} bytes after its "
                            f"{info.body_bytes}-byte body")
    return info, fields, data, start


HEADER_LIMIT = 4096
"""Bytes a header takes at most (a few hundred, all told): what ``read_snapshot_header`` reads."""


def read_snapshot_header(path: Path) -> SnapshotInfo:
    """The header of the snapshot at ``path``, without reading (or checking) its body: for retention, which needs
    each kept file's ``base``.  SnapshotError if the file cannot be read or its header is damaged."""
    try:
        with path.open("rb") as file:
            head = file.read(HEADER_LIMIT)
    except OSError as exc:
        raise SnapshotError(f"snapshot {path} cannot be read: {exc}") from exc
    if len(head) == HEADER_LIMIT and b"\n" not in head[len(MAGIC):]:
        raise SnapshotError(f"snapshot {path} has a damaged header: longer than {HEADER_LIMIT} bytes")
    return _header(path, head)[0]


def _header(path: Path, data: bytes) -> tuple[SnapshotInfo, dict[str, Any], int]:
    """The header and its fields at the start of ``data``, the bytes of the snapshot at ``path``, and where its
    body starts."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise SnapshotError(f"snapshot {path} is truncated: {len(data)} bytes, not even its magic")
        raise SnapshotError(f"{path} is not a flamestream snapshot (bad magic)")
    header_end = data.find(b"\n", len(MAGIC))
    if header_end < 0:
        raise SnapshotError(f"snapshot {path} is truncated: {len(data)} bytes end inside its header")
    try:
        fields = json.loads(data[len(MAGIC):header_end])
        if fields["version"] not in READABLE:
            raise SnapshotError(f"snapshot {path} has format version {fields['version']}; this build reads "
                                f"{', '.join(map(str, READABLE))}")
        base = fields.get("base")
        info = SnapshotInfo(boundary=GlobalTime(*map(int, fields["boundary"])), worker=int(fields["worker"]),
                            tick=int(fields["tick"]), keys=int(fields["keys"]), items=int(fields["items"]),
                            body_bytes=int(fields["body_bytes"]), sha256=str(fields["sha256"]),
                            base=None if base is None else GlobalTime(*map(int, base["boundary"])))
        if base is not None and not isinstance(base["sha256"], str):  # what ``_on_base`` compares
            raise TypeError(f"a base checksum {base['sha256']!r}")
    except (KeyError, *_DAMAGE) as exc:
        raise SnapshotError(f"snapshot {path} has a damaged header: {exc!r}") from exc
    return info, fields, header_end + 1
