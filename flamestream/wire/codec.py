"""Encoding of what crosses process boundaries: topic records, item batches, acks, and requests.

Released records carry JSON payloads (``flamestream.core.payload``); workers
turn sink items into serialized topic records (``to_records``).

Item batches (``ItemBatch.items``: envelopes between workers, items to
barriers) used to be pickles, and unpickling runs whatever callable a crafted
batch names (issue #12): anyone who reached a worker's or a barrier's port
could run code there, and garbage bytes raised in a worker's processing loop,
which stops the node.  Now a batch is flattened into columns of plain values —
operation indexes, hashes, payloads, the batch's distinct global times as
pairs of ints, a time index per item, traces, tombstone flags — and written
with ``flamestream.core.values``: C-speed pickling of plain values only, read
back by an unpickler that resolves no global, so decoding can build plain
values and nothing else.  Payloads keep their exact types (a tuple stays a
tuple; big ints, dicts with non-string keys, NaN), which determinism across
workers needs: an item must look identical whether it was processed locally
or arrived over the wire.  So a payload that is not a plain value (a
namedtuple, a user's class) can no longer cross a process boundary:
``encode_batch`` raises ``BatchError`` naming its type.

Why columns: no ``GlobalTime`` is pickled per item (pickle reduced each one
through ``copyreg``, the costliest part of encoding a batch), and the
per-item work — flattening, then checking and rebuilding on receipt — is one
loop each in ``flamestream.core.columns``, compiled with the core.
``bench/codec.py`` measures the codec against pickle on real traffic: with the
compiled core it is faster on word count (0.71-0.83x pickle's time) and on a
par on the inverted index (0.89-1.05x over four runs), with the pure-Python
fallback slower (1.2x and 1.6x).

Why the decoders check: a receiver must refuse a bad batch (``BatchError``, a
``ValueError`` with the reason), never raise on it — an exception in a
worker's processing loop stops the node.  What they check is
``columns.items_of``'s to say; what needs the graph or the tick (is the
operation one of the graph's, does this barrier own the partition) is the
receiver's to check.  Payloads are any plain values and are not walked: on the
inverted index's worker-to-worker batches that walk cost half as much again as
the rest of the codec, and what business logic and records make of odd
payloads is ``flamestream.core.payload``'s concern.
"""

from __future__ import annotations

import inspect
import random
import reprlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from flamestream.core import columns, values
from flamestream.core.item import Envelope, Item
from flamestream.core.meta import GlobalTime
from flamestream.core.payload import encode_payload
from flamestream.wire import flamestream_pb2 as pb

_ack_random = random.Random()


def to_records(items: list[Item]) -> list[Item]:
    """Items bound for a barrier, their payloads replaced by the topic records they become (tombstones: none).

    Workers encode, so the barrier — one per partition, on every record's
    path — only stores and appends bytes; the encoding is spread over the
    workers and happens while the barrier still waits for the min time.
    Encoding never raises (``encode_payload``): a payload that cannot be written
    becomes its dead letter, because an exception here would stop the worker
    after the acker counted the item, and the stream would never release again.

    The record's bytes are written here, not by building a ``pb.Record`` each:
    that took 4.4 of the 5.2 us a record cost (3,000 changelog records), for two
    length-delimited fields.  They are the bytes ``pb.Record(time=...,
    payload=...).SerializeToString()`` gives, byte for byte (``tests/test_wire.py``):
    a recovery matches re-released records against the topic's by their bytes.
    """
    times: dict[GlobalTime, bytes] = {}
    out: list[Item] = []
    for payload, gt, trace, tombstone in items:
        if tombstone:
            out.append((None, gt, trace, True))
            continue
        time = times.get(gt)
        if time is None:
            encoded = pb.GlobalTime(ts=gt.ts, front=gt.front).SerializeToString()
            time = times[gt] = _TIME_TAG + columns.varint(len(encoded)) + encoded
        data = encode_payload(payload)
        out.append((time + _PAYLOAD_TAG + columns.varint(len(data)) + data if data else time, gt, trace, False))
    return out


_TIME_TAG, _PAYLOAD_TAG = b"\x1a", b"\x22"
"""``Record.time`` (field 3) and ``Record.payload`` (field 4), both length-delimited (wire type 2)."""


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


class BatchError(ValueError):
    """An item batch that cannot be written, or must not be taken: a sender's bug or a crafted message."""


