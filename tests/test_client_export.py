"""`from flamestream import Client` works, and `import flamestream` still does not load the SDK's grpc/kazoo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> str:
    """Run ``code`` in a new interpreter: this test process has long imported grpc and kazoo."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_model_loads_neither_grpc_nor_kazoo() -> None:
    loaded = json.loads(run_fresh(
        "import json, sys\nimport flamestream\nimport flamestream.core.local\nimport flamestream.core.graph\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'flamestream', 'grpc', 'kazoo'})))"))
    assert loaded == ["flamestream"]


def test_client_and_async_client_are_exported_lazily() -> None:
    out = run_fresh(
        "import sys\nimport flamestream\nassert 'grpc' not in sys.modules\n"
        "from flamestream import AsyncClient, Client\nimport flamestream.client as sdk\n"
        "print(Client is sdk.Client, AsyncClient is sdk.AsyncClient, 'grpc' in sys.modules, 'kazoo' in sys.modules)")
    assert out.split() == ["True", "True", "True", "True"]


def test_unknown_names_are_still_attribute_errors() -> None:
    import flamestream

    assert {"Client", "AsyncClient"} <= set(flamestream.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'Clint'"):
        flamestream.Clint  # noqa: B018
