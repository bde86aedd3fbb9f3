"""Grouping (paper §2.5, §3): windows, optimistic replay, tombstones, trimming."""

from __future__ import annotations

import random
import weakref
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flamestream.core.front import stamp_inputs
from flamestream.core.grouping import Grouping
from flamestream.core.item import Item
from flamestream.core.meta import CHILD_BITS, MAX_TIME, GlobalTime, Trace


def mark(logical: int) -> int:
    return logical << CHILD_BITS


def item(payload: Any, ts: int, trace: Trace = (0,), front: int = 0) -> Item:
    return (payload, GlobalTime(ts, front), trace, False)


def tomb(it: Item) -> Item:
    return (it[0], it[1], it[2], True)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window must be >= 1"):
        Grouping(0)


def test_paper_example_parity_window_3() -> None:
    """§2.5: 1..8, hash = parity, window 3 -> (1),(2),(1|3),(2|4),(1|3|5),(2|4|6),(3|5|7),(4|6|8)."""
    g = Grouping(3)
    out = []
    for ts in range(1, 9):
        emitted = g.accept(ts % 2, item(ts, ts))
        assert len(emitted) == 1
        out.extend(emitted)
    assert [o[0] for o in out] == [(1,), (2,), (1, 3), (2, 4), (1, 3, 5), (2, 4, 6), (3, 5, 7), (4, 6, 8)]
    # Each tuple carries its last element's meta plus the grouping's next logical time.
    assert [(o[1], o[2], o[3]) for o in out] == [(GlobalTime(ts, 0), (0, mark(ts)), False) for ts in range(1, 9)]
    assert g.replays == 0
    assert g.held == 8


def test_paper_example_with_stamped_inputs() -> None:
    g = Grouping(3)
    out = [
        e
        for _, gt, trace, p in stamp_inputs(list(range(1, 9)), per_ms=3)
        for e in g.accept(p % 2, (p, gt, trace, False))
    ]
    assert [o[0] for o in out] == [(1,), (2,), (1, 3), (2, 4), (1, 3, 5), (2, 4, 6), (3, 5, 7), (4, 6, 8)]
    assert [o[2] for o in out] == [
        (0, mark(1)),
        (1, mark(2)),
        (2, mark(3)),
        (0, mark(4)),
        (1, mark(5)),
        (2, mark(6)),
        (0, mark(7)),
        (1, mark(8)),
    ]
    assert [o[1].ts for o in out] == [0, 0, 0, 1, 1, 1, 2, 2]


def test_window_one_emits_singletons() -> None:
    g = Grouping(1)
    assert g.accept("k", item("a", 1)) == [(("a",), GlobalTime(1, 0), (0, mark(1)), False)]
    assert g.accept("k", item("b", 3)) == [(("b",), GlobalTime(3, 0), (0, mark(2)), False)]
    # Out of order with window 1: only the newcomer's own window.
    assert g.accept("k", item("c", 2)) == [(("c",), GlobalTime(2, 0), (0, mark(3)), False)]
    assert g.replays == 0


def test_same_global_time_ordered_by_trace() -> None:
    g = Grouping(2)
    g.accept("k", item("x", 5, (1,)))
    out = g.accept("k", item("y", 5, (0,)))
    assert out == [
        (("y",), GlobalTime(5, 0), (0, mark(2)), False),
        (("x",), GlobalTime(5, 0), (1, mark(1)), True),
        (("y", "x"), GlobalTime(5, 0), (1, mark(3)), False),
    ]


def test_keys_are_independent() -> None:
    g = Grouping(2)
    assert g.accept("a", item(1, 1))[0][0] == (1,)
    assert g.accept("b", item(2, 2))[0][0] == (2,)
    assert g.accept("a", item(3, 3))[0][0] == (1, 3)
    # Out of order in bucket "b" only touches bucket "b".
    out = g.accept("b", item(0, 0))
    assert [(o[0], o[3]) for o in out] == [((0,), False), ((2,), True), ((0, 2), False)]


# -- replay and tombstones: exact outputs ----------------------------------------------