_EMPTY, _ENVELOPES, _ITEMS, _MALFORMED = 0, 1, 2, 3
"""The first value of an encoded batch: what the columns after it are (the number doubles as a format version).

Envelopes: (1, operation indexes, hashes, payloads, times, time indexes, traces, tombstones).
Items: (2, payloads, times, time indexes, traces, tombstones).  Times are the batch's distinct global times as a
flat list of (timestamp, front) ints, and each item's time an index into them (``columns.flatten``).  Decoding
builds one ``GlobalTime`` per distinct time, where unpickling built one per ``GlobalTime`` object sent (through
``copyreg``, the slowest part of pickling a batch).  Run lengths instead of indexes measured no better overall:
items of different times interleave in barrier batches."""

_SIZES = {_EMPTY: 1, _ENVELOPES: 8, _ITEMS: 6, _MALFORMED: 2}
_KINDS = {_ENVELOPES: "envelopes", _ITEMS: "items"}


def encode_batch(entries: list[Any], acks: dict[GlobalTime, int], sender: int, tick: int) -> pb.ItemBatch:
    """One message of envelopes (to a worker) or items (to a barrier) with the acks of their sending, from
    ``sender`` running tick ``tick``.

    ``BatchError`` if a payload is not a plain value (see the module docstring).
    Entries that are neither all envelopes nor all items are not refused here:
    what is wrong with them is written instead, and every decoder refuses
    that — a sender's bug shows up at the receiver the way a crafted batch
    does, through the one path that must handle both.
    """
    flat = columns.flatten(entries if type(entries) is list else list(entries))  # compiled, it takes lists only
    if flat is None:
        body: tuple[Any, ...] = (_MALFORMED, _misshapen(entries))
    elif not entries:
        body = (_EMPTY,)
    elif flat[0]:
        body = (_ENVELOPES, *flat[1:])
    else:
        body = (_ITEMS, *flat[3:])
    return pb.ItemBatch(items=_encode(body), acks=ack_messages(acks), sender=sender, tick=tick)


def _encode(body: tuple[Any, ...]) -> bytes:
    try:
        return values.encode(body)  # one definition of "plain", and of when the memo is needed
    except ValueError as exc:
        raise BatchError(f"cannot encode the batch: {exc}") from exc


def _misshapen(entries: list[Any]) -> str:
    """What keeps ``entries`` from being all envelopes or all items (only called once they are not)."""
    kinds: dict[str, Any] = {}
    for entry in entries:
        item = entry[2] if isinstance(entry, tuple | list) and len(entry) == 3 else entry
        if not (isinstance(item, tuple | list) and len(item) == 4 and type(item[1]) is GlobalTime):
            return ("not an envelope (operation, hash, item) nor an item (payload, GlobalTime, trace, tombstone): "
                    f"{_shown(entry)}")
        kinds.setdefault("envelopes" if item is not entry else "items", entry)
    return f"envelopes and items mixed: {_shown(kinds.get('envelopes'))} and {_shown(kinds.get('items'))}"


def _shown(value: Any) -> str:
    try:
        return reprlib.repr(value)  # bounded in size and depth
    except Exception as exc:  # a user type whose __repr__ raises
        return f"<{type(value).__name__} whose repr failed: {type(exc).__name__}>"


def decode_batch(batch: pb.ItemBatch) -> tuple[list[Any], dict[GlobalTime, int]]:
    """Envelopes or items, whichever ``batch`` holds, and its acks; ``BatchError`` for anything else.

    For tests and tools that see both kinds; the receivers use ``decode_envelopes`` and ``decode_items``,
    which also refuse the other kind.
    """
    return _decode(batch.items, None), acks_of(batch.acks)


def decode_envelopes(batch: pb.ItemBatch) -> tuple[list[Envelope], dict[GlobalTime, int]]:
    """What a worker receives: envelopes (operation index >= 0, an int32 hash or None, item) and the acks."""
    return _decode(batch.items, _ENVELOPES), acks_of(batch.acks)


def decode_items(batch: pb.ItemBatch) -> tuple[list[Item], dict[GlobalTime, int]]:
    """What a barrier receives: items whose payload is a serialized record, or None for a tombstone, and the acks
    (``columns.items_of``: the records add up to no more bytes than the message); the batch must name its tick."""
    if not batch.HasField("tick"):
        raise BatchError("an item batch to a barrier must name its sender's tick")
    return _decode(batch.items, _ITEMS), acks_of(batch.acks)


