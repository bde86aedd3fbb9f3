"""Snapshot files and the value codec under them: exact round trips, and damage detected, never loaded."""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import inverted_index
from flamestream.core import values
from flamestream.core.front import stamp_inputs
from flamestream.core.grouping import Entries
from flamestream.core.local import Handover, LocalRuntime
from flamestream.core.meta import GlobalTime
from flamestream.core.worker import WorkerState
from flamestream.storage import snapshots
from flamestream.storage.snapshots import (
    VERSION,
    SnapshotError,
    SnapshotImage,
    read_snapshot,
    read_snapshot_frozen,
    snapshot_path,
    write_snapshot,
)
from flamestream.workers import pacing
from flamestream.workers.service import MAX_SNAPSHOT_STRIDE, snapshot_stride

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**70),
                    st.floats(allow_nan=False), st.text(), st.binary(max_size=20))
hashables = st.recursive(scalars, lambda inner: st.one_of(st.tuples(inner, inner), st.frozensets(inner, max_size=3)),
                         max_leaves=6)
value_st = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3),
                            st.dictionaries(hashables, inner, max_size=3), st.sets(hashables, max_size=3),
                            st.frozensets(hashables, max_size=3)),
    max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal *and* of the same types all the way down (1 == 1.0 == True would hide a lossy codec)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(value=value_st)
def test_values_round_trip_exactly(value: Any) -> None:
    assert same(values.decode(values.encode(value)), value)


def test_special_floats_and_refused_types() -> None:
    decoded = values.decode(values.encode([math.nan, math.inf, -math.inf, -0.0]))
    assert math.isnan(decoded[0]) and decoded[1:] == [math.inf, -math.inf, 0.0]
    with pytest.raises(ValueError, match="type object cannot be encoded"):
        values.encode({"x": object()})


class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch /tmp/flamestream-pwned",))


@pytest.mark.parametrize("data", [b"", b"{", b"\x80\x05junk", b"\xff\xfe", pickle.dumps(Boom()),
                                  pickle.dumps(GlobalTime(1, 2)), pickle.dumps({1: object}),
                                  values.encode([1, 2, 3])[:-3], b"(" * 5000 + b"."])
def test_bytes_it_did_not_write_raise_value_error_only_and_never_run_code(data: bytes) -> None:
    with pytest.raises(ValueError, match="not an encoded value"):
        values.decode(data)
    assert not Path("/tmp/flamestream-pwned").exists()


def test_values_of_other_types_are_refused_when_written() -> None:
    for value in (GlobalTime(1, 2), {"k": Path("/")}, [complex(1, 2)], Boom()):
        with pytest.raises(ValueError, match="cannot be encoded"):
            values.encode(value)


@settings(max_examples=200, deadline=None)
@given(head=value_st, items=st.lists(value_st, max_size=12))
def test_fragments_joined_decode_as_the_pair_they_make(head: Any, items: list[Any]) -> None:
    """``encode_pair`` of ``fragments`` decodes exactly as ``encode([head, items])``, and each fragment alone as its
    value: whatever values come together in one chunk, each is cut out exactly."""
    codes = values.fragments([head, *items])
    if None not in codes:
        joined = values.encode_pair(codes[0], codes[1:])  # type: ignore[arg-type]
        assert same(values.decode(joined), [head, items])
        assert joined[2:3] == pickle.FRAME and int.from_bytes(joined[3:11], "little") == len(joined) - 11  # one frame
    for value, code in zip([head, *items], codes, strict=True):
        if code is not None:
            assert same(values.decode(values.encode_pair(code, [])), [value, []])


def test_values_without_a_fragment_and_the_ones_after_them() -> None:
    """Not plain, cyclic, shared past the fast limit, more than one frame, or holding the separator that cuts a
    chunk apart (a key could, were it not random): no fragment, and the values beside it
    still get theirs (the chunk is tried again in halves); more values than one chunk holds all get one."""
    cycle: list[Any] = [1]
    cycle.append(cycle)
    dag: list[Any] = [0]
    for _ in range(40):
        dag = [dag, dag]
    odd = [object(), cycle, dag, "x" * 70_000, ("y" * 40_000, b"z" * 30_000), ("key", values._SEPARATOR)]
    codes = values.fragments([("a", 1), *odd, ("b", 2)])
    assert codes[1:-1] == [None] * len(odd)
    assert values.decode(values.encode_pair(codes[0], [codes[-1]])) == [("a", 1), [("b", 2)]]  # type: ignore[arg-type]
    rows = [(i, (i, f"w{i}"), 1, 40) for i in range(10_000)]
    codes = values.fragments(rows)
    assert values.decode(values.encode_pair(values.fragments(["g"])[0], codes)) == ["g", rows]  # type: ignore[arg-type]


