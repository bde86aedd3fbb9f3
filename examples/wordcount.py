"""Incremental word count (paper §2.7, figure 6).

line -> words -> reduce by word, where reduce = grouping(window 2) + combine
map + a cycle carrying the accumulator back into the grouping.  Each word
occurrence yields one record with the word's updated count, e.g.
``{"word": "dog", "count": 2}``.  No function here holds state.
"""

from __future__ import annotations

import re
from typing import Any

from flamestream import Graph
from flamestream.core.hashing import stable_hash

WORD = re.compile(r"\w+")

Accumulator = dict[str, Any]


def split_words(line: str) -> list[str]:
    """Map stage: a line becomes its words (the mapped items)."""
    return WORD.findall(line.lower())


def word_of(payload: str | Accumulator) -> str:
    return payload if isinstance(payload, str) else payload["word"]


def word_hash(payload: str | Accumulator) -> int:
    return stable_hash(word_of(payload))


def combine(window: tuple[Any, ...]) -> list[Accumulator]:
    """Reduce stage.  (word,) starts a count; (accumulator, word) adds one.

    Every other shape is dropped: (word, accumulator) means the word was
    already counted, and (word, word) only exists while the accumulator
    between them is still travelling the cycle.
    """
    if len(window) == 1:
        (only,) = window
        return [{"word": only, "count": 1}] if isinstance(only, str) else []
    acc, word = window
    if isinstance(acc, dict) and isinstance(word, str):
        return [{"word": word, "count": acc["count"] + 1}]
    return []


def graph() -> Graph:
    g = Graph("wordcount")
    loop = g.merge(2, name="loop")
    g.source().to(g.map(split_words, name="split")).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=word_hash, equivalence=word_of, name="by_word"))
              .to(g.map(combine, name="combine"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g.validate()
