"""Module-level business logic for graph-builder tests (graphs reference functions by import path)."""

from __future__ import annotations

from typing import Any

from flamestream.core.hashing import stable_hash

NOT_CALLABLE = 42


def split_words(line: str) -> list[tuple[str, int]]:
    return [(w, 1) for w in line.split()]


def word_hash(payload: Any) -> int:
    return stable_hash(word_key(payload))


def word_key(payload: Any) -> Any:
    return payload[0] if isinstance(payload, tuple) else payload


def combine(window: tuple[Any, ...]) -> list[Any]:
    return [window[-1]]


def identity(payload: Any) -> list[Any]:
    return [payload]


class Namespace:
    @staticmethod
    def nested(payload: Any) -> list[Any]:
        return [payload]


def split_csv(line: str) -> list[str]:
    return line.split(",")