def test_the_separator_never_overlaps_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A separator whose encoding ended as it began could share bytes with the end of a value written before it,
    and the chunk would be cut one byte early with the right count of pieces: such a draw is drawn again."""
    draws = iter([b"\x00" * 15 + b"C", b"\x00" * 14 + b"C\x10", bytes(range(1, 17))])  # each ends as it begins
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    assert values._border_free_cut()[2:] == bytes(range(1, 17))
    cut = values._CUT
    assert all(cut[:k] != cut[-k:] for k in range(1, len(cut)))


def test_an_index_with_a_row_too_large_for_a_fragment_is_encoded_whole(tmp_path: Path) -> None:
    """A key of 70 kB has no encoded row (``fragments``): the grouping's index is then encoded whole, and the file
    reads back as the state, again after a bucket of another key changed."""
    at = GlobalTime(5, 0)
    big = "k" * 70_000
    entries: Entries = [((GlobalTime(3, 0), (0, 1)), ("payload", 1))]
    image = SnapshotImage()
    image.update({"g": [(1, (1, big), entries), (2, (2, "small"), entries)]})
    path = snapshot_path(tmp_path, at, 0)
    image.write(path, boundary=at, worker=0, tick=1)
    assert by_key(read_snapshot(path)[1]) == {"g": {(1, big): (1, entries), (2, "small"): (2, entries)}}
    later: Entries = [((GlobalTime(4, 0), (0, 1)), ("payload", 2))]
    image.update({"g": [(2, (2, "small"), later)]})
    image.write(path, boundary=at, worker=0, tick=1)
    info, back = read_snapshot(path)
    assert by_key(back) == {"g": {(1, big): (1, entries), (2, "small"): (2, later)}} and info.items == 2


def handover_state() -> tuple[GlobalTime, WorkerState]:
    """A real grouping state: the inverted index's, carried by a hand-over after 6 pages."""
    pages = [{"id": str(i), "title": f"p{i}", "text": f"мяч {i % 3} goal {i % 2} the"} for i in range(10)]
    stamped = stamp_inputs(pages, 1, 1)
    result = LocalRuntime(inverted_index.graph(), workers=2,
                          handovers=[Handover(stamped[6][1], workers=3)]).run_stamped(stamped)
    ((at, state),) = result.handed_over
    assert any(state.values()), "the example must carry state"
    return at, state


def test_a_snapshot_file_round_trips_a_workers_state(tmp_path: Path) -> None:
    at, state = handover_state()
    path = snapshot_path(tmp_path, at, 0)
    written = write_snapshot(path, state, boundary=at, worker=0, tick=3)
    info, back = read_snapshot(path)
    assert info == written and info.boundary == at and info.tick == 3
    assert back == state
    assert all(type(gt) is GlobalTime for buckets in back.values() for _h, _k, entries in buckets
               for (gt, _trace), _p in entries)
    assert not list(path.parent.glob("*.tmp"))


def by_key(state: WorkerState) -> dict[str, dict[Any, tuple[int, Any]]]:
    return {name: {key: (h, entries) for h, key, entries in buckets} for name, buckets in state.items()}


