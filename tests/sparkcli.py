"""``flamestream`` Spark commands run by one long-lived Python process, one after another, as a user would run them
from a shell except for the JVM: each command starts and stops its own Spark session, on the JVM the first one
started.

Why: a Spark application started cold (a new JVM, its classes loaded and compiled) takes ~40 s on this 2-core
machine even for a few hundred records, the next session on a warm JVM ~12 s.  Tests whose subject is a command's
own path (its flags, its output, its exit code, where it runs) still run it, through ``SparkCli.run``; the suite's
``spark_cli`` fixture keeps one such process for every test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = """\
import contextlib, io, json, os, sys
from flamestream.cli import main
from flamestream.spark.replay import spark_session

# Answers go out on a copy of the original stdout; whatever else writes to file descriptor 1 (the JVM, Python
# workers) lands on stderr instead of in an answer.
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
for line in sys.stdin:
    request = json.loads(line)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if "collect" in request:
            session = spark_session("local[2]", "collect", request["conf"])
            try:
                session.read.parquet(request["collect"]).collect()
                code = 0
            except Exception as exc:
                print(exc, file=sys.stderr)
                code = 1
            finally:
                session.stop()
        else:
            try:
                code = main(request["args"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    answers.write(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\\n")
    answers.flush()
"""
"""Reads one JSON request a line (``{"args": [...]}``: a command; ``{"collect": TABLE, "conf": {...}}``: collect a
Parquet table to the driver of a session with that configuration) and answers each with a JSON line."""


class SparkCli:
    """The process running ``SERVER``; its Spark log goes to ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self._process: subprocess.Popen[str] | None = None

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``flamestream ARGS``: its exit code, stdout and stderr (what the command printed, not Spark's log)."""
        answer = self._ask({"args": list(args)})
        return subprocess.CompletedProcess(["flamestream", *args], answer["code"], answer["stdout"], answer["stderr"])

    def collect(self, table: Path, conf: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """Collect ``table`` to the driver of a session with ``conf``; exit code 1 and the error if that fails."""
        answer = self._ask({"collect": str(table), "conf": conf})
        return subprocess.CompletedProcess(["collect", str(table)], answer["code"], answer["stdout"],
                                           answer["stderr"])

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:  # it died (the JVM with it): the next request starts a new one
            process.wait()
            self._process = None
            raise AssertionError(f"the Spark CLI process exited with {process.returncode}: {self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None:
            log: IO[str] = self.log.open("a")
            with log:
                self._process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                                                 stdout=subprocess.PIPE, stderr=log, text=True,
                                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return self._process

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.stdin is not None:
            process.stdin.close()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> SparkCli:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
