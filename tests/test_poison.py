"""No input can stall the stream (issue #12): poison balancing results, payloads and records, without a cluster.

Balancing results are folded into int32 or are their item's failure the same way on every path (front, worker,
local runtime, oracle, Spark replay: ``hashing.as_hash``); records are always written (``encode_payload``: a
payload that cannot be becomes its dead letter); events a worker could not handle are refused up front
(``check_payload``), by the front, the SDK and the CLI alike.  The cluster side is ``test_poison_cluster.py``.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flamestream import LocalRuntime, run_oracle
from flamestream.core import payload as payloads
from flamestream.core.dead_letter import MAX_SHOWN_DEPTH, RECORD, dead_letter, is_dead_letter, shown
from flamestream.core.front import stamp_inputs
from flamestream.core.hashing import INT32_MAX, INT32_MIN, BalanceError, as_hash, to_int32
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, entry_hash, front_envelopes
from flamestream.wire import codec
from flamestream.wire import flamestream_pb2 as pb
from tests import poisonfns

ROOT = Path(__file__).resolve().parents[1]


def nested(depth: int, leaf: Any = 1, kind: type = list) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind is list else {"a": value}
    return value


def strict_json(data: bytes) -> Any:
    """orjson reads only standard JSON (no NaN, valid UTF-8): what any consumer can read, and reads it as ``json``
    does, but for integers beyond 64 bits, which it reads as floats (orjson 3.13; ``decode_payload`` uses ``json``
    for them); and no object holds a key twice (which a reader would take as one: orjson keeps the last)."""
    fast = orjson.loads(data)
    value = json.loads(data, object_pairs_hook=payloads.unique_keys)
    assert fast == value or _beyond_64_bits(value)
    return value


def _beyond_64_bits(value: Any) -> bool:
    if isinstance(value, list):
        return any(map(_beyond_64_bits, value))
    if isinstance(value, dict):
        return any(map(_beyond_64_bits, value.values()))
    return type(value) is int and not -(2**63) <= value < 2**64


# -- balancing results ---------------------------------------------------------------------------------------

@given(st.integers())
def test_any_int_folds_to_its_low_32_bits_as_a_signed_number(value: int) -> None:
    h = as_hash(value)
    assert INT32_MIN <= h <= INT32_MAX
    assert (h - value) % (1 << 32) == 0  # two's-complement wrap: congruent modulo 2**32
    assert h == to_int32(value)


def test_fold_examples_bools_and_index_types() -> None:
    assert [as_hash(v) for v in (0, INT32_MAX, INT32_MAX + 1, 2**40 + 7, -(2**40) - 5, -1)] == [
        0, INT32_MAX, INT32_MIN, 7, -5, -1]
    assert (as_hash(True), as_hash(False)) == (1, 0)  # bool is the int it equals

    class Index:
        def __index__(self) -> int:
            return 2**32 + 3

    assert as_hash(Index()) == 3


@pytest.mark.parametrize("value", [None, "x", "1", 3.0, float("nan"), b"1", [1], (1,), {"h": 1}, object()])
def test_anything_but_an_integer_is_a_balance_error(value: Any) -> None:
    with pytest.raises(BalanceError, match="not an integer") as info:
        as_hash(value)
    assert isinstance(info.value, TypeError)
    assert "0x" not in str(info.value)  # no address: the message must be the same in every process


def test_entry_hash_refuses_what_the_front_refuses() -> None:
    plan = compile_graph(poisonfns.carried(balanced_entry=True))
    assert entry_hash(plan, {"k": 0, "hs": [2**40 + 1, 0, 0]}) == 1
    assert entry_hash(plan, {"k": 0, "hs": [None, 0, 0]}) is None
    assert entry_hash(plan, {"k": 0, "hs": [1, float("nan"), 0]}) is None  # the payload itself is refused
    assert entry_hash(plan, {"k": 0}) is None  # KeyError in the balancing function


def test_an_out_of_range_hash_is_kept_by_exactly_one_worker_of_a_replicated_entry() -> None:
    """Before the fold, 2**40 lay in no worker's range: every replicated copy was dropped, the item was lost."""
    plan = compile_graph(poisonfns.carried(balanced_entry=False))
    assert plan.replicated
    layout = Layout.even(3)
    events = [{"k": i, "hs": [0, h, h]} for i, h in enumerate([2**40, -(2**40) - 1, 2**33 + INT32_MAX, 5])]
    stamped = stamp_inputs(events)
    inputs = [(entry_hash(plan, p), (p, gt, trace, False)) for _f, gt, trace, p in stamped]
    released: list[Any] = []
    for index, envelopes in front_envelopes(plan, layout, inputs).items():  # type: ignore[arg-type]
        remote, barrier = Worker(plan, index, layout).process(envelopes)
        assert remote == {}  # each hop's hash equals the grouping's: whoever keeps an item groups it
        released += [payload for payload, *_ in barrier]
    expected, rejected = run_oracle(poisonfns.carried(balanced_entry=False), stamped)
    assert rejected == []
    assert sorted(map(repr, released)) == sorted(repr(p) for _gt, p in expected)
    assert len(released) == len(events)