def test_an_image_updated_with_changes_writes_the_state_they_add_up_to(tmp_path: Path) -> None:
    """``SnapshotImage``: a first report (the whole state), then one that changes a bucket, removes one (no
    entries), adds one and names a grouping without buckets; the file holds exactly the resulting state."""
    at, state = handover_state()
    name = next(n for n, buckets in state.items() if len(buckets) >= 2)
    (h0, k0, _e0), (h1, k1, e1) = state[name][:2]
    changes: WorkerState = {name: [(h0, k0, e1), (h1, k1, []), (7, ("new", 1), e1)], "empty": []}
    image = SnapshotImage()
    image.update(state)
    image.update(changes)
    path = snapshot_path(tmp_path, at, 1)
    written = image.write(path, boundary=at, worker=1, tick=4)
    info, back = read_snapshot(path)
    want = by_key(state)
    want[name][k0] = (h0, e1)
    del want[name][k1]
    want[name][("new", 1)] = (7, e1)
    want["empty"] = {}
    assert by_key(back) == want
    assert info == written and info.keys == sum(map(len, want.values()))
    assert info.items == sum(len(entries) for buckets in want.values() for _h, entries in buckets.values())


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "version"])
def test_damage_is_detected_and_named(tmp_path: Path, damage: str) -> None:
    at, state = handover_state()
    path = snapshot_path(tmp_path, at, 1)
    write_snapshot(path, state, boundary=at, worker=1, tick=0)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[-10:]
    elif damage == "flip":
        data[-5] ^= 0x20
    elif damage == "magic":
        data[0:4] = b"junk"
    else:
        data = bytearray(bytes(data).replace(b'"version": %d' % VERSION, b'"version": 9', 1))
    path.write_bytes(bytes(data))
    expected = {"truncate": "truncated", "flip": "corrupted", "magic": "not a flamestream snapshot",
                "version": "format version 9"}[damage]
    with pytest.raises(SnapshotError, match=expected) as info:
        read_snapshot(path)
    assert str(path) in str(info.value)


