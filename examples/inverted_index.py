"""Incremental inverted index with a per-page changelog (paper §5).

page -> (word, page, positions) postings -> reduce by word into the word's
posting list, via grouping(window 2) + combine map + cycle.  Every input page
triggers its changelog: one record per word whose postings changed, e.g.
``{"word": "мяч", "page": "51626", "positions": [3, 17], "pages": 12}``
(``positions`` is null when a new revision of the page dropped the word).

Pages may arrive again as new revisions.  A first grouping keyed by page id
(window 2) pairs each revision with the previous one, so the diff map emits
only what changed — two chained groupings on real data.

Payloads are never mutated: replays reuse them, so combine copies the posting
dict it extends.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

from flamestream import Graph
from flamestream.core.hashing import stable_hash

WORD = re.compile(r"\w+")
STRESS_MARK = "\u0301"

Page = dict[str, str]
Posting = tuple[str, str, str, tuple[int, ...] | None]
"""("posting", word, page id, positions or None when the word left the page)."""
Index = tuple[str, str, dict[str, tuple[int, ...]], Posting]
"""("index", word, page id -> positions, the posting that produced this version)."""


def read_input(path: str) -> Iterator[Page]:
    """Pages of a FlameStream corpus file: ``<page id=… title=…>text</page>``."""
    for _event, elem in ET.iterparse(path, events=("end",)):
        if elem.tag == "page":
            yield {"id": elem.get("id", ""), "title": elem.get("title", ""), "text": elem.text or ""}
            elem.clear()


def page_id(page: Page) -> str:
    return page["id"]


def page_hash(page: Page) -> int:
    return stable_hash(page["id"])


def positions(page: Page) -> dict[str, tuple[int, ...]]:
    """Word -> its positions in the page (title words first)."""
    found: dict[str, list[int]] = {}
    text = f"{page['title']} {page['text']}".replace(STRESS_MARK, "").lower()
    for i, word in enumerate(WORD.findall(text)):
        found.setdefault(word, []).append(i)
    return {w: tuple(p) for w, p in found.items()}


def diff_revisions(window: tuple[Page, ...]) -> list[Posting]:
    """(page,) posts every word; (previous, page) posts only what the revision changed."""
    page = window[-1]
    new = positions(page)
    old = positions(window[0]) if len(window) == 2 else {}
    pid = page["id"]
    out: list[Posting] = [("posting", w, pid, p) for w, p in new.items() if old.get(w) != p]
    out.extend(("posting", w, pid, None) for w in old if w not in new)
    return out


def word_of(payload: Posting | Index) -> str:
    return payload[1]


def word_hash(payload: Posting | Index) -> int:
    return stable_hash(payload[1])


def combine(window: tuple[Any, ...]) -> list[Index]:
    """(posting,) starts a word's index; (index, posting) applies the posting; the rest is dropped."""
    if len(window) == 1:
        (posting,) = window
        if posting[0] != "posting":
            return []
        postings = {} if posting[3] is None else {posting[2]: posting[3]}
        return [("index", posting[1], postings, posting)]
    index, posting = window
    if index[0] != "index" or posting[0] != "posting":
        return []
    postings = dict(index[2])
    if posting[3] is None:
        postings.pop(posting[2], None)
    else:
        postings[posting[2]] = posting[3]
    return [("index", posting[1], postings, posting)]


def changelog(index: Index) -> list[dict[str, Any]]:
    """Accumulator map: the change this version of the word's index made."""
    _, word, postings, (_, _, page, where) = index
    return [{"word": word, "page": page, "positions": None if where is None else list(where),
             "pages": len(postings)}]


def graph() -> Graph:
    g = Graph("inverted_index")
    loop = g.merge(2, name="loop")
    (g.source()
     .to(g.grouping(2, balance=page_hash, equivalence=page_id, name="revisions"))
     .to(g.map(diff_revisions, name="diff"))
     .to(loop.inp(0)))
    fanout = (loop.to(g.grouping(2, balance=word_hash, equivalence=word_of, name="by_word"))
              .to(g.map(combine, name="combine"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), g.map(changelog, name="changelog")).to(g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g.validate()
