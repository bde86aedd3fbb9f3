"""The benchmark workloads: what is pushed, what counts as done, what is correct.

A workload is the one place that knows its computation's shapes, so every
system is measured and checked the same way:

* ``events`` is the seeded, endless input (pages repeat with fresh ids).
* ``progress`` decides when an event is *done* from the records a system's
  consumer sees — for the inverted index, once every changelog record of the
  page arrived (as FlameStream measured it); for word count, once every word
  of the line has a consumed count at least as high as that occurrence's.
  The ``>=`` lets micro-batch systems (Spark) that fold several updates of a
  word into one record be measured by the same rule.
* ``check`` compares a system's records with the oracle's: exactly as a
  multiset for systems emitting one record per update, or the final state per
  key for systems that aggregate within a micro-batch.
* ``python_loop`` is the computation written directly as a dict loop: the
  plain-Python physical limit.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

from examples import inverted_index, wordcount
from examples.inverted_index import Page
from flamestream.bench import EXAMPLES_ROOT
from flamestream.core.front import stamp_inputs
from flamestream.core.graph import Graph
from flamestream.core.oracle import run_oracle

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wiki_football_ru.xml"
"""The shared Wikipedia corpus, beside the repository (``../shared/data``)."""

VOCABULARY = 10_000
WORDS_PER_LINE = 10

Record = dict[str, Any]


def with_examples_path(graph: Graph) -> Graph:
    """The example graph, with the source tree on its ``sys_path`` so workers resolve ``examples.*`` functions."""
    graph.sys_path = [str(EXAMPLES_ROOT)]
    return graph


@dataclass(frozen=True)
class Check:
    correct: bool
    method: str
    """``changelog`` (multiset of records) or ``final-state`` (last value per key)."""
    detail: str


class Progress(Protocol):
    def expect(self, event_id: str, payload: Any) -> int:
        """Register a pushed event (in push order); returns how many obligations it has (0: done already)."""

    def observe(self, record: Record) -> list[str]:
        """Consume one record; returns the events it completes."""


class Workload(Protocol):
    name: str
    unit: str
    """What an event's obligations count: words for word count, changelog records for the inverted index."""
    rate_unit: str
    default_rate: float
    """Events per second of ``flamestream bench`` without ``--rate``."""

    def events(self, seed: int) -> Iterator[tuple[str, Any]]: ...

    def progress(self) -> Progress: ...

    def graph(self) -> Graph: ...

    def python_loop(self) -> PythonLoop: ...

    def check(self, payloads: list[Any], records: list[Record], method: str) -> Check: ...


class PythonLoop(Protocol):
    def process(self, payload: Any) -> list[Record]: ...


def _canonical(record: Record) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def oracle_records(graph: Graph, payloads: list[Any]) -> list[Record]:
    """The oracle's output for payloads pushed in this order by one producer (global time = push order)."""
    output, rejected = run_oracle(graph, stamp_inputs(payloads))
    if rejected:
        raise ValueError(f"the oracle rejected {len(rejected)} benchmark inputs, e.g. {rejected[0]!r:.200}")
    return [payload for _gt, payload in output]


def check_against_oracle(graph: Graph, payloads: list[Any], records: list[Record], method: str,
                         final_state: Callable[[list[Record]], dict[Any, Any]]) -> Check:
    """``method`` ``changelog``: the records as a multiset; otherwise ``final_state`` of both sides."""
    expected = oracle_records(graph, payloads)
    if method == "changelog":
        return _multiset_check(expected, records)
    return _state_check(final_state(expected), final_state(records))


def _multiset_check(expected: list[Record], records: list[Record]) -> Check:
    want, got = Counter(map(_canonical, expected)), Counter(map(_canonical, records))
    if want == got:
        return Check(True, "changelog", f"{len(records)} records == oracle")
    missing, extra = want - got, got - want
    sample = next(iter(missing or extra))
    return Check(False, "changelog", f"{sum(missing.values())} records missing and {sum(extra.values())} extra "
                                     f"of {len(expected)} (e.g. {'missing' if missing else 'extra'} {sample:.200})")


def _state_check(want: dict[Any, Any], got: dict[Any, Any]) -> Check:
    if want == got:
        return Check(True, "final-state", f"{len(got)} keys == oracle")
    differing = [k for k in want.keys() | got.keys() if want.get(k) != got.get(k)]
    key = differing[0]
    return Check(False, "final-state", f"{len(differing)} of {len(want)} keys differ (e.g. {key!r}: "
                                       f"oracle {want.get(key)!r:.100}, got {got.get(key)!r:.100})")


# -- word count ------------------------------------------------------------------------------------------------


class WordcountProgress:
    """A line is done when each of its word occurrences has a consumed count >= the count it makes."""

    def __init__(self) -> None:
        self._issued: Counter[str] = Counter()
        self._seen: dict[str, int] = {}
        self._waiting: dict[str, list[tuple[int, str]]] = {}
        """word -> (count threshold, line id), thresholds increasing (lines are expected in push order)."""
        self._remaining: dict[str, int] = {}
        self._lock = threading.Lock()

    def expect(self, event_id: str, payload: Any) -> int:
        words = wordcount.split_words(payload)
        with self._lock:
            for word in words:
                self._issued[word] += 1
                self._waiting.setdefault(word, []).append((self._issued[word], event_id))
            self._remaining[event_id] = len(words)
        return len(words)

    def observe(self, record: Record) -> list[str]:
        word, count = record["word"], record["count"]
        done: list[str] = []
        with self._lock:
            if count <= self._seen.get(word, 0):
                return done
            self._seen[word] = count
            waiting = self._waiting.get(word, [])
            met = 0
            while met < len(waiting) and waiting[met][0] <= count:
                line = waiting[met][1]
                self._remaining[line] -= 1
                if self._remaining[line] == 0:
                    del self._remaining[line]
                    done.append(line)
                met += 1
            del waiting[:met]
        return done