A = item("a", 1)
B = item("b", 2)
C = item("c", 3)
D = item("d", 4)


def test_replay_paper_figure_7() -> None:
    """Window 2, b arrives after c: the newcomer's window and the next one are re-emitted."""
    g = Grouping(2)
    assert g.accept("k", A) == [(("a",), A[1], (0, mark(1)), False)]
    assert g.accept("k", C) == [(("a", "c"), C[1], (0, mark(2)), False)]
    assert g.accept("k", B) == [
        (("a", "b"), B[1], (0, mark(3)), False),
        (("a", "c"), C[1], (0, mark(2)), True),
        (("b", "c"), C[1], (0, mark(4)), False),
    ]
    assert g.replays == 1


def test_replay_window_3_reemits_following_two() -> None:
    g = Grouping(3)
    for it in (B, C, D):
        g.accept("k", it)
    # emitted so far: (b)@1, (b,c)@2, (b,c,d)@3
    out = g.accept("k", A)
    assert out == [
        (("a",), A[1], (0, mark(4)), False),
        (("b",), B[1], (0, mark(1)), True),
        (("a", "b"), B[1], (0, mark(5)), False),
        (("b", "c"), C[1], (0, mark(2)), True),
        (("a", "b", "c"), C[1], (0, mark(6)), False),
    ]
    # d's window (b, c, d) does not contain a: untouched.
    assert g.replays == 2


def test_tombstone_removes_item_and_replays() -> None:
    g = Grouping(2)
    for it in (A, B, C):
        g.accept("k", it)
    # emitted: (a)@1, (a,b)@2, (b,c)@3
    out = g.accept("k", tomb(B))
    assert out == [
        (("a", "b"), B[1], (0, mark(2)), True),
        (("b", "c"), C[1], (0, mark(3)), True),
        (("a", "c"), C[1], (0, mark(4)), False),
    ]
    assert g.held == 2
    # Next in-order item sees the bucket without b.
    assert g.accept("k", D) == [(("c", "d"), D[1], (0, mark(5)), False)]


def test_tombstone_of_last_item_only_retracts() -> None:
    g = Grouping(3)
    g.accept("k", A)
    g.accept("k", B)
    assert g.accept("k", tomb(B)) == [(("a", "b"), B[1], (0, mark(2)), True)]
    assert g.accept("k", C) == [(("a", "c"), C[1], (0, mark(3)), False)]


def test_tombstone_after_replay_retracts_latest_version() -> None:
    g = Grouping(2)
    g.accept("k", A)
    g.accept("k", C)
    g.accept("k", B)  # (a,b)@3, tomb (a,c)@2, (b,c)@4
    out = g.accept("k", tomb(A))
    assert out == [
        (("a",), A[1], (0, mark(1)), True),
        (("a", "b"), B[1], (0, mark(3)), True),
        (("b",), B[1], (0, mark(5)), False),
    ]


def test_tombstone_first_cancels_the_item() -> None:
    g = Grouping(2)
    g.accept("k", A)
    assert g.accept("k", tomb(B)) == []
    assert g.accept("k", B) == []
    assert g.held == 1
    assert g.accept("k", C) == [(("a", "c"), C[1], (0, mark(2)), False)]
    # The pending tombstone was consumed: a different item with another meta is unaffected.
    assert g.accept("k", item("b2", 2, (1,))) == [
        (("a", "b2"), GlobalTime(2, 0), (1, mark(3)), False),
        (("a", "c"), C[1], (0, mark(2)), True),
        (("b2", "c"), C[1], (0, mark(4)), False),
    ]


def test_tombstone_first_in_empty_bucket() -> None:
    g = Grouping(3)
    assert g.accept("k", tomb(A)) == []
    assert g.held == 0
    assert g.accept("k", A) == []
    assert g.accept("k", B) == [(("b",), B[1], (0, mark(1)), False)]