def test_a_later_balanced_hop_routes_folded_hashes_to_a_real_worker() -> None:
    """Before the fold, ``Layout.owner`` of -2**40 was -1: the local runtime crashed, the cluster used workers[-1]."""
    layout = Layout.even(4)
    plan = compile_graph(poisonfns.carried(balanced_entry=True))
    item = ({"k": 1, "hs": [INT32_MIN, -(2**40) + 1, 0]}, GlobalTime(0, 0), (0,), False)
    assert layout.owner(-(2**40) + 1) == -1  # what the raw result gave
    remote, barrier = Worker(plan, 0, layout).process([(plan.entry, INT32_MIN, item)])
    assert barrier == [] and list(remote) == [2]  # hash 1: worker 2's range
    assert [(op, h) for op, h, _item in remote[2]] == [(1, 1)]  # bound for the hop (operation 1)


results = (st.none() | st.booleans() | st.integers() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=3)
           | st.just("\ud800") | st.lists(st.integers(), max_size=2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hops=st.lists(st.tuples(results, results, results), min_size=1, max_size=25), balanced_entry=st.booleans(),
       workers=st.integers(1, 4), fronts=st.integers(1, 2), seed=st.integers(0, 1000))
def test_runtime_equals_oracle_whatever_the_balancing_functions_return(
        hops: list[tuple[Any, Any, Any]], balanced_entry: bool, workers: int, fronts: int, seed: int) -> None:
    graph = poisonfns.carried(balanced_entry)
    events = [{"k": i, "hs": list(h)} for i, h in enumerate(hops)]
    stamped = stamp_inputs(events, fronts)
    expected, rejected = run_oracle(graph, stamped)
    result = LocalRuntime(graph, workers=workers, fronts=fronts, seed=seed, batch=4, adversarial=seed % 2 == 0
                          ).run(events)
    assert Counter((gt, repr(p)) for gt, _t, p in result.output) == Counter((gt, repr(p)) for gt, p in expected)
    assert sorted(map(repr, result.rejected)) == sorted(map(repr, rejected))  # fronts inject in any order

    def integral(value: Any) -> bool:
        return isinstance(value, int)

    def refused(event: dict[str, Any]) -> bool:
        return payloads.check_payload(event) is not None or (balanced_entry and not integral(event["hs"][0]))

    admitted = [e for e in events if not refused(e)]
    assert [e["k"] for e in rejected] == [e["k"] for e in events if refused(e)]
    letters = Counter(p["dead_letter"]["operation"] for _gt, p in expected if is_dead_letter(p))
    assert letters == Counter("hop" if not integral(e["hs"][1]) else "by_result"
                              for e in admitted if not (integral(e["hs"][1]) and integral(e["hs"][2])))
    assert len(expected) == len(admitted)  # one record per admitted event: its window's keys or its dead letter
    for _gt, p in expected:
        if is_dead_letter(p):
            assert p["dead_letter"]["error"].startswith("BalanceError: balancing function returned ")