class WordcountLoop:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def process(self, payload: Any) -> list[Record]:
        counts = self.counts
        out = []
        for word in wordcount.split_words(payload):
            counts[word] = count = counts.get(word, 0) + 1
            out.append({"word": word, "count": count})
        return out


class Wordcount:
    """Word count over a seeded Zipf corpus: 10k-word vocabulary, 10 words a line."""

    name = "wordcount"
    unit = "words"
    rate_unit = "lines/s"
    default_rate = 1000.0

    def events(self, seed: int) -> Iterator[tuple[str, Any]]:
        rng = random.Random(seed)
        words = [f"w{i}" for i in range(VOCABULARY)]
        cumulative = list(accumulate(1 / (rank + 1) for rank in range(VOCABULARY)))
        k = 0
        while True:
            yield f"l{k}", " ".join(rng.choices(words, cum_weights=cumulative, k=WORDS_PER_LINE))
            k += 1

    def progress(self) -> WordcountProgress:
        return WordcountProgress()

    def graph(self) -> Graph:
        return with_examples_path(wordcount.graph())

    def python_loop(self) -> WordcountLoop:
        return WordcountLoop()

    def check(self, payloads: list[Any], records: list[Record], method: str) -> Check:
        return check_against_oracle(self.graph(), payloads, records, method, _final_counts)


def _final_counts(records: list[Record]) -> dict[str, int]:
    final: dict[str, int] = {}
    for r in records:
        final[r["word"]] = max(final.get(r["word"], 0), r["count"])
    return final


# -- inverted index ----------------------------------------------------------------------------------------------


class PageProgress:
    """A page is done when all its changelog records (one per distinct word) were consumed."""

    def __init__(self, distinct_words: Callable[[Any], int] = lambda page: len(inverted_index.positions(page))) -> None:
        self._distinct_words = distinct_words
        self._remaining: dict[str, int] = {}
        self._lock = threading.Lock()

    def expect(self, event_id: str, payload: Any) -> int:
        words = self._distinct_words(payload)
        with self._lock:
            if words:
                self._remaining[payload["id"]] = words
        return words

    def observe(self, record: Record) -> list[str]:
        page = record["page"]
        with self._lock:
            left = self._remaining.get(page)
            if left is None:
                return []
            if left > 1:
                self._remaining[page] = left - 1
                return []
            del self._remaining[page]
        return [page]


class InvertedIndexLoop:
    """The changelog of fresh pages (the benchmark never repeats a page id), straight from dicts."""

    def __init__(self) -> None:
        self.pages: dict[str, int] = {}

    def process(self, payload: Any) -> list[Record]:
        pages = self.pages
        pid = payload["id"]
        out = []
        for word, where in inverted_index.positions(payload).items():
            pages[word] = n = pages.get(word, 0) + 1
            out.append({"word": word, "page": pid, "positions": list(where), "pages": n})
        return out


class InvertedIndex:
    """The shared Wikipedia pages, repeated with fresh ids for as long as the run needs."""

    name = "inverted-index"
    unit = "changelog records"
    rate_unit = "pages/s"
    default_rate = 20.0

    def __init__(self, corpus: Path = CORPUS) -> None:
        if not corpus.exists():
            raise FileNotFoundError(f"the inverted-index workload reads {corpus}, which does not exist "
                                    "(the shared data directory belongs beside the repository)")
        self.pages = list(inverted_index.read_input(str(corpus)))
        """The corpus's pages, with their own ids (``events`` gives each repetition a fresh one)."""
        self._distinct = {page["id"]: len(inverted_index.positions(page)) for page in self.pages}
        """Distinct words per corpus page, computed once: the pusher must not tokenize on the clock."""

    def events(self, seed: int) -> Iterator[tuple[str, Any]]:
        rng = random.Random(seed)
        order = list(range(len(self.pages)))
        rounds = 0
        while True:
            rng.shuffle(order)
            for i in order:
                page = self.pages[i]
                pid = f"{page['id']}~{rounds}"
                yield pid, {**page, "id": pid}
            rounds += 1

    def records_of(self, page: Page) -> int:
        """The changelog records a page of the corpus makes when it is new to the index: its distinct words."""
        return self._distinct[page["id"].partition("~")[0]]

    def progress(self) -> PageProgress:
        return PageProgress(self.records_of)

    def graph(self) -> Graph:
        return with_examples_path(inverted_index.graph())

    def python_loop(self) -> InvertedIndexLoop:
        return InvertedIndexLoop()

    def check(self, payloads: list[Any], records: list[Record], method: str) -> Check:
        return check_against_oracle(self.graph(), payloads, records, method, _final_index)


def _final_index(records: list[Record]) -> dict[tuple[str, str], Any]:
    return {(r["word"], r["page"]): r["positions"] for r in records}


WORKLOADS: dict[str, type[Wordcount] | type[InvertedIndex]] = {"wordcount": Wordcount,
                                                               "inverted-index": InvertedIndex}


def workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]()
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)}") from None