def test_duplicate_delivery_raises() -> None:
    g = Grouping(2)
    g.accept("k", A)
    g.accept("k", B)
    with pytest.raises(ValueError, match="delivered twice"):
        g.accept("k", B)  # equal to the last item
    with pytest.raises(ValueError, match="delivered twice"):
        g.accept("k", A)  # in the middle
    g.accept("k", C)
    assert g.held == 3


def test_duplicate_with_different_payload_still_raises() -> None:
    g = Grouping(2)
    g.accept("k", A)
    with pytest.raises(ValueError, match="delivered twice"):
        g.accept("k", ("other", A[1], A[2], False))


# -- trimming -------------------------------------------------------------------------


def test_trim_keeps_window_minus_one_below_min_time() -> None:
    g = Grouping(3)
    for ts in range(10):
        g.accept("k", item(ts, ts))
    g.trim(GlobalTime(6, 0))
    bucket = g.buckets["k"]
    assert [i[1].ts for i in bucket.items] == [4, 5, 6, 7, 8, 9]
    assert [i[0] for i in bucket.items] == [4, 5, 6, 7, 8, 9]
    # An item at the min time still gets the right window and replays correctly.
    out = g.accept("k", item("x", 6, (1,)))
    assert out[0][0] == (5, 6, "x")
    g.trim(MAX_TIME)
    assert [i[0] for i in g.buckets["k"].items] == [8, 9]
    assert g.accept("k", item(10, 10)) == [((8, 9, 10), GlobalTime(10, 0), (0, mark(14)), False)]


def test_trim_frees_the_payloads_only_emitted_windows_held() -> None:
    """A bucket keeps the marks of the windows it emitted, not the windows: a payload the trim drops (a reduce's
    previous accumulator) is freed, although the window emitted at the item the trim keeps held it."""

    class Payload:  # a weak reference tells when it is freed
        pass

    g = Grouping(2)
    first, second = Payload(), Payload()
    g.accept("k", item(first, 1))
    g.accept("k", item(second, 2))
    freed = weakref.ref(first)
    del first
    g.trim(GlobalTime(3, 0))
    assert [i[0] for i in g.buckets["k"].items] == [second]
    assert freed() is None
    assert g.accept("k", item("third", 3)) == [((second, "third"), GlobalTime(3, 0), (0, mark(3)), False)]


def test_trim_window_one_forgets_everything_below() -> None:
    g = Grouping(1)
    for ts in range(5):
        g.accept(ts % 2, item(ts, ts))
    g.trim(GlobalTime(3, 0))
    assert {k: [i[0] for i in b.items] for k, b in g.buckets.items()} == {0: [4], 1: [3]}
    g.trim(MAX_TIME)
    assert g.held == 0
    assert g.buckets == {}


def test_trim_bounds_state_and_does_not_change_output() -> None:
    window, keys, n = 4, 5, 300
    trimmed, plain = Grouping(window), Grouping(window)
    out_trimmed, out_plain = [], []
    for ts in range(n):
        it = item(ts, ts)
        out_trimmed += trimmed.accept(ts % keys, it)
        out_plain += plain.accept(ts % keys, it)
        trimmed.trim(GlobalTime(ts + 1, 0))  # nothing below ts+1 is still in flight
        assert trimmed.held <= keys * (window - 1)
    assert out_trimmed == out_plain
    assert trimmed.held == keys * (window - 1)
    assert plain.held == n


def test_trim_drops_stale_pending_tombstones() -> None:
    g = Grouping(2)
    g.accept("k", tomb(A))
    g.trim(GlobalTime(1, 0))
    assert g.buckets["k"].pending == {(A[1], A[2])}
    g.trim(GlobalTime(2, 0))
    assert "k" not in g.buckets


