"""Business logic that misbehaves on purpose (issue #12: no input can stall the stream).

Module-level functions, so graphs referencing them are plain data another process can load; ``graph()``
makes this file deployable (``flamestream deploy tests/poisonfns.py``) and runnable (``flamestream run``).

``graph()`` is word count whose balancing function misbehaves for a few words — ``none`` balances to None,
``str`` to ``"x"`` (no integer: those items' dead letters), ``big``/``neg`` to ints far outside int32
(folded) — and whose output map, balanced by the same function, shapes a few counts into payloads no plain
JSON encoder writes: a tuple-keyed dict (``tuple``: its repr), NaN (``nan``: null), a lone surrogate
(``lone``: a dead letter of the record) and 300 levels of nesting (``deep``: likewise).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flamestream import Graph
from flamestream.core.hashing import stable_hash

POISON_WORDS = ("none", "str", "big", "neg", "tuple", "nan", "lone", "deep")
DEEP = 300


def split_words(line: str) -> list[str]:
    return line.split()


def word_of(payload: Any) -> Any:
    return payload if isinstance(payload, str) else payload["word"]


def poison_hash(payload: Any) -> Any:
    word = word_of(payload)
    if word == "none":
        return None
    if word == "str":
        return "x"
    if word == "big":
        return 2**40 + 7  # folds to 7
    if word == "neg":
        return -(2**40) - 5  # folds to -5
    return stable_hash(word)


def combine(window: tuple[Any, ...]) -> list[Any]:
    if len(window) == 1:
        return [{"word": window[0], "count": 1}] if isinstance(window[0], str) else []
    acc, word = window
    if isinstance(acc, dict) and isinstance(word, str):
        return [{"word": word, "count": acc["count"] + 1}]
    return []


def shape(acc: dict[str, Any]) -> list[Any]:
    """The count as released, except for the words whose output is made hard to write."""
    word, count = acc["word"], acc["count"]
    if word == "tuple":
        return [{(word, count): count}]
    if word == "nan":
        return [{"word": word, "count": count, "ratio": float("nan")}]
    if word == "lone":
        return [{"word": word + "\ud800", "count": count}]
    if word == "deep":
        nested: Any = count
        for _ in range(DEEP):
            nested = [nested]
        return [nested]
    return [acc]


def graph() -> Graph:
    g = Graph("poison")
    loop = g.merge(2)
    g.source().to(g.map(split_words)).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=poison_hash, equivalence=word_of)).to(g.map(combine))
              .to(g.broadcast(2)))
    shaped = g.map(shape, balance=poison_hash, name="shape")  # a balanced map after the grouping
    g.connect(fanout.out(0), shaped)
    shaped.to(g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g


# -- balancing results carried by the payload (hypothesis in test_poison.py) -----------------------------------

def entry_result(payload: Any) -> Any:
    """``{"k": key, "hs": [entry, hop, grouping]}``: each balancing function returns what the event says."""
    return payload["hs"][0]


def hop_result(payload: Any) -> Any:
    return payload["hs"][1]


def grouping_result(payload: Any) -> Any:
    return payload["hs"][2]


def identity(payload: Any) -> list[Any]:
    return [payload]


def window_keys(window: tuple[Any, ...]) -> list[Any]:
    return [[item["k"] for item in window]]


def carried(balanced_entry: bool) -> Graph:
    """source -> map (entry: balanced by the event, or unbalanced and so replicated) -> map balanced by the
    event -> grouping balanced by the event -> the keys of each window -> sink."""
    g = Graph("carried")
    entry = g.map(identity, balance=entry_result if balanced_entry else None, name="entry")
    hop = g.map(identity, balance=hop_result, name="hop")
    grouping = g.grouping(2, balance=grouping_result, name="by_result")
    g.source().to(entry).to(hop).to(grouping).to(g.map(window_keys, name="keys")).to(g.sink())
    return g.validate()


# -- a map output that is no plain value (test_poison_cluster.py) ----------------------------------------------

class Word(NamedTuple):
    text: str


def line_hash(line: str) -> int:
    return stable_hash(line)


def split_unplain(line: str) -> list[Any]:
    """Word count's split, except that ``nt`` comes out as a namedtuple: not a plain value, so it cannot be
    encoded to cross to another worker (the codec writes plain values only)."""
    return [Word(w) if w == "nt" else w for w in line.split()]


def plain_word(payload: Any) -> str:
    return payload.text if isinstance(payload, Word) else str(payload)


def plain_hash(payload: Any) -> int:
    return stable_hash(plain_word(payload["word"] if isinstance(payload, dict) else payload))


def plain_key(payload: Any) -> str:
    return plain_word(payload["word"] if isinstance(payload, dict) else payload)


def combine_unplain(window: tuple[Any, ...]) -> list[Any]:
    if len(window) == 1:
        return [] if isinstance(window[0], dict) else [{"word": plain_word(window[0]), "count": 1}]
    acc, word = window
    if isinstance(acc, dict) and not isinstance(word, dict):
        return [{"word": plain_word(word), "count": acc["count"] + 1}]
    return []


def unplain() -> Graph:
    """Word count whose split runs where its line hashes (so its outputs cross to the word's worker) and
    emits ``nt`` as a namedtuple."""
    g = Graph("unplain")
    loop = g.merge(2)
    g.source().to(g.map(split_unplain, balance=line_hash)).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=plain_hash, equivalence=plain_key, name="counts"))
              .to(g.map(combine_unplain)).to(g.broadcast(2)))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g