def test_the_local_runtime_and_the_oracle_refuse_what_the_sdk_cannot_send() -> None:
    """Events given through the Python API that are no JSON values never reach a cluster (the SDK refuses them):
    the local runtime and the oracle reject them too.  Before, both ran them."""
    events: list[Any] = [{"word": "a"}, {"word": "b", "at": datetime.date(2020, 1, 1)}, {"word": "c", "ids": {1}},
                         {(1, 2): "d"}, {"word": "e", "raw": b"x"}, {"word": "f", 1: "g", "1": "h"}, {"word": "i"}]
    refused = events[1:6]
    for event in refused:
        with pytest.raises(payloads.PayloadError):
            payloads.encode_event(event)
    graph = poisonfns.graph()
    expected, rejected = run_oracle(graph, stamp_inputs(events, 1))
    result = LocalRuntime(graph, workers=2, fronts=1, seed=3).run(events)
    assert rejected == result.rejected == refused
    assert Counter((gt, payloads.encode_payload(p)) for gt, _t, p in result.output) == Counter(
        (gt, payloads.encode_payload(p)) for gt, p in expected)


def test_poison_word_count_on_the_local_runtime_equals_the_oracle() -> None:
    lines = [" ".join(poisonfns.POISON_WORDS[(i + j) % 8] if j % 2 else f"w{(i * j) % 5}" for j in range(7))
             for i in range(40)]
    expected, rejected = run_oracle(poisonfns.graph(), stamp_inputs(lines, 2))
    result = LocalRuntime(poisonfns.graph(), workers=3, fronts=2, seed=7, batch=5, adversarial=True).run(lines)
    assert rejected == result.rejected == []
    records = Counter((gt, payloads.encode_payload(p)) for gt, _t, p in result.output)
    assert records == Counter((gt, payloads.encode_payload(p)) for gt, p in expected)
    for data in records:
        strict_json(data[1])
    letters = [p["dead_letter"] for _gt, p in expected if is_dead_letter(p)]
    assert {d["operation"] for d in letters} == {"grouping0"}  # the record dead letters come at encoding
    assert sorted({d["payload"] for d in letters}) == ["'none'", "'str'"]
    words = Counter(w for line in lines for w in line.split())
    assert len(letters) == words["none"] + words["str"]
    counts = {p["word"]: p["count"] for _gt, p in expected if isinstance(p, dict) and "word" in p}
    assert counts["big"] == words["big"] and counts["neg"] == words["neg"]  # folded hashes keep one bucket


# -- events: check_payload, the SDK's encoding ---------------------------------------------------------------

@pytest.mark.parametrize(("value", "fault"), [
    ("\ud800", "lone surrogate"), (["ok", {"k\udfff": 1}], "lone surrogate"), ({"a": ["x\ud800y"]}, "lone surrogate"),
    (float("nan"), "NaN"), ([1, {"r": float("inf")}], "Infinity"), ((float("-inf"),), "-Infinity"),
    (nested(65), "deeper than 64"), (nested(65, kind=dict), "deeper than 64"),
])
def test_check_payload_names_what_workers_could_not_handle(value: Any, fault: str) -> None:
    message = payloads.check_payload(value)
    assert message is not None and fault in message
    with pytest.raises(payloads.PayloadError, match=fault):
        payloads.encode_event(value)


@pytest.mark.parametrize("value", ["мяч", "", 2**200, 1.5, None, True, [1, "a", {"b": None}], nested(64),
                                   nested(64, kind=dict), {1: "x"}, ("a", 1)])
def test_check_payload_accepts_the_rest(value: Any) -> None:
    assert payloads.check_payload(value) is None
    assert payloads.encode_event(value) == payloads.encode_payload(value)


@pytest.mark.parametrize("value", [{3}, b"bytes", datetime.datetime(2020, 1, 1), {(1, 2): 3}, [1, object()],
                                   {"text": frozenset({1, 2})}])
def test_an_event_that_is_not_a_json_value_is_refused_not_written_as_its_repr(value: Any) -> None:
    """A record that is not JSON is written as its ``repr`` (business logic ran; refusing is too late), but an
    event still has its client: the string ``"{3}"`` in place of the set it pushed would be silently wrong."""
    with pytest.raises(payloads.PayloadError, match="not a JSON value"):
        payloads.encode_event(value)
    assert payloads.encode_payload(value)  # the record's rule is unchanged


@pytest.mark.parametrize("value", [{1: "a", "1": "b"}, [{"x": {True: 1, "true": 2}}], {None: 0, "null": 1},
                                   {1.5: 0, "1.5": 1}])
