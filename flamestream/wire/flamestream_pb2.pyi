from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GlobalTime(_message.Message):
    __slots__ = ("ts", "front")
    TS_FIELD_NUMBER: _ClassVar[int]
    FRONT_FIELD_NUMBER: _ClassVar[int]
    ts: int
    front: int
    def __init__(self, ts: _Optional[int] = ..., front: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("payload", "producer", "sequence")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    producer: str
    sequence: int
    def __init__(self, payload: _Optional[bytes] = ..., producer: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("admitted", "times")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    admitted: _containers.RepeatedScalarFieldContainer[bool]
    times: _containers.RepeatedCompositeFieldContainer[GlobalTime]
    def __init__(self, admitted: _Optional[_Iterable[bool]] = ..., times: _Optional[_Iterable[_Union[GlobalTime, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ts", "front", "xor")
    TS_FIELD_NUMBER: _ClassVar[int]
    FRONT_FIELD_NUMBER: _ClassVar[int]
    XOR_FIELD_NUMBER: _ClassVar[int]
    ts: int
    front: int
    xor: int
    def __init__(self, ts: _Optional[int] = ..., front: _Optional[int] = ..., xor: _Optional[int] = ...) -> None: ...

class ItemBatch(_message.Message):
    __slots__ = ("items", "acks", "sender", "tick")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    items: bytes
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    sender: int
    tick: int
    def __init__(self, items: _Optional[bytes] = ..., acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ..., sender: _Optional[int] = ..., tick: _Optional[int] = ...) -> None: ...

class FramesPort(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("front", "ts")
    FRONT_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    front: int
    ts: int
    def __init__(self, front: _Optional[int] = ..., ts: _Optional[int] = ...) -> None: ...

class AckBatch(_message.Message):
    __slots__ = ("acks", "report", "tick")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    TICK_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    report: Report
    tick: int
    def __init__(self, acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., tick: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("partition", "from_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    from_offset: int
    def __init__(self, partition: _Optional[int] = ..., from_offset: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("partition", "offset", "time", "payload")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    time: GlobalTime
    payload: bytes
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., time: _Optional[_Union[GlobalTime, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class RecordBatch(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("group", "partition", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    partition: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommittedRequest(_message.Message):
    __slots__ = ("group", "partition")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    group: str
    partition: int
    def __init__(self, group: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class Offset(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class BarrierStats(_message.Message):
    __slots__ = ("received", "released", "retractions")
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    RETRACTIONS_FIELD_NUMBER: _ClassVar[int]
    received: int
    released: int
    retractions: int
    def __init__(self, received: _Optional[int] = ..., released: _Optional[int] = ..., retractions: _Optional[int] = ...) -> None: ...
