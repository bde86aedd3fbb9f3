"""Encoding a value again, copying the encodings of its unchanged parts from its previous encoding.

Why: a periodic snapshot re-encodes every bucket that changed since the
last one, and on an inverted index a common word changes with nearly every
page while most of its posting list does not (the example keeps it in
``SHARDS`` dicts and copies one of them per posting).  Encoding the whole
list again made a snapshot cost more the longer the index grew: at 1,200
pages two thirds of a snapshot's encoded bytes were shard dicts that had
been encoded, unchanged, the second before.  This relies on the rule that
business logic never mutates a payload: a part that kept its identity kept
its value (its length is checked as well).

How: the value with each part replaced by a placeholder (``values.HOLE``'s
bytes) is encoded, cut where the placeholders are, and joined in one frame
with the parts' encodings: copied from the previous encoding where the part is
the same object, encoded together by ``values.fragments`` where not.  Without
the memo (``values.fragments`` writes none) an encoding is position-free, so
its bytes mean the same anywhere.  Compiled: interpreted, the loop over an
index word's 64 shards took 65-85 us, more than encoding most of them whole;
compiled, 24-30 us.
"""

from __future__ import annotations

import pickle
from typing import Any, Final

from flamestream.core import values

Parts = tuple[list[Any], list[int]]
"""What ``encode_spliced`` recorded of one encoding: its parts in order, and for each its ``len`` when encoded and
where its encoding starts and ends in that encoding (three ints a part).  Holding the parts keeps them alive, so
an identity check against them means something."""
Spliced = tuple[bytes, Parts, int]
"""An encoding, its parts, and how many of its bytes were copied from the previous one."""
NO_PARTS: Final[Parts] = ([], [])

DEPTH: Final = 4
"""Tuples and lists are opened down to this depth (the value itself is depth 0); the containers at it, and the dicts
and sets above it, are the parts.  4 reaches a snapshot entry's payload's elements' elements (entry list, entry,
payload, element): an inverted index word's shard dicts."""
WIDTH: Final = 256
"""A tuple or list longer than this is a part itself, not opened: opening it costs a step per element."""
CHUNK: Final = 16
"""Parts, or skeletons, ``values.fragments`` encodes in one pickler call: an index word's skeleton (64 placeholders)
takes 1.3 KB and a shard a few hundred bytes, so 16 of them fit in one frame."""
_BODY_START: Final = 11
"""Where the opcodes start: after the protocol header (2 bytes) and the frame's opcode and length (9)."""


def encode_spliced(jobs: list[tuple[Any, Parts, bytes | memoryview]]) -> list[Spliced | None]:
    """For each (value, parts, old), ``values.encode(value)``'s equal, with each part that is, at the same place,
    the one ``parts`` recorded of ``old`` — the same object, the same length — copied from ``old``; None where
    that cannot be done (a part, or what is left around the parts, larger than a frame; shared or cyclic parts;
    not plain): ``values.encode`` it.  Matched by place, not looked up: a bucket that changed keeps its shape (an
    index word's 64 shards), and a check per place costs next to nothing where a lookup per part did not."""
    skeletons: list[Any] = []
    found: list[tuple[list[Any], list[bool]]] = []
    fresh: list[Any] = []
    for value, parts, _old in jobs:
        mine: list[Any] = []
        skeletons.append(_skeleton(value, 0, mine))
        kept = _kept(mine, parts)
        found.append((mine, kept))
        fresh += [part for part, same in zip(mine, kept, strict=True) if not same]
    codes = dict(zip(map(id, fresh), values.fragments(fresh, CHUNK), strict=True))
    out: list[Spliced | None] = []
    for job, (mine, kept), skeleton in zip(jobs, found, values.fragments(skeletons, CHUNK), strict=True):
        pieces = skeleton.split(values.HOLE) if skeleton is not None else []
        out.append(_joined(pieces, mine, kept, job[1][1], job[2], codes) if len(pieces) == len(mine) + 1 else None)
    return out


def _skeleton(value: Any, depth: int, parts: list[Any]) -> Any:
    """``value`` with its parts replaced by the placeholder, appended to ``parts`` in the order pickle writes
    them."""
    kind = type(value)
    if kind is tuple or kind is list:
        if depth < DEPTH and len(value) <= WIDTH:
            opened = [_skeleton(element, depth + 1, parts) for element in value]
            return tuple(opened) if kind is tuple else opened
    elif kind is not dict and kind is not set and kind is not frozenset:
        return value
    parts.append(value)
    return values.PLACEHOLDER


def _kept(mine: list[Any], parts: Parts) -> list[bool]:
    """For each part of ``mine``, whether it is, at its place, the one ``parts`` recorded (the same object, the same
    length): its bytes can be copied."""
    before, bounds = parts
    return [i < len(before) and before[i] is part and bounds[3 * i] == len(part) for i, part in enumerate(mine)]


def _joined(pieces: list[bytes], mine: list[Any], kept: list[bool], bounds: list[int], old: bytes | memoryview,
            codes: dict[int, bytes | None]) -> Spliced | None:
    """The encoding: ``pieces`` (the skeleton cut at its placeholders) with ``mine``, its parts, between them; a
    part ``kept`` copied from ``old`` where ``bounds`` says, consecutive ones from consecutive bytes as one slice."""
    view = memoryview(old)
    chunks: list[bytes | memoryview] = [pieces[0]]
    recorded: list[int] = []
    at = _BODY_START + len(pieces[0])
    copied = 0
    run_start = run_end = -1
    """The slice of ``old`` being copied: parts whose bytes follow each other there and here."""
    for i in range(len(mine)):
        part = mine[i]
        size = len(part)
        if kept[i]:
            start, end = bounds[3 * i + 1], bounds[3 * i + 2]
            if start != run_end:
                _copy(chunks, view, run_start, run_end)
                run_start = start
            run_end = end
            length = end - start
            copied += length
        else:
            code = codes[id(part)]
            if code is None:
                return None
            _copy(chunks, view, run_start, run_end)
            run_start = run_end = -1
            chunks.append(code)
            length = len(code)
        recorded += (size, at, at + length)
        piece = pieces[i + 1]
        if piece:
            _copy(chunks, view, run_start, run_end)
            run_start = run_end = -1
            chunks.append(piece)
        at += length + len(piece)
    _copy(chunks, view, run_start, run_end)
    chunks.append(pickle.STOP)
    frame = (at + 1 - _BODY_START).to_bytes(8, "little")
    return b"".join([values.HEADER, pickle.FRAME, frame, *chunks]), (mine, recorded), copied


def _copy(chunks: list[bytes | memoryview], view: memoryview, start: int, end: int) -> None:
    """Append the slice ``start .. end`` of ``view`` that ``_joined`` was copying, if one was (``start`` >= 0)."""
    if start >= 0:
        chunks.append(view[start:end])