def test_a_bucket_deleted_under_a_noted_deadline_leaves_the_keys_next_bucket_alone() -> None:
    """The deadline lists hold buckets: one deleted while listed (emptied by tombstones, its last pending one
    dropped by a trim) must not, when its deadline comes, delete the bucket its key has since."""
    g = Grouping(2)
    a, b = item("a", 1), item("b", 2)
    g.accept("k", a)
    g.accept("k", b)  # deadline noted at 2
    g.accept("k", tomb(a))
    g.accept("k", tomb(b))  # empty, the deadline still listed
    g.accept("k", tomb(item("ghost", 1, trace=(7,))))  # pending: keeps the empty bucket until a trim
    g.trim(GlobalTime(2, 0))  # drops the pending tombstone and the bucket; deadline 2 not passed yet
    assert "k" not in g.buckets
    g.accept("k", item("d", 3))
    g.accept("k", item("e", 4))
    g.trim(GlobalTime(5, 0))  # pops deadline 2 (the deleted bucket's), then 4 (the new one's)
    assert [i[0] for i in g.buckets["k"].items] == ["e"]
    assert [o[0] for o in g.accept("k", item("f", 5))] == [("e", "f")]
    assert g.held == 2



def test_an_equivalence_key_with_two_hashes_is_two_buckets_found_by_either() -> None:
    """``accept_keyed`` finds a bucket by its equivalence key alone where it can; balancing and equivalence
    functions that disagree (one word, two hashes) still make a bucket per pair, as ``accept`` of the pairs does."""
    g = Grouping(2)
    g.accept_keyed(1, "w", item("a", 1))
    g.accept_keyed(2, "w", item("b", 2))
    assert [o[0] for o in g.accept_keyed(1, "w", item("c", 3))] == [("a", "c")]
    assert [o[0] for o in g.accept_keyed(2, "w", item("d", 4))] == [("b", "d")]
    assert set(g.buckets) == {(1, "w"), (2, "w")}


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 3),
    specs=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 2), st.integers(0, 2), st.booleans()), max_size=30,
                   unique_by=lambda s: s[0]),
    lag=st.integers(0, 4),
    rnd=st.randoms(use_true_random=False),
)
def test_accept_keyed_acts_as_accept_of_the_pair(window: int, specs: list[tuple[int, int, int, bool]], lag: int,
                                                 rnd: random.Random) -> None:
    """Whatever the order, the retractions (tombstones overtaking their items too), the trims deleting buckets
    and a key's next items making it anew, and equivalence keys that come with several hashes: the same output,
    buckets and state as ``accept`` of the pairs."""
    events = [((h, e), item(ts, ts)) for ts, h, e, _ in specs]
    events += [((h, e), tomb(item(ts, ts))) for ts, h, e, retracted in specs if retracted]
    rnd.shuffle(events)
    paired, keyed = Grouping(window), Grouping(window)
    for n, ((h, e), it) in enumerate(events):
        assert keyed.accept_keyed(h, e, it) == paired.accept((h, e), it)
        floor = min((later[1][1].ts for later in events[n + 1:]), default=31)
        for g in (paired, keyed):
            g.trim(GlobalTime(max(0, floor - lag), 0))
        assert list(keyed.buckets) == list(paired.buckets)
        assert keyed.held == paired.held
    assert keyed.snapshot(MAX_TIME) == paired.snapshot(MAX_TIME)

# -- property: replay converges to the in-order run ------------------------------------


def apply(live: Counter[tuple[Any, ...]], emitted: list[Item]) -> None:
    for payload, gt, trace, tombstone in emitted:
        key = (gt, trace, payload)
        if tombstone:
            assert live[key] > 0, f"retraction of something never emitted: {key}"
            live[key] -= 1
            if not live[key]:
                del live[key]
        else:
            live[key] += 1


