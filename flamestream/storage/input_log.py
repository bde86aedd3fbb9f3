"""The fronts' durable input log: the record format and a reader.

Every admitted event is appended (and fsynced) before the client hears back,
with the global time and per-millisecond sequence number the front stamped on
it.  Those three numbers rebuild the item exactly — global time (ts, front) and
initial trace ``(seq,)`` — so replaying the log (the oracle check, Spark replay,
recovery) reproduces the stream's deterministic output.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flamestream.core.front import Stamped
from flamestream.core.meta import GlobalTime
from flamestream.storage.log import SegmentedLog


def encode_record(gt: GlobalTime, seq: int, payload: Any, producer: str = "", sequence: int = 0) -> bytes:
    return json.dumps({"ts": gt.ts, "front": gt.front, "seq": seq, "producer": producer, "sequence": sequence,
                       "payload": payload}, ensure_ascii=False, separators=(",", ":")).encode()


def decode_record(data: bytes) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(data)
    return record


def front_log_dir(data_dir: Path, front: int) -> Path:
    return data_dir / "input" / f"front-{front}"


def read_input_log(directory: Path) -> Iterator[Stamped]:
    """Stamped events of one front's input log, in the order they were admitted."""
    log = SegmentedLog(directory, readonly=True)
    try:
        for _, data in log.scan():
            r = decode_record(data)
            yield r["front"], GlobalTime(r["ts"], r["front"]), (r["seq"],), r["payload"]
    finally:
        log.close()


def read_input_logs(data_dir: Path) -> list[Stamped]:
    """Every front's input log under a cluster data dir (``DIR/input/front-<id>``) or its ``input`` dir."""
    base = data_dir / "input" if (data_dir / "input").is_dir() else data_dir
    stamped: list[Stamped] = []
    for directory in sorted(p for p in base.glob("front-*") if p.is_dir()):
        stamped.extend(read_input_log(directory))
    return stamped