def test_every_truncation_is_detected_with_a_clear_error(tmp_path: Path) -> None:
    """A torn file — cut anywhere: in the magic, the header or the body — is refused, saying it is truncated."""
    at, state = handover_state()
    path = snapshot_path(tmp_path, at, 0)
    write_snapshot(path, state, boundary=at, worker=0, tick=1)
    whole = path.read_bytes()
    for size in sorted({0, 1, 10, 21, 22, 40, len(whole) // 2, len(whole) - 1} | set(range(0, len(whole), 97))):
        path.write_bytes(whole[:size])
        with pytest.raises(SnapshotError, match=r"is truncated: ") as info:
            read_snapshot(path)
        assert str(path) in str(info.value), size


def test_every_flipped_byte_is_detected_header_included(tmp_path: Path) -> None:
    """A byte changed anywhere — the magic, any header field (boundary, worker, tick, sizes, checksum), the
    body — never loads: the checksum covers the header's fields too, so a flipped digit cannot pass for another
    boundary or worker.  (A change that leaves the header's JSON meaning the same, such as one whitespace
    character for another, loads the same snapshot, which is harmless.)"""
    at, state = handover_state()
    path = snapshot_path(tmp_path, at, 2)
    written = write_snapshot(path, state, boundary=at, worker=2, tick=5)
    whole = path.read_bytes()
    header_end = whole.index(b"\n", 21)
    positions = list(range(0, header_end + 1)) + list(range(header_end + 1, len(whole), max(1, len(whole) // 200)))
    for position in positions:
        for mask in (0x01, 0x20, 0xFF):
            damaged = bytearray(whole)
            damaged[position] ^= mask
            path.write_bytes(bytes(damaged))
            try:
                info, back = read_snapshot(path)
            except SnapshotError as exc:
                assert str(path) in str(exc)
                continue
            assert (info, back) == (written, state), f"byte {position} ^ {mask:#x} loaded as something else"


def thawed(frozen: dict[str, list[Any]]) -> WorkerState:
    return {name: [(b.h, b.key, b.entries()) for b in buckets] for name, buckets in frozen.items()}


def test_a_file_read_frozen_holds_the_same_state_and_its_buckets_write_back_the_same_bytes(tmp_path: Path) -> None:
    """``read_snapshot_frozen``: every bucket's key and hash without its entries decoded, the entries decoded on
    demand equal to ``read_snapshot``'s, and an image of the adopted buckets writes the very same file."""
    at, state = handover_state()
    path = snapshot_path(tmp_path, at, 0)
    written = write_snapshot(path, state, boundary=at, worker=0, tick=2)
    info, frozen = read_snapshot_frozen(path)
    assert info == written and thawed(frozen) == state
    image = SnapshotImage()
    for name, buckets in frozen.items():
        for bucket in buckets:
            image.adopt(name, bucket)
    again = snapshot_path(tmp_path, at, 1)
    image.write(again, boundary=at, worker=0, tick=2)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_file_of_an_older_format_still_reads(tmp_path: Path, version: int) -> None:
    """Formats 1 and 2 held chunks of whole buckets, format 1 checksummed the body only; format 3 held each
    grouping's index and then its buckets' entries, checksummed as bytes.  Files written by those builds still
    load, whole or frozen (a hand-over across an upgrade), and are still refused when their body is damaged."""
    import hashlib
    import json

    at, state = handover_state()
    chunks = []
    for name, buckets in state.items():
        plain = [[[gt.ts, gt.front, list(trace), payload] for (gt, trace), payload in entries]
                 for _h, _key, entries in buckets]
        if version == 3:  # an index, then the entries
            encoded = [values.encode(entries) for entries in plain]
            rows = [[h, key, len(entries), len(body)]
                    for (h, key, entries), body in zip(buckets, encoded, strict=True)]
            chunks += [values.encode([name, rows]), *encoded]
        else:  # a grouping, then a chunk of one bucket each
            chunks.append(values.encode([name]))
            chunks += [values.encode([name, [[h, key, entries]]])
                       for (h, key, _entries), entries in zip(buckets, plain, strict=True)]
    body = b"".join(chunks)
    fields: dict[str, Any] = {"version": version, "boundary": list(at), "worker": 0, "tick": 1,
                              "keys": sum(map(len, state.values())),
                              "items": sum(len(e) for buckets in state.values() for _h, _k, e in buckets),
                              "body_bytes": len(body)}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    fields["sha256"] = hashlib.sha256(body if version == 1 else canonical + body).hexdigest()
    path = snapshot_path(tmp_path, at, 0)
    path.parent.mkdir(parents=True)
    header = b"flamestream-snapshot\n" + json.dumps(fields).encode() + b"\n"
    path.write_bytes(header + body)
    assert read_snapshot(path)[1] == state
    assert thawed(read_snapshot_frozen(path)[1]) == state
    path.write_bytes(header + body[:-1] + bytes([body[-1] ^ 1]))
    with pytest.raises(SnapshotError, match="corrupted"):
        read_snapshot(path)


def test_chunks_written_one_after_another_decode_in_order() -> None:
    shared = (1, "x")
    parts = [pickle.dumps([shared, {shared: [shared]}], pickle.HIGHEST_PROTOCOL) for _ in range(3)]  # memo refs
    assert values.decode_all(b"".join(parts)) == [[shared, {shared: [shared]}]] * 3
    each = list(values.encode_each([[shared, {shared: [shared]}], shared, "y"]))  # one pickler
    assert [values.decode(part) for part in each] == [[shared, {shared: [shared]}], shared, "y"]
    assert values.decode_all(b"".join(each[1:] + each[:1])) == [shared, "y", [shared, {shared: [shared]}]]
    with pytest.raises(ValueError, match="2 values"):
        values.decode(b"".join(parts[:2]))


def test_a_value_whose_parts_are_shared_many_times_over_is_written_once_per_part() -> None:
    """Without the memo, ``a = [a, a]`` sixty times over is 2**60 paths: the encoder must notice it spilling and
    write it with the memo, in a few hundred bytes, sharing kept."""
    dag: list[Any] = [0]
    for _ in range(60):
        dag = [dag, dag]
    encoded = values.encode(dag)
    assert len(encoded) < 2000
    level = values.decode(encoded)
    for _ in range(60):
        assert len(level) == 2 and level[0] is level[1]
        level = level[0]
    assert level == [0]
    cycle: list[Any] = [1]
    cycle.append(cycle)
    back = values.decode(values.encode(cycle))
    assert back[0] == 1 and back[1] is back


def test_a_value_of_many_frozensets_is_written_with_the_memo() -> None:
    """The C pickler's fast mode never counts a frozenset out of its nesting depth: from about fifty of them in
    one value it raised KeyError on the next container it left (a hypothesis example of a batch's payloads)."""
    value = [[frozenset({i}) for i in range(60)], [frozenset()], {"after": frozenset({"x"})}]
    assert values.decode(values.encode(value)) == value
    assert values.decode_all(b"".join(values.encode_each([value, ["next"]]))) == [value, ["next"]]


def test_a_value_past_the_fast_limit_is_written_again_with_the_memo_and_the_next_ones_are_not_harmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    big = [f"word{i}" for i in range(1000)]
    monkeypatch.setattr(values, "FAST_LIMIT", 500)
    parts = list(values.encode_each([["small"], big, ("after", 1), {"x": big[:3]}]))
    assert values.decode_all(b"".join(parts)) == [["small"], big, ("after", 1), {"x": big[:3]}]
    with pytest.raises(ValueError, match="type object cannot be encoded"):
        values.encode([object()] + big)  # not plain: refused on the memo path too


def test_the_snapshot_stride_keeps_snapshots_within_their_cpu_share() -> None:
    """The smallest power of two of intervals whose share covers the last snapshot's CPU, capped: strides that
    differ between workers still meet (every even boundary is a boundary), and a recovery never replays more than
    ``MAX_SNAPSHOT_STRIDE`` intervals past the last complete snapshot."""
    assert MAX_SNAPSHOT_STRIDE == 2
    assert [snapshot_stride(cpu, 1.0, 0.1, 1) for cpu in (0.0, 0.1, 0.10001, 0.2, 0.3, 5.0)] == [1, 1, 2, 2, 2, 2]
    assert snapshot_stride(0.3, 0.5, 0.5, 1) == 2  # the interval and the share count alike
    assert snapshot_stride(0.3, 1.0, 0.5, 1) == 1
    # Lowered only where twice the cost fits, so a cost near a step does not flip the stride at every snapshot.
    assert [snapshot_stride(cpu, 1.0, 0.1, 2) for cpu in (0.39, 0.09, 0.05, 0.04, 0.0)] == [2, 2, 1, 1, 1]
    # ``--snapshot-max-stride`` 4: a cheaper cap for a cluster that values steady latency over recovery time.
    assert [snapshot_stride(cpu, 1.0, 0.1, 1, 4) for cpu in (0.1, 0.2, 0.3, 5.0)] == [1, 2, 4, 4]
    assert [snapshot_stride(cpu, 1.0, 0.1, 4, 4) for cpu in (0.39, 0.15, 0.09, 0.04)] == [4, 4, 2, 1]


@pytest.mark.parametrize("splice_above", [0, snapshots.SPLICE_ABOVE])
@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=25))
def test_an_image_through_any_sequence_of_changes_writes_exactly_the_state(
        tmp_path_factory: pytest.TempPathFactory, splice_above: int, steps: list[tuple[int, int, int]]) -> None:
    """Random reports on two keys — a new version sharing all shards but one with the last, that shard grown or
    emptied; the last two versions (untrimmed) or one; a removal — and after each, the written file reads back as
    the state the reports add up to.  With ``SPLICE_ABOVE`` 0 every bucket that changes is spliced (these are too
    small for it otherwise), and the shards a version shares with the one before are copied."""
    default, snapshots.SPLICE_ABOVE = snapshots.SPLICE_ABOVE, splice_above
    try:
        _image_through(tmp_path_factory.mktemp("image") / "worker-0.snap", steps, splice_above == 0)
    finally:
        snapshots.SPLICE_ABOVE = default


def _image_through(path: Path, steps: list[tuple[int, int, int]], spliced: bool) -> None:
    image = SnapshotImage()
    shared = False
    recorded: set[int] = set()
    """Keys whose last encoding was spliced (the bucket existed before it), which recorded where its shards are."""
    shards: dict[int, list[dict[str, tuple[int, ...]]]] = {}
    last: dict[int, Any] = {}
    state: dict[Any, tuple[int, Entries]] = {}
    for n, (key, action, grow) in enumerate(steps):
        at = GlobalTime(100 + n, 0)
        if action == 0:
            entries: Entries = []
            shards.pop(key, None)
            last.pop(key, None)
        else:
            mine = shards.setdefault(key, [{} for _ in range(4)])
            changed = {} if action == 3 else dict(mine[grow % 4])
            changed.update({f"page{n}-{i}": (n, i) for i in range(grow)})
            mine[grow % 4] = changed
            version = ((at, (n,)), ("index", f"w{key}", tuple(mine), ("posting", f"w{key}", f"page{n}", (n,))))
            shared = shared or key in recorded  # the first shards of its last encoding are these, unchanged
            entries = [last[key], version] if action == 1 and key in last else [version]
            last[key] = version
        image.update({"g": [(key, (key, f"w{key}"), entries)]})
        if entries and (key, f"w{key}") in state:
            recorded.add(key)
        else:
            recorded.discard(key)
        if entries:
            state[(key, f"w{key}")] = (key, entries)
        else:
            state.pop((key, f"w{key}"), None)
        image.write(path, boundary=at, worker=0, tick=1)
        info, back = read_snapshot(path)
        assert by_key(back) == {"g": state}
        assert (info.keys, info.items) == (len(state), sum(len(entries) for _h, entries in state.values()))
    assert (image.copied > 0) == (spliced and shared)


def test_a_large_bucket_that_cannot_be_spliced_is_encoded_whole(tmp_path: Path) -> None:
    """A bucket past ``SPLICE_ABOVE`` whose part is larger than a frame cannot be spliced: the image encodes it
    whole, and the file reads back as the state."""
    at = GlobalTime(6, 0)
    second: Entries = [((at, (1,)), ("page", {"text": "y" * 70_000}))]
    image = SnapshotImage()
    image.update({"g": [(1, "k", [((GlobalTime(5, 0), (1,)), ("page", {"text": "x" * 70_000}))])]})
    image.update({"g": [(1, "k", second)]})
    path = snapshot_path(tmp_path, at, 0)
    image.write(path, boundary=at, worker=0, tick=1)
    assert by_key(read_snapshot(path)[1]) == {"g": {"k": (1, second)}}
    assert image.copied == 0


def test_a_paced_image_update_in_slices_writes_what_one_update_writes(tmp_path: Path) -> None:
    """``pacing``: the changes applied slice by slice, a little CPU at a time (none here: every call stops after
    its first slice), write the same file as one ``update``, groupings named without buckets included."""
    at, state = handover_state()
    name = next(n for n, buckets in state.items() if len(buckets) >= 2)
    (h0, k0, _e0), (h1, k1, e1) = state[name][:2]
    changes: WorkerState = {name: [(h0, k0, e1), (h1, k1, []), (7, ("new", 1), e1)], "empty": []}
    whole, paced = SnapshotImage(), SnapshotImage()
    whole.update(state)
    whole.update(changes)
    paced.update(state)
    parts = pacing.slices(changes, size=1)
    calls = 0
    while True:
        calls += 1
        done, cpu = pacing.encode_slices(paced, parts, cpu=0.0)
        assert cpu >= 0.0
        if done:
            break
    assert calls == 1 + 3 + 1  # the groupings' names, a bucket each, and the call that finds nothing left
    one, sliced = snapshot_path(tmp_path / "one", at, 0), snapshot_path(tmp_path / "sliced", at, 0)
    assert whole.write(one, boundary=at, worker=0, tick=1) == paced.write(sliced, boundary=at, worker=0, tick=1)
    assert one.read_bytes() == sliced.read_bytes()
    assert list(pacing.slices({"a": [], "b": []})) == [{"a": [], "b": []}]
    first, *rest = pacing.slices(state, size=2)  # every bucket once, in order, at most two a part
    assert first == {n: [] for n in state} and all(len(p) == 1 and len(*p.values()) <= 2 for p in rest)
    rebuilt: WorkerState = {n: [] for n in state}
    for part in rest:
        for n, buckets in part.items():
            rebuilt[n] += buckets
    assert rebuilt == state


def test_a_pause_is_a_multiple_of_the_slice_until_the_deadline() -> None:
    """After a slice of CPU the writer pauses ``PAUSE_FACTOR`` times as long, but never past its deadline: a
    snapshot late in its budget goes on unpaced."""
    assert pacing.pause(0.004, now=10.0, deadline=11.0) == pytest.approx(0.004 * pacing.PAUSE_FACTOR)
    assert pacing.pause(0.004, now=10.0, deadline=10.01) == pytest.approx(0.01)
    assert pacing.pause(0.004, now=10.0, deadline=9.0) == 0.0
    assert pacing.pause(0.0, now=10.0, deadline=11.0) == 0.0