def survivors(live: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """(last element meta, window payload) of every emission still standing."""
    return Counter({((gt, trace[:-1]), payload): n for (gt, trace, payload), n in live.items()})


def in_order(window: int, items: list[tuple[Any, Item]]) -> Counter[tuple[Any, ...]]:
    g = Grouping(window)
    live: Counter[tuple[Any, ...]] = Counter()
    for key, it in sorted(items, key=lambda ki: (ki[1][1], ki[1][2])):
        out = g.accept(key, it)
        assert len(out) == 1 and not out[0][3]
        apply(live, out)
    return survivors(live)


metas = st.tuples(st.integers(0, 5), st.integers(0, 1), st.lists(st.integers(0, 2), min_size=1, max_size=2))


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 4),
    specs=st.lists(
        st.tuples(metas, st.integers(0, 2)), max_size=25, unique_by=lambda s: (s[0][0], s[0][1], tuple(s[0][2]))
    ),
    rnd=st.randoms(use_true_random=False),
)
def test_any_arrival_order_converges_to_in_order_windows(
    window: int, specs: list[tuple[tuple[int, int, list[int]], int]], rnd: random.Random
) -> None:
    items = [
        (key, (f"p{i}", GlobalTime(ts, front), tuple(trace), False))
        for i, ((ts, front, trace), key) in enumerate(specs)
    ]
    shuffled = list(items)
    rnd.shuffle(shuffled)
    g = Grouping(window)
    live: Counter[tuple[Any, ...]] = Counter()
    for key, it in shuffled:
        apply(live, g.accept(key, it))
    assert all(n == 1 for n in live.values())
    assert survivors(live) == in_order(window, items)


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 4),
    specs=st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 2), st.booleans()), max_size=25, unique_by=lambda s: s[0]
    ),
    rnd=st.randoms(use_true_random=False),
)
def test_retractions_in_any_order_converge_to_in_order_windows_of_survivors(
    window: int, specs: list[tuple[int, int, bool]], rnd: random.Random
) -> None:
    """Some items are retracted; tombstones may even overtake their item."""
    items = [(key, item(f"p{ts}", ts)) for ts, key, _ in specs]
    events = list(items) + [(key, tomb(item(f"p{ts}", ts))) for ts, key, retracted in specs if retracted]
    rnd.shuffle(events)
    g = Grouping(window)
    live: Counter[tuple[Any, ...]] = Counter()
    for key, it in events:
        apply(live, g.accept(key, it))
    kept = [(key, item(f"p{ts}", ts)) for ts, key, retracted in specs if not retracted]
    assert survivors(live) == in_order(window, kept)
    assert g.held == len(kept)
    assert all(b.pending in (None, set()) for b in g.buckets.values())


