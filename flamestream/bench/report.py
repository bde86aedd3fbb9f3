"""result.json and latency.png of one ``flamestream bench`` run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(directory: Path, result: dict[str, Any]) -> Path:
    path = directory / "result.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return path


def plot_cdf(path: Path, title: str, latencies_ms: dict[str, list[float]]) -> Path | None:
    """Latency CDF per system on a log axis (latencies span 1 ms to seconds across systems).

    None when matplotlib is missing (it comes with the ``bench`` extra): the
    runs' numbers are in result.json already, and a missing plot must not
    turn minutes of measurement into a traceback.
    """
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in latencies_ms.items():
        ordered = sorted(v for v in values if v > 0)
        if not ordered:
            continue
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.step(ordered, fractions, where="post", label=f"{name} (n={len(ordered)})")
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log scale)")
    ax.set_ylabel("fraction of events")
    ax.set_ylim(0, 1.01)
    for q in (0.5, 0.99):
        ax.axhline(q, color="grey", linewidth=0.5, linestyle=":")
    ax.grid(True, which="both", linewidth=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
