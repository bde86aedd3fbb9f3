"""Payload JSON: the public format of events and released records.

Pure (no I/O), so the local runtime, the oracle, the services and the SDK all
encode a payload the same way: the bytes a consumer reads do not depend on
where the record was produced.

Two directions, two policies.  An *event* comes from outside, and what a
worker could not process or write must be refused at the door, naming the
event (``check_payload``, used by the front, the SDK and the CLI): a fault found
later, after the acker took the event's ack, would stall the stream.  A
*record* comes from business logic that already ran, so refusing is no longer
possible: ``encode_payload`` always returns bytes, and a payload that cannot be
written becomes its dead letter instead of an exception that stops a worker.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

from flamestream.core.dead_letter import RECORD, dead_letter, deeper_than
from flamestream.core.errors import PayloadError as PayloadError  # re-exported: defined there for mypyc

MAX_DEPTH: Final = 64
"""Events nest arrays/objects at most this deep (``1`` is depth 0, ``[1]`` depth 1).  Generous for data, and it
leaves business logic plenty of the records' own limit and of Python's recursion limit: events are decoded,
hashed (``stable_hash`` recurses), pickled between workers and written to the input log, and deep nesting
(500 levels and more) made some of those raise ``RecursionError`` after the event was admitted."""

MAX_RECORD_DEPTH: Final = 254
"""Records nest at most this deep (orjson's own limit, so the fast and the fallback encoder agree); a sink
payload nested deeper becomes a dead letter — at a fixed depth, not wherever the stack happens to run out."""


_NATIVE_ONLY: Final = (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                       | orjson.OPT_PASSTHROUGH_SUBCLASS)
"""orjson writes only plain JSON types itself (several times faster than ``json``, and workers encode every
record); everything else takes the ``json`` path, as before orjson."""

SHOWN_KEY: Final = 60
"""Characters of a key an error message shows."""

_JSON_KEYS: Final = (str, int, float, type(None))
"""Dict keys ``json`` writes (as strings; bool is an int); any other key makes the whole dict its ``repr``."""


_DIGITS_AS_ZERO: Final = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_CONTAINERS: Final = (b"{", b"[")
"""How JSON text of an object or an array starts (unless after white space): ``decode_event`` sends such an event
to ``json`` without decoding it with orjson first, for nothing."""
_LONG_RUN: Final = b"0" * 19
"""Nineteen digits in a row, once ``_DIGITS_AS_ZERO`` made every digit a zero: where an integer may lie beyond 64
bits (every integer of 18 digits or fewer fits).  Found with ``bytes.translate`` and a substring search, both in C:
on an 87-byte changelog record 0.4-0.6 us, where ``re.search("[0-9]{19}")`` took 1.2-1.6 us."""


def decode_payload(data: bytes) -> Any:
    """A payload's JSON value as Python's ``json`` reads it: integers of any size exact, NaN accepted (which
    ``check_payload`` then refuses, by name), lone surrogates kept.

    Why orjson first: a consumer decodes every record, and ``json.loads``
    took 3.3 of the 5.9 us the SDK spent on a word count record (batches of
    ten); orjson and the check for long integers take 1.2.  orjson reads the
    same values (floats bit for bit: the tests compare them) except for
    integers beyond 64 bits, which it reads as floats, so any run of
    nineteen digits, in a string or not, sends the payload to ``json``.
    What orjson refuses (NaN, an out-of-range float such as ``1e400``, lone
    surrogates, a byte order mark, UTF-16 or UTF-32) goes to ``json`` as
    well.  One difference is left: a value nested 1,000 to 1,024 deep,
    which orjson reads and ``json`` refuses with a RecursionError; events
    nest at most ``MAX_DEPTH`` and records ``MAX_RECORD_DEPTH`` deep.
    """
    value = _by_orjson(data)
    return value if value is not _UNREAD else _loads(data, None)


_UNREAD: Final = object()
"""What ``_by_orjson`` returns where ``json`` must read the bytes."""


def _by_orjson(data: bytes) -> Any:
    """``data``'s value read by orjson where that is the value ``json`` reads (see ``decode_payload``), else
    ``_UNREAD``: a run of nineteen digits, or bytes orjson refuses (``json`` accepts some of these, and names
    the fault of the others)."""
    if _LONG_RUN in data.translate(_DIGITS_AS_ZERO):
        return _UNREAD
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _UNREAD


def decode_event(data: bytes | str) -> Any:
    """An event's JSON value, as ``decode_payload``, but an object with a key twice is refused: ``json`` would
    keep the last value and drop the others without a word, and what the client meant is unknown.

    orjson first, as there, for an event that is no object or array (a line
    of text, a number): orjson keeps the last of two keys too, so only such
    a value is known to have none twice.  A front decodes every event pushed
    to it: a word count line took 6.7 us with ``json`` (whose every call
    with a hook builds a decoder), 1.0 us with orjson.  An event that starts
    as an object or array goes to ``json`` at once: decoded twice, a page
    took twice as long.
    """
    if isinstance(data, bytes) and data[:1] not in _CONTAINERS:
        value = _by_orjson(data)
        # An object or array after white space goes to json too, which checks its keys.
        if value is not _UNREAD and not isinstance(value, (dict, list)):
            return value
    return _loads(data, unique_keys)


def _loads(data: bytes | str, object_pairs_hook: Any) -> Any:
    try:
        return json.loads(data, object_pairs_hook=object_pairs_hook)  # None: json's own (and fast) path
    except PayloadError:  # the hook's, a ValueError itself
        raise
    except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, integers too long, nesting too deep
        raise PayloadError(f"payload is not valid JSON: {exc}") from exc


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s ``object_pairs_hook`` for events: the object, or ``PayloadError`` naming a key it has twice."""
    value = dict(pairs)
    if len(value) < len(pairs):
        raise PayloadError(f"payload has the key {_twice(key for key, _ in pairs)} twice in one object")
    return value


def _twice(keys: Any) -> str:
    """The first of ``keys`` (JSON key texts) seen before, as an error message shows it: ``repr`` (which escapes
    lone surrogates, so the message stays writable) of at most ``SHOWN_KEY`` characters (a key may be 1 MB)."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return repr(key) if len(key) <= SHOWN_KEY else f"{key[:SHOWN_KEY]!r}..."
        seen.add(key)
    raise AssertionError("no key is there twice")


def _json_key(key: Any) -> str:
    """The text ``json`` writes for a dict key of a ``_JSON_KEYS`` type: ``1`` and ``"1"`` are both ``"1"``."""
    return key if isinstance(key, str) else json.dumps(key)


def _colliding(item: dict[Any, Any]) -> str | None:
    """A key text that two of ``item``'s keys (all of ``_JSON_KEYS`` types) would both be written as, or None."""
    texts = [_json_key(key) for key in item]
    return _twice(texts) if len(set(texts)) < len(texts) else None


def check_payload(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Why the event ``value`` must be refused, or None: a lone surrogate in a string (UTF-8 cannot encode it,
    so neither the input log nor a record could hold it), NaN or ±Infinity (JSON has neither: the input log
    would hold invalid JSON, and a record would say null where the event said NaN), or arrays/objects
    (lists, tuples, dicts) nested deeper than ``max_depth`` (see ``MAX_DEPTH``), two keys of one object that
    JSON writes alike (``1`` and ``"1"``), or what is not a JSON value at all: a set, bytes, a date, a key that is
    a tuple...  (the SDK refuses those rather than send their ``repr``, and the local runtime and the oracle, which
    ask this too, refuse them as the cluster would never see them).

    Iterative, so no nesting can make it raise; a container seen before at the
    same or a greater depth is not walked again, so shared substructure costs at
    most one walk per depth, not one per path (``a = [a, a]`` 60 times over), and
    a cycle ends up too deep.
    """
    if type(value) is str:  # the common event (a line of text): no walk
        return _str_fault(value)
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            fault = _str_fault(item)
            if fault is not None:
                return fault
        elif isinstance(item, float):
            if not math.isfinite(item):
                shown = "NaN" if math.isnan(item) else "Infinity" if item > 0 else "-Infinity"
                return f"payload holds {shown}, which JSON does not have (send null or a string)"
        elif isinstance(item, (list, tuple, dict)):
            depth += 1
            if depth > max_depth:
                return f"payload nests arrays/objects deeper than {max_depth} levels"
            if seen.get(id(item), 0) >= depth:
                continue
            seen[id(item)] = depth
            if isinstance(item, dict):
                strings = True  # then no two keys can collide: the common object needs no second look
                for key in item:
                    if isinstance(key, str):
                        fault = _str_fault(key)
                        if fault is not None:
                            return fault
                    elif isinstance(key, _JSON_KEYS):
                        strings = False
                    else:
                        return f"payload is not a JSON value: an object's key is a {type(key).__name__}"
                twice = None if strings else _colliding(item)
                if twice is not None:
                    return f"payload has two keys written as {twice} in one object (JSON keys are strings)"
                stack.extend((child, depth) for child in item.values())
            else:
                stack.extend((child, depth) for child in item)
        elif not isinstance(item, int) and item is not None:  # int: bool too
            return f"payload is not a JSON value: it holds a {type(item).__name__}"
    return None


def _str_fault(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"payload holds a lone surrogate {text[exc.start]!r} (a string's character {exc.start}), "
                "which UTF-8 cannot encode")
    return None


def encode_event(payload: Any) -> bytes:
    """An event's JSON for a push; ``PayloadError`` if the front would refuse it or it is not a JSON value
    (``check_payload``: a set, bytes, a date, a dict with keys JSON cannot have or with two keys JSON writes
    alike, any other object), or ``json`` cannot write it (an integer of thousands of digits).  Those are
    refused rather than written as their ``repr`` (as a record is): an event that arrives as the string
    ``"{1, 2}"`` instead of the set the client pushed is silently wrong data, and ``object()``'s repr is not
    even the same twice.  Nothing is turned into a dead letter here: the client is still there to be told.
    Tuples are arrays, and int, float, bool and None keys strings, as ``json`` writes them."""
    fault = check_payload(payload)
    if fault is not None:
        raise PayloadError(fault)
    return encode_json(payload)


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON of a value made of events ``check_payload`` passed (an input-log record holding one):
    orjson's, or ``json``'s for what orjson leaves to it (an integer beyond 64 bits); ``PayloadError`` for what
    neither writes.  Only for such values: orjson writes NaN and infinities as null, ``json`` as ``NaN``.

    Why not ``json`` alone: a front encodes a log record for every event it
    admits, and ``json.dumps`` took 6.7 us for a word count line's record
    and 23 us for a page's, orjson 1.1 and 1.7.  The two write the same
    values; only floats may be spelled differently (orjson
    ``0.00006103515625`` where ``json`` wrote ``6.103515625e-05``)."""
    return _dumps(value, as_record=False)


def encode_payload(payload: Any) -> bytes:
    """A record's bytes: compact UTF-8 JSON, never an exception.

    A value that is not plain JSON (a set, a date...) is written as its
    ``repr``, and so is a dict with keys JSON cannot have (tuples...) or
    with two keys it writes alike (``1`` and ``"1"``), as a
    whole; a namedtuple is an array, as a tuple.  Non-finite floats become
    null (JSON has no NaN).  A payload that cannot be written at all — a lone
    surrogate, nesting deeper than ``MAX_RECORD_DEPTH``, a ``repr`` that
    raises, an integer too long to print — is written as its dead letter (the
    operation ``dead_letter.RECORD``): one item's bad output must not stop the
    worker writing everybody's.
    """
    try:
        return _dumps(payload, as_record=True)
    except PayloadError as exc:
        return orjson.dumps(dead_letter(RECORD, exc.__cause__ or exc, payload))


def _dumps(payload: Any, *, as_record: bool) -> bytes:
    """Compact UTF-8 JSON: orjson's for plain JSON, else ``json``'s rules — for a record with what JSON lacks
    written as its ``repr`` (``_plain``), for an event with nothing of the kind.  ``PayloadError`` for what
    cannot be written."""
    try:
        return orjson.dumps(payload, option=_NATIVE_ONLY)
    except orjson.JSONEncodeError:  # a type orjson leaves to us, non-string keys, integers beyond 64 bits...
        pass
    try:
        if as_record:
            return json.dumps(_plain(payload, 0), ensure_ascii=False, default=repr, separators=(",", ":")).encode()
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    except PayloadError:
        raise
    except Exception as exc:  # UnicodeEncodeError (a lone surrogate), a repr that raises, a 5000-digit int...
        what = "is not a JSON value" if isinstance(exc, TypeError) and not as_record else "cannot be written as JSON"
        raise PayloadError(f"payload {what}: {type(exc).__name__}: {exc}") from exc


def _plain(value: Any, depth: int) -> Any:
    """``value`` with what ``json`` would get wrong or choke on fixed: non-finite floats as None (``json``
    writes ``NaN``, which is not JSON), dicts with keys it cannot write, or would write twice, as their ``repr``
    (it would raise, or write a key twice, which a reader takes as one),
    nesting beyond ``MAX_RECORD_DEPTH`` refused (it would raise ``RecursionError`` at a depth that depends on
    the stack).  Everything else is left to ``json.dumps(default=repr)``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple, dict)):
        if depth >= MAX_RECORD_DEPTH:
            raise PayloadError(f"payload nests arrays/objects deeper than {MAX_RECORD_DEPTH} levels")
        if not isinstance(value, dict):
            return [_plain(item, depth + 1) for item in value]
        if all(isinstance(key, _JSON_KEYS) for key in value) and _colliding(value) is None:
            return {key: _plain(item, depth + 1) for key, item in value.items()}
        if deeper_than(value, MAX_RECORD_DEPTH - depth):
            raise PayloadError(f"payload nests containers deeper than {MAX_RECORD_DEPTH} levels")
        return repr(value)
    return value
