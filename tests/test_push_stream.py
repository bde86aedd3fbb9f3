"""`flamestream push` streams its input: each line goes out as it arrives, not when the input ends.

The reading is checked over a real pipe that the test keeps open; the last
test follows lines from a live `push` process into the output topic of a
real cluster (slow).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import pytest

from flamestream.cli import UsageError, read_events, read_lines
from flamestream.client import Client, Record
from tests.test_cli_cluster import ROOT, flamestream

WAIT = 30.0
"""Seconds a step may take before the test fails: the waits end as soon as what they wait for happens."""


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Runs the blocking reads, so a read that waits for the end of the input fails the test instead of hanging it."""
    with ThreadPoolExecutor(1) as executor:
        yield executor


@pytest.fixture
def stdin(pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> Iterator[IO[bytes]]:
    """The writing end of a pipe that is ``sys.stdin``.

    Set up after ``pool`` so it is closed first: a read still waiting in the pool then ends, and the pool can stop.
    """
    read_fd, write_fd = os.pipe()
    with open(read_fd, encoding="utf-8") as reading, open(write_fd, "wb", buffering=0) as writer:
        monkeypatch.setattr(sys, "stdin", reading)
        yield writer


def test_lines_come_out_as_they_are_written(stdin: IO[bytes], pool: ThreadPoolExecutor) -> None:
    batches = read_lines("-")
    stdin.write(b"one\ntw")
    assert pool.submit(next, batches).result(WAIT) == ["one"]
    stdin.write("o\nthree \xe9".encode())
    assert pool.submit(next, batches).result(WAIT) == ["two"]  # "three é" has no newline yet
    stdin.write(b"\r\n")  # stdin splits at \n only, as Python reads it
    assert pool.submit(next, batches).result(WAIT) == ["three \xe9\r"]
    stdin.write(b"a\n\nb\n")
    assert pool.submit(next, batches).result(WAIT) == ["a", "", "b"]  # what arrived together stays together
    stdin.write(b"last")
    stdin.close()
    assert pool.submit(list, batches).result(WAIT) == [["last"]]


def test_a_character_split_across_writes_is_decoded_whole(stdin: IO[bytes], pool: ThreadPoolExecutor) -> None:
    batches = read_lines("-")
    stdin.write("\xe9".encode()[:1])
    pending = pool.submit(next, batches)
    stdin.write("\xe9".encode()[1:] + b"\n")
    assert pending.result(WAIT) == ["\xe9"]


def test_a_file_has_universal_newlines(tmp_path: Path) -> None:
    path = tmp_path / "events.txt"
    path.write_bytes(b"a\r\nb\rc\n\nd")
    assert [line for batch in read_lines(str(path)) for line in batch] == ["a", "b", "c", "", "d"]
    path.write_bytes(b"")
    assert list(read_lines(str(path))) == []


def test_json_batches_are_numbered_across_reads_and_checked_before_they_are_yielded(
        stdin: IO[bytes], pool: ThreadPoolExecutor) -> None:
    batches = read_events("-", as_json=True)
    stdin.write(b'{"a": 1}\n\n')
    assert pool.submit(next, batches).result(WAIT) == (2, [{"a": 1}], [1])  # the blank line is counted, not pushed
    stdin.write(b'[2]\n{oops}\n"three"\n')
    with pytest.raises(UsageError, match=r"^stdin line 4 is not valid JSON \(Expecting property name"):
        pool.submit(next, batches).result(WAIT)


# -- a live push into a real cluster ------------------------------------------------------------------------------


def await_payloads(records: Iterator[Record], wanted: list[Any]) -> None:
    """Read ``records`` until each of ``wanted`` has come (each wait for a record is bounded by the consume)."""
    missing = list(wanted)
    for record in records:
        if record.payload in missing:
            missing.remove(record.payload)
        if not missing:
            return
    pytest.fail(f"the topic went quiet without {missing}")


def start_push(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flamestream", "push", *args], cwd=ROOT, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def send(push: subprocess.Popen[str], line: str) -> None:
    assert push.stdin is not None
    push.stdin.write(line + "\n")
    push.stdin.flush()


@pytest.mark.slow
def test_push_delivers_each_line_while_its_input_stays_open(tmp_path: Path, zookeeper: str,
                                                            cluster_name: str) -> None:
    data = str(tmp_path / "cluster")
    where = ("--data-dir", data)
    up = flamestream("up", *where, "--zookeeper", zookeeper, "--cluster", cluster_name)  # the default layout
    assert up.returncode == 0, up.stdout + up.stderr
    pushes: list[subprocess.Popen[str]] = []
    try:
        deploy = flamestream("deploy", "examples/wordcount.py", *where)
        assert deploy.returncode == 0, deploy.stderr
        with Client(zookeeper, cluster_name) as client:
            records = client.consume("stream", from_committed=False, timeout=WAIT)

            live = start_push("--producer", "stream", *where)
            pushes.append(live)
            send(live, "alpha")
            await_payloads(records, [{"word": "alpha", "count": 1}])
            assert live.poll() is None  # delivered while push still waits for more input
            send(live, "beta alpha")
            await_payloads(records, [{"word": "beta", "count": 1}, {"word": "alpha", "count": 2}])
            _, errors = live.communicate(timeout=WAIT)  # closes its stdin: the end of the input
            assert live.returncode == 0, errors
            assert "pushed 2 events (0 duplicates)" in errors

            # The two lines went out in two pushes with sequences 0 and 1, as a single push would number them.
            again = flamestream("push", "--producer", "stream", *where, stdin="alpha\nbeta alpha\n")
            assert again.returncode == 0 and "pushed 2 events (2 duplicates)" in again.stderr, again.stderr

            bad = start_push("--json", *where)
            pushes.append(bad)
            send(bad, '"gamma"')
            await_payloads(records, [{"word": "gamma", "count": 1}])
            send(bad, "{oops}")
            _, errors = bad.communicate(timeout=WAIT)
            assert bad.returncode == 2, errors
            assert "stdin line 2 is not valid JSON" in errors and "nothing after line 1 was pushed" in errors
    finally:
        for push in pushes:
            if push.poll() is None:
                push.kill()
                push.wait()
        down = flamestream("down", *where)
        assert down.returncode == 0, down.stderr
