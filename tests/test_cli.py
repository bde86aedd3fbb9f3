"""The `flamestream run` command, as a user runs it: a real subprocess, JSON lines out, exit code 2 on errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def flamestream(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_run_prints_released_records_as_json_lines(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("the dog saw a dog\nA DOG and a cat\n")
    done = flamestream("run", "examples/wordcount.py", "--input", str(source), "--workers", "3", "--seed", "5",
                       "--stats")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records == [
        {"word": "the", "count": 1}, {"word": "dog", "count": 1}, {"word": "saw", "count": 1},
        {"word": "a", "count": 1}, {"word": "dog", "count": 2}, {"word": "a", "count": 2},
        {"word": "dog", "count": 3}, {"word": "and", "count": 1}, {"word": "a", "count": 3},
        {"word": "cat", "count": 1},
    ]
    assert json.loads(done.stderr.splitlines()[-1])["released"] == 10


def test_run_reads_stdin_and_oracle_agrees() -> None:
    text = "b a b\nc b\n"
    runtime = flamestream("run", "examples/wordcount.py", "--input", "-", "--workers", "4", "--adversarial",
                          stdin=text)
    oracle = flamestream("run", "examples/wordcount.py", "--input", "-", "--oracle", stdin=text)
    assert runtime.returncode == oracle.returncode == 0
    assert runtime.stdout == oracle.stdout
    assert json.loads(runtime.stdout.splitlines()[-1]) == {"word": "b", "count": 3}


def test_bad_invocations_exit_2_with_a_message(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from flamestream import Graph\ndef graph():\n    g = Graph('x')\n    g.source()\n    return g\n")
    cases = {
        ("run", "examples/missing.py", "--input", "x"): "is not an existing .py file",
        ("run", "examples/wordcount.py", "--input", str(tmp_path / "nope.txt")): "No such file",
        ("run", "examples/wordcount.py", "--input", "x", "--workers", "0"): "must be >= 1",
        ("run", str(broken), "--input", "x"): "a graph needs at least one sink",
        ("frobnicate",): "invalid choice",
    }
    for args, message in cases.items():
        done = flamestream(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