def test_an_event_whose_keys_json_writes_alike_is_refused(value: Any) -> None:
    """``json`` would write ``{"1":"a","1":"b"}``, and every reader keeps one of the two: a value dropped
    without a word.  Before: written with the key twice."""
    assert "two keys written as" in (payloads.check_payload(value) or "")
    with pytest.raises(payloads.PayloadError, match="two keys written as"):
        payloads.encode_event(value)


def test_a_record_whose_keys_json_writes_alike_is_its_repr() -> None:
    value = {1: "a", "1": "b"}
    assert strict_json(payloads.encode_payload(value)) == repr(value)
    assert strict_json(payloads.encode_payload({1: "a", 2: "b"})) == {"1": "a", "2": "b"}  # no collision: JSON


@pytest.mark.parametrize("text", [b'{"a":1,"a":2}', b'[{"k":{"x":1,"y":2,"x":3}}]'])
def test_a_json_event_with_a_key_twice_is_refused(text: bytes) -> None:
    with pytest.raises(payloads.PayloadError, match="twice in one object"):
        payloads.decode_event(text)
    assert payloads.decode_event(b'{"a":1,"b":{"a":2}}') == {"a": 1, "b": {"a": 2}}  # the same key in two objects


def test_a_key_twice_is_named_short_and_writable() -> None:
    """The message goes back to the client as gRPC status details: a megabyte key, or one with a lone surrogate,
    must not make it unwritable."""
    key = "\\ud800" + "k" * 100_000
    with pytest.raises(payloads.PayloadError) as raised:
        payloads.decode_event(f'{{"{key}": 1, "{key}": 2}}'.encode())
    message = str(raised.value)
    assert len(message) < 200 and message.encode("utf-8")


def test_check_payload_survives_cycles_and_shared_structure() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    assert "deeper than" in (payloads.check_payload(cycle) or "")
    shared: Any = []
    for _ in range(60):
        shared = [shared, shared]  # 2**60 paths, 61 containers
    assert payloads.check_payload(shared) is None
    assert payloads.check_payload(nested(10**5)) is not None  # no RecursionError


def test_decoded_events_are_checked_like_any_value() -> None:
    for text in (b'["\\ud800"]', b"[NaN]", b"Infinity", b"1e999", b"[" * 65 + b"]" * 65):
        assert payloads.check_payload(payloads.decode_payload(text)) is not None, text
    assert payloads.check_payload(payloads.decode_payload(b"[" * 64 + b"]" * 64)) is None


# -- records: encode_payload never raises ----------------------------------------------------------------------

def test_records_of_values_json_cannot_hold() -> None:
    assert payloads.encode_payload({("a", 1): 1}) == json.dumps(repr({("a", 1): 1})).encode()  # its repr
    assert payloads.encode_payload({"x": [float("nan"), float("inf")]}) == b'{"x":[null,null]}'
    assert payloads.encode_payload([2**70, float("nan")]) == f"[{2**70},null]".encode()  # the json path too
    assert payloads.encode_payload(nested(254)) == b"[" * 254 + b"1" + b"]" * 254
    assert payloads.encode_payload([2**70, nested(253)]) == f"[{2**70},".encode() + b"[" * 253 + b"1" + b"]" * 254


@pytest.mark.parametrize(("value", "error"), [
    (["\ud800"], "UnicodeEncodeError"), ({"w": "a\udc80"}, "UnicodeEncodeError"),
    (nested(255), "deeper than 254"), ([2**70, nested(254)], "deeper than 254"), (nested(5000), "deeper than 254"),
    (10**5000, "ValueError"),
], ids=["surrogate", "surrogate-in-dict", "depth-255", "depth-255-json-path", "depth-5000", "5001-digit-int"])
def test_unwritable_records_become_their_dead_letter(value: Any, error: str) -> None:
    letter = strict_json(payloads.encode_payload(value))["dead_letter"]
    assert letter["operation"] == RECORD
    assert error in letter["error"]


def test_a_dead_letter_is_always_writable() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    class Loud(Exception):
        def __str__(self) -> str:
            return "bad \ud800 message"

    letter = dead_letter("op", Loud(), ["\ud800", Broken()])["dead_letter"]
    assert letter["error"] == "Loud: bad \\ud800 message"
    assert letter["payload"] == "<list whose repr failed: RuntimeError>"
    strict_json(payloads.encode_payload(dead_letter("op", Loud(), "\ud800")))
    assert shown(nested(MAX_SHOWN_DEPTH + 1)) == f"<list nested deeper than {MAX_SHOWN_DEPTH} levels>"
    assert shown(nested(MAX_SHOWN_DEPTH)) == repr(nested(MAX_SHOWN_DEPTH))


leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(max_size=4)
          | st.sampled_from(["\ud800", "a\udfffb", float("nan")]) | st.dates())
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                      | st.dictionaries(st.text(max_size=2) | st.integers() | st.tuples(st.integers()), inner,
                                        max_size=3) | st.frozensets(st.integers(), max_size=2), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(values)
@example(-(2**63) - 1)  # orjson reads it as a float (found by hypothesis)
@example([2**64, {"k": -(2**70)}])
def test_every_value_becomes_standard_json(value: Any) -> None:
    data = payloads.encode_payload(value)
    decoded = strict_json(data)  # valid UTF-8, no NaN: any consumer can read it
    assert payloads.decode_payload(data) == decoded
    if payloads.check_payload(value) is None:  # the SDK sends what a worker would write
        assert plain_json(value)
        assert payloads.encode_event(value) == data
    else:
        with pytest.raises(payloads.PayloadError):
            payloads.encode_event(value)


json_leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text()
               | st.integers(min_value=-(10**21), max_value=10**21) | st.integers(min_value=10**17).map(str)
               | st.sampled_from(["\ud800", "a\udfffb", -0.0, 2**63, -(2**63) - 1, 2**64]))
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=12)


def _reads_as_json(decode: Callable[[bytes], Any], data: bytes, hook: Any = None) -> None:
    """``decode(data)`` is exactly what ``json.loads`` reads with ``object_pairs_hook=hook`` (``repr``: 1 and 1.0,
    0.0 and -0.0 differ), or a ``PayloadError`` where ``json`` refuses the bytes."""
    try:
        expected = repr(json.loads(data, object_pairs_hook=hook))
    except (ValueError, RecursionError):  # a PayloadError from the hook (a key twice) is a ValueError
        with pytest.raises(payloads.PayloadError):
            decode(data)
        return
    assert repr(decode(data)) == expected


@settings(max_examples=500, deadline=None)
@given(json_values, st.booleans(), st.sampled_from([None, 1]))
def test_a_payload_decodes_to_what_json_reads(value: Any, ascii_only: bool, indent: int | None) -> None:
    """orjson decodes first (``decode_payload``): the value must be json's exactly, big integers and all."""
    _reads_as_json(payloads.decode_payload,
                   json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
@example(b"\xef\xbb\xbf[1]")  # a byte order mark: json skips it, orjson refuses
@example(b" [1.5e400, NaN, -Infinity] ")
@example(b'{"a": 1, "a": 2, "b": "\\ud800"}')
@example(b"-18446744073709551617")
@example(b'"12345678901234567890"')
@example(b"[1,]")
def test_any_bytes_decode_as_json_decodes_them(data: bytes) -> None:
    _reads_as_json(payloads.decode_payload, data)


@settings(max_examples=300, deadline=None)
@given(json_values | st.binary(max_size=24))
@example(b'"a line of words"')
@example(b'{"a": 1, "a": 2}')
@example(b' [{"k": 1, "k": 1}]')  # white space first: not seen as an array before decoding
@example(b"123456789012345678901")
def test_an_event_decodes_to_what_json_reads(value: Any) -> None:
    """orjson first for events too (``decode_event``): the value ``json`` reads with the duplicate-key check,
    and a ``PayloadError`` for what it refuses (a key twice, not JSON)."""
    data = value if isinstance(value, bytes) else json.dumps(value).encode("utf-8", "surrogatepass")
    _reads_as_json(payloads.decode_event, data, payloads.unique_keys)


def plain_json(value: Any) -> bool:
    """Whether ``json`` writes ``value`` without a ``default``: JSON's types, tuples as arrays, and keys it turns
    into strings."""
    if value is None or isinstance(value, str | int | float):
        return True
    if isinstance(value, list | tuple):
        return all(map(plain_json, value))
    if isinstance(value, dict):
        return all(isinstance(k, str | int | float) or k is None for k in value) and all(map(plain_json,
                                                                                                value.values()))
    return False


def test_to_records_writes_a_dead_letter_for_the_one_bad_item_only() -> None:
    gt = GlobalTime(3, 0)
    records = codec.to_records([({"w": "ok"}, gt, (0,), False), (["\ud800"], gt, (1,), False),
                                ({(1, 2): 3}, gt, (2,), False), (nested(300), gt, (3,), True)])
    assert [r[1:] for r in records] == [(gt, (0,), False), (gt, (1,), False), (gt, (2,), False), (gt, (3,), True)]
    data = [pb.Record.FromString(r[0]).payload if r[0] is not None else None for r in records]
    assert data[0] == b'{"w":"ok"}'
    assert strict_json(data[1])["dead_letter"]["operation"] == RECORD
    assert strict_json(data[2]) == "{(1, 2): 3}"
    assert data[3] is None  # a tombstone carries no record


# -- the CLI ------------------------------------------------------------------------------------------------

def flamestream(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, input=stdin, capture_output=True,
                          timeout=120)


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (("push",), b"fine\n\xff\xfe\n", "stdin line 2"),
    (("push", "--json"), b'"fine"\n' + b"[" * 900 + b"]" * 900 + b"\n", "stdin line 2: payload nests"),
    (("push", "--json"), b"[" * 100_000 + b"]" * 100_000 + b"\n", "stdin line 1 is not valid JSON"),
    (("push", "--json"), b"1\n2\n[NaN]\n", "stdin line 3: payload holds NaN"),
    (("push", "--json"), b'"\\ud800"\n', "stdin line 1: payload holds a lone surrogate"),
    (("push", "--json"), b'{"a": 1}\n{"a": 1, "a": 2}\n', "stdin line 2: payload has the key 'a' twice"),
], ids=["invalid-utf8", "depth-900", "depth-100000", "nan", "lone-surrogate", "key-twice"])
def test_cli_push_names_the_bad_line_in_one_line(args: tuple[str, ...], stdin: bytes, message: str) -> None:
    done = flamestream(*args, "--zookeeper", "127.0.0.1:1", stdin=stdin)  # refused before any cluster is looked up
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert message in err and "nothing was pushed" in err