def _decode(data: bytes, want: int | None) -> list[Any]:
    try:
        body = values.decode(data)
    except ValueError as exc:
        raise BatchError(f"not an item batch: {exc}") from None
    if type(body) is not tuple or not body or type(body[0]) is not int or _SIZES.get(body[0]) != len(body):
        raise BatchError(f"not an item batch: {reprlib.repr(body)}")
    kind = body[0]
    if kind == _EMPTY:
        return []
    if kind == _MALFORMED:
        why = body[1][:500] if type(body[1]) is str else _shown(body[1])  # what _misshapen wrote, if it is
        raise BatchError(f"the sender's entries are neither all envelopes nor all items: {why}")
    if want is not None and kind != want:
        raise BatchError(f"{_KINDS[kind]} where {_KINDS[want]} belong")
    try:
        if kind == _ENVELOPES:
            return columns.envelopes_of(*body[1:])
        payloads, times, time_of, traces, tombstones = body[1:]
        return columns.items_of(payloads, times, time_of, traces, tombstones, len(data) if want == _ITEMS else -1)
    except columns.MalformedColumns as exc:
        raise BatchError(str(exc)) from None
    except Exception as exc:  # a check missed a shape: still the batch's fault, never the receiver's crash
        raise BatchError(f"malformed item batch: {exc!r}") from None


# -- requests ------------------------------------------------------------------------------------------------------

_METHOD_HANDLERS = {(False, False): grpc.unary_unary_rpc_method_handler,
                    (True, False): grpc.stream_unary_rpc_method_handler,
                    (False, True): grpc.unary_stream_rpc_method_handler,
                    (True, True): grpc.stream_stream_rpc_method_handler}


def add_servicer(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor | Any) -> None:
    """Serve ``servicer``'s implementation of ``service`` on ``server``, parsing requests inside each call.

    Why not the generated ``add_*Servicer_to_server``: they parse a request
    before its call starts, so bytes that are not a request message end the
    call with gRPC's UNKNOWN ("Unexpected <class DecodeError>"), and on a
    ``--tls`` node before ``AuthInterceptor`` has checked the caller.  Here the
    server hands the call raw bytes, and the call parses them once the caller
    is checked: what does not parse ends its own call with INVALID_ARGUMENT
    naming the method and the message type.  Handlers see the same messages as
    before.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        path = f"/{service.full_name}/{method.name}"
        parse = message_factory.GetMessageClass(method.input_type).FromString
        handler = _parsing(getattr(servicer, method.name), _parser(parse, path, method.input_type.full_name),
                           method.client_streaming, method.server_streaming)
        handlers[method.name] = _METHOD_HANDLERS[method.client_streaming, method.server_streaming](
            handler, request_deserializer=None, response_serializer=_serialized)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _serialized(response: Message | bytes) -> bytes:
    """A handler's response as bytes: a message serialized, or bytes a handler already serialized itself (the
    barrier's ``Subscribe`` builds its ``RecordBatch`` messages from stored records: ``columns.record_batch``)."""
    return response if isinstance(response, bytes) else response.SerializeToString()


_Context = grpc.aio.ServicerContext[Any, Any]
_Parse = Callable[[bytes, _Context], Any]


def not_a_message(path: str, kind: str, exc: DecodeError) -> str:
    """Why a request of ``path`` was refused as undecodable (``kind``: its message type's full name): the same
    words over gRPC and over frames."""
    return f"{path}: the request is not a {kind} message ({exc})"


def _parser(parse: Callable[[bytes], Message], path: str, kind: str) -> _Parse:
    async def parsed(data: bytes, context: _Context) -> Message:
        try:
            return parse(data)
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, not_a_message(path, kind, exc))
    return parsed


def _parsing(behavior: Callable[..., Any], parse: _Parse, streaming_request: bool, streaming_response: bool) -> Any:
    """``behavior`` taking the raw request (or stream of them) and parsing it (them) first."""

    async def parsed_stream(raw: AsyncIterator[bytes], context: _Context) -> AsyncIterator[Message]:
        async for data in raw:
            yield await parse(data, context)

    async def request_of(raw: Any, context: _Context) -> Any:
        return parsed_stream(raw, context) if streaming_request else await parse(raw, context)

    async def answer(raw: Any, context: _Context) -> Any:
        result = behavior(await request_of(raw, context), context)
        return await result if inspect.isawaitable(result) else result

    async def stream(raw: Any, context: _Context) -> AsyncIterator[Any]:
        result = behavior(await request_of(raw, context), context)
        if hasattr(result, "__aiter__"):
            async for reply in result:
                yield reply
        else:  # a handler writing with context.write (the health service's Watch)
            await result

    return stream if streaming_response else answer
