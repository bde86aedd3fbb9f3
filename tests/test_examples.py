"""The shipped examples: word count and the inverted index over the shared Wikipedia pages."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index, wordcount
from flamestream import LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs

PAGES = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki_football_ru.xml"


def multiset(pairs: list[tuple[Any, Any]]) -> Counter[tuple[Any, str]]:
    return Counter((gt, repr(p)) for gt, p in pairs)


def test_wordcount_counts_every_occurrence() -> None:
    lines = ["the quick dog", "the lazy dog", "a dog is a dog"] * 20
    result = LocalRuntime(wordcount.graph(), workers=3, fronts=2, seed=7).run(lines)
    final: dict[str, int] = {}
    for _gt, _trace, record in result.output:
        assert record["count"] == final.get(record["word"], 0) + 1  # meta order: counts rise one by one
        final[record["word"]] = record["count"]
    assert final == dict(Counter(w for line in lines for w in line.split()))


@pytest.fixture(scope="module")
def pages() -> list[dict[str, str]]:
    if not PAGES.exists():
        pytest.fail(f"shared corpus missing: {PAGES}")
    return list(inverted_index.read_input(str(PAGES)))


def test_corpus_is_parsed(pages: list[dict[str, str]]) -> None:
    assert len(pages) == 268
    assert pages[0]["id"] == "51626" and pages[0]["title"] == "Сборная Бразилии по футболу"
    assert all(p["text"].strip() for p in pages)


def test_revision_changelog_only_reports_changes() -> None:
    first = {"id": "1", "title": "", "text": "ball goal ball"}
    second = {"id": "1", "title": "", "text": "ball match"}
    records = [p for _, _, p in LocalRuntime(inverted_index.graph(), workers=2).run([first, second]).output]
    assert records == [
        {"word": "ball", "page": "1", "positions": [0, 2], "pages": 1},
        {"word": "goal", "page": "1", "positions": [1], "pages": 1},
        {"word": "ball", "page": "1", "positions": [0], "pages": 1},
        {"word": "match", "page": "1", "positions": [1], "pages": 1},
        {"word": "goal", "page": "1", "positions": None, "pages": 0},
    ]


def test_a_word_on_many_pages_keeps_the_same_postings_once_they_are_sharded() -> None:
    """Past ``SHARD_ABOVE`` pages a word's postings split into shards; adding, changing and removing pages then
    gives the same postings and page counts as one dict would, and never touches an earlier version."""
    rng = random.Random(3)
    reference: dict[str, bytes] = {}
    index: Any = None
    versions: list[tuple[Any, dict[str, bytes]]] = []
    for step in range(3 * inverted_index.SHARD_ABOVE):
        page = str(rng.randrange(2 * inverted_index.SHARD_ABOVE))
        where = None if step % 5 == 4 else inverted_index.packed((step, rng.randrange(100)))
        posting = ("posting", "w", page, where)
        (index,) = inverted_index.combine((posting,) if index is None else (index, posting))
        if where is None:
            reference.pop(page, None)
        else:
            reference[page] = where
        (record,) = inverted_index.changelog(index)
        assert record["pages"] == len(reference)
        versions.append((index, dict(reference)))
    assert isinstance(index[2], tuple) and len(index[2]) == inverted_index.SHARDS, "the postings were sharded"
    for version, expected in versions[:: inverted_index.SHARD_ABOVE // 4]:  # earlier versions are unchanged
        postings = version[2]
        merged = postings if isinstance(postings, dict) else {k: v for shard in postings for k, v in shard.items()}
        assert merged == expected


def test_state_from_before_positions_were_packed_reads_the_same() -> None:
    """A redeploy hands the previous deployment's state over: an index built when positions were tuples gives the
    same changelog record as a packed one, and a new posting applies to it."""
    old = ("index", "w", {"1": (3, 17)}, ("posting", "w", "1", (3, 17)), 1)
    new = inverted_index.combine((("posting", "w", "1", inverted_index.packed((3, 17))),))[0]
    assert inverted_index.changelog(old) == inverted_index.changelog(new) == [
        {"word": "w", "page": "1", "positions": [3, 17], "pages": 1}]
    (after,) = inverted_index.combine((old, ("posting", "w", "2", inverted_index.packed((5,)))))
    assert inverted_index.changelog(after) == [{"word": "w", "page": "2", "positions": [5], "pages": 2}]


def test_page_ids_that_are_not_strings_are_sharded_too() -> None:
    """``page_hash`` takes any id ``stable_hash`` does (events pushed as JSON may carry int ids)."""
    index: Any = None
    for page in range(inverted_index.SHARD_ABOVE + 2):
        posting = ("posting", "w", page, inverted_index.packed((page,)))
        (index,) = inverted_index.combine((posting,) if index is None else (index, posting))
    assert inverted_index.changelog(index)[0]["pages"] == inverted_index.SHARD_ABOVE + 2


@pytest.mark.slow
def test_inverted_index_on_shared_pages_matches_oracle(pages: list[dict[str, str]]) -> None:
    """4 workers, adversarial channel speeds: replays and retractions galore, same output as the oracle."""
    graph = inverted_index.graph()
    expected, _ = run_oracle(graph, stamp_inputs(pages))
    result = LocalRuntime(graph, workers=4, seed=11, adversarial=True, batch=8).run(pages)
    assert result.stats.retractions > 0, "the adversarial schedule should have forced replays"
    assert multiset([(gt, p) for gt, _, p in result.output]) == multiset(expected)
    per_page = Counter(p["page"] for _, p in expected)
    assert len(per_page) == 268 and min(per_page.values()) > 0  # every page triggers its changelog
