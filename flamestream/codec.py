"""Encoding of what crosses process boundaries: payloads, item batches, acks.

Client payloads and released records are JSON (the public format); workers
turn sink items into serialized topic records (``to_records``).  Batches
between workers and to barriers are pickled lists of envelopes/items: the
channel is internal to the cluster, and pickle keeps payload types exact (a
tuple stays a tuple), which determinism across workers needs — the same item
must look identical whether it was processed locally or arrived over the wire.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Iterable
from typing import Any

import orjson

from flamestream.item import Item
from flamestream.meta import GlobalTime
from flamestream.wire import flamestream_pb2 as pb

_ack_random = random.Random()


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


def to_records(items: list[Item]) -> list[Item]:
    """Items bound for a barrier, their payloads replaced by the topic records they become (tombstones: none).

    Workers encode, so the barrier — one per partition, on every record's
    path — only stores and appends bytes; the encoding is spread over the
    workers and happens while the barrier still waits for the min time.
    """
    times: dict[GlobalTime, pb.GlobalTime] = {}
    out: list[Item] = []
    for payload, gt, trace, tombstone in items:
        if tombstone:
            out.append((None, gt, trace, True))
            continue
        time = times.get(gt)
        if time is None:
            time = times[gt] = pb.GlobalTime(ts=gt.ts, front=gt.front)
        out.append((pb.Record(time=time, payload=encode_payload(payload)).SerializeToString(), gt, trace, False))
    return out


def new_acks(times: Iterable[GlobalTime]) -> dict[GlobalTime, int]:
    """One fresh random 64-bit ack value per global time of a batch about to be sent."""
    return {gt: _ack_random.getrandbits(64) for gt in times}


def xor_into(total: dict[GlobalTime, int], acks: dict[GlobalTime, int]) -> None:
    """Combine acks so one message carries a whole processing step (receives and sends at once)."""
    for gt, value in acks.items():
        total[gt] = total.get(gt, 0) ^ value


def ack_messages(acks: dict[GlobalTime, int]) -> list[pb.Ack]:
    return [pb.Ack(ts=gt.ts, front=gt.front, xor=value) for gt, value in acks.items() if value]


def acks_of(messages: Iterable[pb.Ack]) -> dict[GlobalTime, int]:
    return {GlobalTime(a.ts, a.front): a.xor for a in messages}


def encode_batch(entries: list[Any], acks: dict[GlobalTime, int], sender: int) -> pb.ItemBatch:
    return pb.ItemBatch(items=pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL), acks=ack_messages(acks),
                        sender=sender)


def decode_batch(batch: pb.ItemBatch) -> tuple[list[Any], dict[GlobalTime, int]]:
    return pickle.loads(batch.items), acks_of(batch.acks)
