"""Payload JSON: the public format of events and released records.

Pure (no I/O), so the local runtime, the oracle, the services and the SDK all
encode a payload the same way: the bytes a consumer reads do not depend on
where the record was produced.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


class PayloadError(ValueError):
    """A client payload is not a JSON value."""


_NATIVE_ONLY = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
"""orjson writes only plain JSON types itself (several times faster than ``json``, and workers encode every
record); everything else takes the ``json`` path, as before orjson."""


def decode_payload(data: bytes) -> Any:
    """A payload's JSON value: Python's ``json``, which keeps integers of any size exact (orjson reads those
    beyond 64 bits as floats) and accepts NaN."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, integers too long, nesting too deep
        raise PayloadError(f"payload is not valid JSON: {exc}") from exc


def encode_payload(payload: Any) -> bytes:
    """Compact UTF-8 JSON; a value that is not plain JSON (a set, a namedtuple...) is written as its ``repr``.

    Non-finite floats become null (JSON has no NaN).
    """
    try:
        return orjson.dumps(payload, option=_NATIVE_ONLY)
    except orjson.JSONEncodeError:  # a type orjson leaves to us, non-string keys, integers beyond 64 bits
        return json.dumps(payload, ensure_ascii=False, default=repr, separators=(",", ":")).encode()
