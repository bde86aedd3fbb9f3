"""A front's input-log records read back exactly as they were written.

Everything downstream of the log trusts it: a restarted front's producer
table, a recovery's re-send, the oracle and Spark replay.  The fuzz test
found a record that did not: an event ``99999999999999999999`` was read back
by orjson as the float ``1e+20``, so the oracle saw another event than the
workers had (``decode_record``).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flamestream.core.meta import GlobalTime
from flamestream.storage.input_log import decode_record, encode_record

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**40), 10**40), st.text(max_size=30),
              st.floats(allow_nan=False, allow_infinity=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (an int read back as a float equals it, but is not it)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(payload=json_values, producer=st.text(max_size=10), sequence=st.integers(0, 2**63 - 1))
def test_a_record_reads_back_exactly(payload: Any, producer: str, sequence: int) -> None:
    record = decode_record(encode_record(GlobalTime(1_795_562_151_188, 3), 17, payload, producer, sequence))
    assert same(record, {"ts": 1_795_562_151_188, "front": 3, "seq": 17, "producer": producer,
                         "sequence": sequence, "payload": payload})


def test_integers_beyond_64_bits_stay_integers() -> None:
    for payload in (99999999999999999999, -9223372036854775809, [18446744073709551616, {"n": 10**30}]):
        assert same(decode_record(encode_record(GlobalTime(1, 0), 0, payload))["payload"], payload)
    assert same(decode_record(encode_record(GlobalTime(1, 0), 0, "9" * 40))["payload"], "9" * 40)


def test_the_nan_older_fronts_wrote_is_read() -> None:
    record = decode_record(b'{"ts":1,"front":0,"seq":0,"producer":"","sequence":0,"payload":[NaN,1]}')
    assert math.isnan(record["payload"][0]) and record["payload"][1] == 1
