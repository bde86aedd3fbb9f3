"""Audit: does the stream's output topic hold exactly what a batch replay of its input log releases?

Compared as multisets of (global time, payload): traces carry logical times,
which depend on arrival order and so are not comparable across runs, while
global times are stamped once at the fronts and logged.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flamestream.core.meta import GlobalTime
from flamestream.core.payload import decode_payload
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb

Record = tuple[GlobalTime, Any]


def topic_records(data_dir: Path) -> list[Record]:
    """Every record of every partition of a cluster's output topic (``DIR/topic/<partition>``)."""
    base = data_dir / "topic" if (data_dir / "topic").is_dir() else data_dir
    records: list[Record] = []
    for partition in sorted(p for p in base.iterdir() if p.is_dir() and p.name.isdigit()):
        log = SegmentedLog(partition, readonly=True)
        try:
            for _, data in log.scan():
                record = pb.Record.FromString(data)
                records.append((GlobalTime(record.time.ts, record.time.front), decode_payload(record.payload)))
        finally:
            log.close()
    return records


def replay_records(spark: Any, parquet_dir: str) -> list[Record]:
    """Rows written by ``flamestream replay``."""
    return [(GlobalTime(r.ts, r.front), decode_payload(r.payload.encode()))
            for r in spark.read.parquet(parquet_dir).collect()]


def _key(record: Record) -> tuple[GlobalTime, str]:
    return record[0], json.dumps(record[1], sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Audit:
    topic: int
    replay: int
    only_in_topic: list[tuple[tuple[GlobalTime, str], int]]
    """(record, surplus count), in global-time order."""
    only_in_replay: list[tuple[tuple[GlobalTime, str], int]]

    @property
    def equal(self) -> bool:
        return not self.only_in_topic and not self.only_in_replay

    def verdict(self, show: int = 10) -> str:
        if self.equal:
            return f"EQUAL: the topic and the replay both hold the same {self.topic} records"
        lines = [f"DIFFERENT: topic {self.topic} records, replay {self.replay}; "
                 f"{sum(n for _, n in self.only_in_topic)} only in the topic, "
                 f"{sum(n for _, n in self.only_in_replay)} only in the replay"]
        for title, rows in (("only in the topic", self.only_in_topic), ("only in the replay", self.only_in_replay)):
            for (gt, payload), n in rows[:show]:
                lines.append(f"  {title}: ts={gt.ts} front={gt.front} x{n} {payload}")
        return "\n".join(lines)


def audit(topic: list[Record], replay: list[Record]) -> Audit:
    t, r = Counter(map(_key, topic)), Counter(map(_key, replay))
    return Audit(len(topic), len(replay), sorted((t - r).items()), sorted((r - t).items()))
