"""The two builds of the core: compiled by mypyc (setup.py) and the pure-Python fallback.

CI installs with scripts/install, which compiles, and runs the whole suite on that build; this file makes sure
it really is that build (a failed compile falls back quietly at install time), and runs the oracle and
hypothesis tests a second time on the pure build.

How the pure build is run: with ``FLAMESTREAM_PURE=1``, which ``flamestream.core.compiled`` honours at import
by loading every compiled module's ``.py`` source instead.  That runs exactly the code a machine without a
compiler runs, in the same checkout; the child checks that it did (``test_the_build_in_use`` is among the tests
it runs: under ``FLAMESTREAM_PURE=1`` it asserts that no compiled module was loaded).  A copy of the package
without the ``.so`` files would test the same sources, but not the switch that the benchmarks use too.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flamestream.core
from flamestream.core.compiled import COMPILED, PACKAGE, compiled_modules, pure_requested

ROOT = Path(__file__).resolve().parents[1]
PURE = pure_requested()
EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)

ORACLE_TESTS = ["tests/test_runtime_vs_oracle.py", "tests/test_grouping.py", "tests/test_handover.py",
                "tests/test_semantics.py", "tests/test_poison.py", "tests/test_hashing.py", "tests/test_meta.py",
                "tests/test_barrier.py", "tests/test_acker.py", "tests/test_worker_pieces.py"]
"""The tests that compare the core with the oracle or check it with hypothesis: they run on both builds."""


def test_the_build_in_use() -> None:
    """Compiled, every module setup.py compiles, unless the test run asks for the pure build."""
    names = [f"{PACKAGE}.{name}" for name in COMPILED]
    files = {name: str(importlib.import_module(name).__file__) for name in names}
    if PURE:
        assert flamestream.core.BUILD == "pure"
        assert all(f.endswith(".py") for f in files.values()), files
        assert not [m for m in sys.modules if m.endswith("__mypyc")], "a compiled module was loaded"
        return
    assert flamestream.core.BUILD == "compiled", (
        "the core is not compiled: install with scripts/install or `pip install -e .` (gcc and mypy needed; the "
        "install says why it fell back), or set FLAMESTREAM_PURE=1 to test the pure build")
    assert sorted(compiled_modules()) == sorted(names)
    assert all(f.endswith(EXTENSIONS) for f in files.values()), files


def test_wrong_types_from_callers_get_the_same_answers_compiled() -> None:
    """Compiled, an argument that contradicts its annotation raises TypeError at the call: where a caller's value
    reaches the core unchecked, the core takes ``object`` and answers as the sources do."""
    from flamestream.core.hashing import BalanceError, as_hash
    from flamestream.core.limits import group_fault
    from flamestream.core.payload import check_payload, encode_payload

    assert group_fault(None) == group_fault(5) == "consumer group must be a non-empty string"
    with pytest.raises(BalanceError):
        as_hash("7")
    assert check_payload({1: [b"x", {2.5}]}) == "payload is not a JSON value: it holds a set"
    assert encode_payload({(1,): {3}}) == b'"{(1,): {3}}"'


def test_a_source_edited_after_compiling_runs_as_python(tmp_path: Path) -> None:
    """An editable install whose source changed would otherwise run the stale compiled module without a word; an
    installed package's file times are not looked at."""
    if flamestream.core.BUILD != "compiled":
        pytest.skip("no compiled build here (test_the_build_in_use says whether that is expected)")
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "flamestream", copy / "flamestream", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    group = sys.modules[next(m for m in sys.modules if m.endswith("__mypyc"))].__file__
    assert group is not None
    shutil.copy2(group, copy)
    shutil.copy2(ROOT / "setup.py", copy)  # a source tree, as an editable install is
    source = copy / "flamestream" / "core" / "grouping.py"
    check = "import flamestream.core as c, flamestream.core.grouping as g; print(c.BUILD, g.__file__)"

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", check], cwd=copy, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(copy), "FLAMESTREAM_PURE": "0"}, check=True)

    fresh = run()
    assert fresh.stdout.split()[0] == "compiled" and "changed after being compiled" not in fresh.stderr
    # The module's shim and the group's library (a rebuild in place rewrites only the shims that changed).
    built = max([p.stat().st_mtime for p in source.parent.glob("grouping.*") if p.name.endswith(EXTENSIONS)]
                + [Path(group).stat().st_mtime])
    os.utime(source, (built + 10, built + 10))  # edited after the build
    stale = run()
    assert stale.stdout.split() == ["pure", str(source)]
    assert "flamestream.core.grouping changed after being compiled" in stale.stderr
    library = copy / Path(group).name
    os.utime(library, (built + 20, built + 20))  # rebuilt since: the group's library holds the code
    assert run().stdout.split()[0] == "compiled"
    os.utime(library, (built, built))
    (copy / "setup.py").unlink()  # an installed package: a wheel writes its files in any order, times mean nothing
    installed = run()
    assert installed.stdout.split()[0] == "compiled" and "changed after being compiled" not in installed.stderr


@pytest.mark.slow
def test_the_oracle_tests_pass_on_the_pure_build() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "tests/test_compiled.py::test_the_build_in_use", *ORACLE_TESTS],
                          cwd=ROOT, env={**os.environ, "FLAMESTREAM_PURE": "1"}, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]*")


def _unfinal_constants(module: str) -> list[str]:
    """Module-level ALL_CAPS names of ``module`` (in the core) assigned without a ``Final`` annotation."""
    tree = ast.parse((ROOT / "flamestream" / "core" / f"{module}.py").read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [n for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
            found += [f"{module}.{n.id}" for n in names if CONSTANT.fullmatch(n.id)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and CONSTANT.fullmatch(
                node.target.id) and "Final" not in ast.unparse(node.annotation):
            found.append(f"{module}.{node.target.id}")
    return found


def test_constants_the_compiled_core_reads_are_final() -> None:
    """mypyc inlines a ``Final`` constant (or keeps a non-literal one in a C static); any other module constant
    is a dict lookup in the module's globals wherever compiled code reads it — forty a word in the worker's loop
    on word count, and the local runtime ran 11-15 % more instructions for it (callgrind).  ``plan`` is not
    compiled, but the worker reads its operation kinds."""
    assert [name for module in (*COMPILED, "plan") for name in _unfinal_constants(module)] == []
