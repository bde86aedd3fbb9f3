"""Encoding of what crosses process boundaries: topic records, item batches, acks.

Released records carry JSON payloads (``flamestream.core.payload``); workers
turn sink items into serialized topic records (``to_records``).  Batches
between workers and to barriers are pickled lists of envelopes/items: the
channel is internal to the cluster, and pickle keeps payload types exact (a
tuple stays a tuple), which determinism across workers needs — the same item
must look identical whether it was processed locally or arrived over the wire.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterable
from typing import Any

from flamestream.core.item import Item
from flamestream.core.meta import GlobalTime
from flamestream.core.payload import encode_payload
from flamestream.wire import flamestream_pb2 as pb

_ack_random = random.Random()


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
