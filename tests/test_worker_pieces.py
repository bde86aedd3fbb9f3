"""Worker.run hands its outbox over in pieces: same output as one piece, but remote work leaves first."""

from __future__ import annotations

from itertools import islice

import pytest

from examples import inverted_index
from flamestream.bench.workloads import CORPUS
from flamestream.core.front import stamp_inputs
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import EAGER_FANOUT, Outbox, Worker, front_envelopes

PLAN = compile_graph(inverted_index.graph())
LAYOUT = Layout.even(2)


def page_steps(count: int) -> list[tuple[int, list]]:
    """(owner worker, envelopes) of the first ``count`` corpus pages, one step each."""
    pages = list(islice(inverted_index.read_input(str(CORPUS)), count))
    inputs = [(inverted_index.page_hash(p), (p, gt, trace, False)) for _f, gt, trace, p in stamp_inputs(pages)]
    return [next(iter(front_envelopes(PLAN, LAYOUT, [one]).items())) for one in inputs]


def merged(pieces: list[Outbox]) -> Outbox:
    remote: dict[int, list] = {}
    barrier: list = []
    for piece_remote, piece_barrier in pieces:
        for worker, envelopes in piece_remote.items():
            remote.setdefault(worker, []).extend(envelopes)
        barrier.extend(piece_barrier)
    return remote, barrier


@pytest.mark.parametrize("flush", [1, 7, 64, 256])
def test_pieces_add_up_to_the_whole_step(flush: int) -> None:
    whole = [Worker(PLAN, i, LAYOUT) for i in range(2)]
    pieced = [Worker(PLAN, i, LAYOUT) for i in range(2)]
    for owner, envelopes in page_steps(12):
        pieces = list(pieced[owner].run(envelopes, flush))
        # A piece ends with ``flush`` items pending, or after a fan-out of EAGER_FANOUT to other workers.
        assert all(sum(map(len, r.values())) + len(b) >= min(flush, EAGER_FANOUT) for r, b in pieces[:-1])
        assert merged(pieces) == whole[owner].process(envelopes)


def test_a_page_ships_remote_postings_while_working_through_its_own() -> None:
    """A page's postings are routed as its diff emits them, all at once, so the other worker's leave in the
    first piece, before the owner works through its own (depth-first, in meta order, 64 records a piece)."""
    owner, envelopes = max(page_steps(12), key=lambda step: len(inverted_index.positions(step[1][0][2][0])))
    pieces = list(Worker(PLAN, owner, LAYOUT).run(envelopes, 64))
    remote, barrier = merged(pieces)
    first_remote, first_barrier = pieces[0]
    assert len(barrier) > 1000 and len(remote[1 - owner]) > 1000
    assert first_remote == remote and len(first_barrier) < 64  # the other worker starts before the owner does
    assert sum(1 for _, b in pieces if b) > 10


def test_a_median_page_ships_its_remote_postings_before_the_owner_starts_on_its_own() -> None:
    """Fewer postings than ``flush``, but a fan-out of more than EAGER_FANOUT to the other worker: they leave at
    once, in a piece of their own, and the owner's own postings follow in the next."""
    steps = [step for step in page_steps(30)
             if 2 * EAGER_FANOUT < len(inverted_index.positions(step[1][0][2][0])) < 200]
    assert steps
    for owner, envelopes in steps:
        pieces = list(Worker(PLAN, owner, LAYOUT).run(envelopes, 256))
        remote, barrier = merged(pieces)
        assert len(pieces) == 2 and len(remote[1 - owner]) >= EAGER_FANOUT
        assert pieces[0] == (remote, [])  # the first piece: everything for the other worker, nothing of the owner's
        assert pieces[1] == ({}, barrier)


def test_small_fanouts_wait_for_flush() -> None:
    """Pages of ten words send fewer than EAGER_FANOUT postings each to the other worker: a step of many of them
    leaves in pieces of ``flush`` items, not a piece per page."""
    pages = [{"id": str(i), "title": "", "text": " ".join(f"w{(i * 7 + j) % 50}" for j in range(10))}
             for i in range(40)]
    inputs = [(inverted_index.page_hash(p), (p, gt, trace, False)) for _f, gt, trace, p in stamp_inputs(pages)]
    owner, envelopes = max(front_envelopes(PLAN, LAYOUT, inputs).items(), key=lambda step: len(step[1]))
    pieces = list(Worker(PLAN, owner, LAYOUT).run(envelopes, 64))
    remote, _barrier = merged(pieces)
    assert len(envelopes) > 10 and len(remote[1 - owner]) > 64
    assert all(sum(map(len, r.values())) + len(b) >= 64 for r, b in pieces[:-1])


def test_without_flush_there_is_one_piece() -> None:
    owner, envelopes = page_steps(1)[0]
    assert len(list(Worker(PLAN, owner, LAYOUT).run(envelopes))) == 1
