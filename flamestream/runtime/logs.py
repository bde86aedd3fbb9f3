"""Logging of node processes: timestamps, levels, the node and the role, as text or JSON lines.

Every record names the node (``node``) and the role (the logger's last name,
e.g. ``flamestream.worker0``), so the log of a node hosting four roles still
says which of them spoke.  ``--log-format json`` writes one JSON object per
line for log shippers; a traceback travels inside the object (``exc``), so a
line is always one record.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = "flamestream"
FORMATS = ("text", "json")


def role_logger(name: str) -> logging.Logger:
    """The logger of one role of this node (``worker0``, ``front0``...) or of the node itself (``node``)."""
    return logging.getLogger(f"{ROOT}.{name}")


class _NodeFilter(logging.Filter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        record.role = record.name.rsplit(".", 1)[-1] if record.name.startswith(f"{ROOT}.") else record.name
        return True


class _TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)s %(node)s %(role)s: %(message)s", "%Y-%m-%d %H:%M:%S")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "node": getattr(record, "node", ""), "role": getattr(record, "role", ""),
            "message": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(node: str, log_file: Path | None = None, fmt: str = "text", level: str = "INFO") -> None:
    """Send every record of this process to ``log_file`` (stderr without one) in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    handler: logging.Handler = (logging.FileHandler(log_file, encoding="utf-8") if log_file is not None
                                else logging.StreamHandler(sys.stderr))
    handler.addFilter(_NodeFilter(node))
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # connection chatter at INFO on every session event
