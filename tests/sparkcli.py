"""``flamestream`` Spark commands run one after another in one Python process, as a user would run them from a
shell except for the JVM: each command starts and stops its own Spark session, on the JVM the first one started.

Why: a Spark application started cold (a new JVM, its classes loaded and compiled) takes ~40 s on this 2-core
machine even for a few hundred records, and the next session on a warm JVM ~12 s.  Tests whose subject is a
command's own path (its flags, its output, its exit code, where it runs) still run it; this runs them cheaper.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """\
import contextlib, io, json, sys
from flamestream.cli import main
from flamestream.spark.replay import spark_session

commands, collect = json.loads(sys.argv[1]), json.loads(sys.argv[2])
results = []
for args in commands:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
if collect is not None:
    session = spark_session("local[2]", "collect", collect["conf"])
    try:
        session.read.parquet(collect["table"]).collect()
        results.append({"code": 0, "stdout": "", "stderr": ""})
    except Exception as exc:
        results.append({"code": 1, "stdout": "", "stderr": str(exc)})
print(json.dumps(results))
"""


def run_commands(commands: list[list[str]], *, collect: Path | None = None,
                 conf: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Each command's ``{"code", "stdout", "stderr"}``; with ``collect``, then one more for a collect of that
    Parquet table to the driver in a session with ``conf``."""
    spec = None if collect is None else {"table": str(collect), "conf": conf or {}}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands), json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