@settings(max_examples=100, deadline=None)
@given(
    window=st.integers(1, 4),
    order=st.permutations(list(range(20))),
    lag=st.integers(0, 5),
)
def test_trim_with_bounded_disorder_keeps_results(window: int, order: list[int], lag: int) -> None:
    """Trimming at a min time below everything still to come never changes what survives."""
    items = [(ts % 3, item(ts, ts)) for ts in range(20)]
    g = Grouping(window)
    live: Counter[tuple[Any, ...]] = Counter()
    for n, ts in enumerate(order):
        apply(live, g.accept(*items[ts]))
        still_to_come = order[n + 1 :]
        floor = min(still_to_come, default=20)
        g.trim(GlobalTime(max(0, floor - lag), 0))
        for b in g.buckets.values():
            below = sum(1 for i in b.items if i[1].ts < max(0, floor - lag))
            assert below <= window - 1
    assert survivors(live) == in_order(window, items)


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 4),
    keys=st.integers(1, 4),
    retracted=st.sets(st.integers(0, 23)),
    every=st.integers(1, 6),
    lag=st.integers(0, 4),
    rnd=st.randoms(use_true_random=False),
)
def test_snapshot_changes_add_up_to_the_whole_snapshot(window: int, keys: int, retracted: set[int], every: int,
                                                        lag: int, rnd: random.Random) -> None:
    """Applying each ``snapshot_changes`` report to the previous state gives exactly ``snapshot`` at every
    boundary: with disorder, retractions (tombstones overtaking their items too) and trimming in between."""
    events = [(ts % keys, item(ts, ts)) for ts in range(24)] + [(ts % keys, tomb(item(ts, ts))) for ts in retracted]
    rnd.shuffle(events)
    g = Grouping(window)
    image: dict[Any, Any] = {}
    trimmed = 0
    for n, (key, it) in enumerate(events):
        g.accept(key, it)
        floor = min((e[1][1].ts for e in events[n + 1:]), default=24)  # nothing below it is still to come
        at = max(trimmed, floor - lag)
        if n % every == 0:
            for changed, entries in g.snapshot_changes(GlobalTime(at, 0)):
                if entries:
                    image[changed] = entries
                else:
                    image.pop(changed, None)
            assert image == dict(g.snapshot(GlobalTime(at, 0)))
        g.trim(GlobalTime(at, 0))
        trimmed = at


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(2, 4),
    keys=st.integers(1, 5),
    later=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 9)), max_size=12),
    rnd=st.randoms(use_true_random=False),
)
def test_a_grouping_restored_lazily_acts_as_one_restored_whole(window: int, keys: int,
                                                               later: list[tuple[int, int]],
                                                               rnd: random.Random) -> None:
    """``restore_lazily``: the same emissions, changes and snapshot as ``restore`` of the same entries, after
    items in any order (tombstones included); a key's entries are decoded only once an item reaches it (or the
    whole snapshot is taken), and once."""
    source = Grouping(window)
    for ts in range(10):
        source.accept(ts % keys, item(ts, ts))
    boundary = GlobalTime(10, 0)
    restored = source.snapshot(boundary)
    whole, lazy = Grouping(window), Grouping(window)
    thawed: list[Any] = []

    def thaw(key: Any, entries: Any) -> Any:
        def decoded() -> Any:
            thawed.append(key)
            return entries
        return decoded

    for key, entries in restored:
        whole.restore(key, entries)
        lazy.restore_lazily(key, thaw(key, entries))
    whole.snapshot_changes(boundary)  # what a worker's image takes at once; the lazy one's image holds it already
    assert lazy.snapshot_changes(boundary) == []
    events = [(key, item(f"{key}@{ts}", 10 + ts, (n,))) for n, (key, ts) in enumerate(later)]
    events += [(key, tomb(it)) for key, it in events if rnd.random() < 0.3]
    rnd.shuffle(events)
    reached: set[Any] = set()
    for key, it in events:
        assert lazy.accept(key, it) == whole.accept(key, it)
        reached.add(key)
    assert sorted(thawed) == sorted(reached & {key for key, _ in restored})
    end = GlobalTime(20, 0)
    assert lazy.snapshot_changes(end) == whole.snapshot_changes(end)
    assert dict(lazy.snapshot(end)) == dict(whole.snapshot(end))
    assert sorted(thawed) == sorted(key for key, _ in restored)
    with pytest.raises(ValueError, match="restored twice"):
        lazy.restore_lazily(restored[0][0], thaw(None, []))


def test_a_restored_bucket_that_cannot_be_decoded_stops_its_worker_and_is_no_items_dead_letter() -> None:
    """A thaw that fails raises ``StateError`` every time the key is reached, holding no bucket for it meanwhile;
    ``Worker.run`` lets it through rather than dead-letter the item (and every later one of the key) on a state
    it does not have."""
    from examples import wordcount
    from flamestream.core.grouping import StateError
    from flamestream.core.plan import compile_graph
    from flamestream.core.tick import Layout
    from flamestream.core.worker import Worker, front_envelopes

    def broken() -> Any:
        raise ValueError("not an encoded value")

    g = Grouping(2)
    g.restore_lazily("k", broken)
    for _ in range(2):
        with pytest.raises(StateError, match="restored bucket 'k' cannot be decoded: not an encoded value"):
            g.accept("k", item(1, 5))
    assert g.buckets == {}

    plan, layout = compile_graph(wordcount.graph()), Layout.even(1)
    lines = [(line, GlobalTime(ts, 0)) for ts, line in enumerate(["a b", "b c"], 1)]

    def envelopes(n: int) -> Any:
        line, gt = lines[n]
        return front_envelopes(plan, layout, [(plan.entry_balance(line), (line, gt, (), False))])[0]

    first = Worker(plan, 0, layout)
    first.process(envelopes(0))
    taken = Worker(plan, 0, layout)
    for name, buckets in first.snapshot(GlobalTime(2, 0)).items():
        for h, key, _entries in buckets:
            assert taken.restore_lazily(name, h, key, broken)
    with pytest.raises(StateError):
        taken.process(envelopes(1))