def test_cli_push_names_invalid_utf8_in_a_file(tmp_path: Path) -> None:
    source = tmp_path / "events.txt"
    source.write_bytes(b"a\nb\nc \xff d\n")
    done = flamestream("push", str(source), "--zookeeper", "127.0.0.1:1")
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert f"{source} line 3 is not valid utf-8" in err


def test_cli_run_prints_standard_json_and_the_records_the_cluster_would_write(tmp_path: Path) -> None:
    source = tmp_path / "lines.txt"
    source.write_text("a none tuple nan\nlone deep big a\ntuple str neg nan\n")
    outputs = []
    for mode in (("--workers", "3", "--seed", "2"), ("--oracle",)):
        done = flamestream("run", "tests/poisonfns.py", "--input", str(source), *mode)
        assert done.returncode == 0, done.stderr.decode()
        lines = done.stdout.decode().splitlines()
        outputs.append(sorted(lines))
        records = [strict_json(line.encode()) for line in lines]  # NaN would not parse: it is null
        assert {"word": "nan", "count": 2, "ratio": None} in records
        assert "{('tuple', 2): 2}" in records
        assert sum(1 for r in records if isinstance(r, dict) and r.get("dead_letter", {}).get("operation") == RECORD
                   ) == 2  # lone, deep
    assert outputs[0] == outputs[1]
    expected, _ = run_oracle(poisonfns.graph(), stamp_inputs(source.read_text().splitlines()))
    assert outputs[1] == sorted(json.dumps(payloads.decode_payload(payloads.encode_payload(p)), ensure_ascii=False)
                                for _gt, p in expected)


def test_cli_run_names_invalid_utf8_without_a_traceback(tmp_path: Path) -> None:
    source = tmp_path / "lines.txt"
    source.write_bytes(b"a b\n\xc3\x28\n")
    done = flamestream("run", "tests/poisonfns.py", "--input", str(source))
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1 and "not valid utf-8" in err, err


def test_nan_is_never_written() -> None:
    for value in (float("nan"), [float("nan")], {"a": float("-inf")}, [2**70, {"x": float("inf")}]):
        assert b"NaN" not in payloads.encode_payload(value) and b"Infinity" not in payloads.encode_payload(value)
