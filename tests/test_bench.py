"""The benchmark harness: completion rules, oracle checks, figures, and a CLI smoke run (tiny rate, seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import flamestream.core as core
from flamestream.bench.report import plot_cdf
from flamestream.bench.runner import cpu_per_unit, head_of_line, head_of_line_figures, latency_figures, percentile
from flamestream.bench.suite import _comparisons
from flamestream.bench.workloads import InvertedIndex, PageProgress, Wordcount, WordcountProgress

ROOT = Path(__file__).resolve().parents[1]


def test_a_line_is_done_once_every_occurrence_has_its_count() -> None:
    progress = WordcountProgress()
    assert progress.expect("l0", "a b a") == 3
    assert progress.expect("l1", "a") == 1
    assert progress.observe({"word": "a", "count": 1}) == []
    assert progress.observe({"word": "b", "count": 1}) == []
    assert progress.observe({"word": "a", "count": 2}) == ["l0"]
    assert progress.observe({"word": "a", "count": 2}) == []  # a duplicate completes nothing more
    assert progress.observe({"word": "a", "count": 3}) == ["l1"]


def test_an_aggregated_count_completes_every_occurrence_it_covers() -> None:
    """Micro-batch systems fold several updates of a word into one record: the >= rule still applies."""
    progress = WordcountProgress()
    progress.expect("l0", "a")
    progress.expect("l1", "a b")
    assert progress.observe({"word": "a", "count": 2}) == ["l0"]
    assert progress.observe({"word": "b", "count": 1}) == ["l1"]


def test_a_page_is_done_after_one_record_per_distinct_word() -> None:
    progress = PageProgress()
    page = {"id": "7~0", "title": "Мяч", "text": "мяч и мяч"}
    assert progress.expect("7~0", page) == 2
    assert progress.observe({"word": "мяч", "page": "7~0", "positions": [0, 1, 3], "pages": 1}) == []
    assert progress.observe({"word": "и", "page": "7~0", "positions": [2], "pages": 1}) == ["7~0"]


def test_wordcount_events_are_seeded_zipf_lines_of_ten_words() -> None:
    first = [line for _, line in zip(range(200), Wordcount().events(3), strict=False)]
    again = [line for _, line in zip(range(200), Wordcount().events(3), strict=False)]
    assert first == again
    assert all(len(line.split()) == 10 for _id, line in first)
    words = [w for _id, line in first for w in line.split()]
    assert words.count("w0") > words.count("w100")  # rank 1 dominates, as in Zipf


def test_inverted_index_events_repeat_pages_with_fresh_ids() -> None:
    workload = InvertedIndex()
    events = [e for _, e in zip(range(600), workload.events(1), strict=False)]
    ids = [payload["id"] for _id, payload in events]
    assert len(set(ids)) == len(ids) == 600
    assert {i.split("~")[1] for i in ids} == {"0", "1", "2"}


def test_checks_catch_a_lost_a_duplicated_and_a_wrong_record() -> None:
    workload = Wordcount()
    lines = ["a b", "a"]
    loop = workload.python_loop()
    records = [r for line in lines for r in loop.process(line)]
    assert workload.check(lines, records, "changelog").correct
    assert not workload.check(lines, records[:-1], "changelog").correct
    assert not workload.check(lines, [*records, records[0]], "changelog").correct
    assert workload.check(lines, [records[1], records[2]], "final-state").correct  # last count per word suffices
    wrong = workload.check(lines, [{"word": "a", "count": 3}, records[1]], "final-state")
    assert not wrong.correct and "'a'" in wrong.detail


def test_python_loop_of_the_inverted_index_matches_the_oracle() -> None:
    workload = InvertedIndex()
    pages = [payload for _, (_id, payload) in zip(range(30), workload.events(2), strict=False)]
    loop = workload.python_loop()
    assert workload.check(pages, [r for page in pages for r in loop.process(page)], "changelog").correct


def test_latency_figures_are_nearest_rank_percentiles() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    figures = latency_figures(values)
    assert (figures["p50_ms"], figures["p90_ms"], figures["p99_ms"], figures["max_ms"]) == (50.0, 90.0, 99.0, 100.0)
    assert percentile([5.0], 0.99) == 5.0
    assert latency_figures([])["p50_ms"] is None


def test_head_of_line_splits_the_events_by_what_they_waited_behind() -> None:
    """(scheduled s, latency s, obligations): two large events overlap, the first ending last; an event due while
    either is unfinished is behind one, an event due at the moment the last one finishes is not."""
    completions = [
        (0.0, 5.0, 100),  # large, unfinished until 5.0
        (1.0, 1.0, 90),  # large, unfinished until 2.0
        (0.5, 0.25, 1),  # behind the first
        (3.0, 0.5, 2),  # behind the first only (the second finished at 2.0): the longest-running one counts
        (5.0, 0.0125, 1),  # the first finished at 5.0: alone
        (6.0, 0.002, 3),  # alone
    ]
    split = head_of_line(completions, share=0.3)
    assert split == {"large_units": 90, "large": [5000.0, 1000.0], "behind_large": [250.0, 500.0],
                     "alone": [12.5, 2.0]}
    figures = head_of_line_figures(split)
    assert figures["large_units"] == 90
    assert figures["behind_large"] == {"events": 2, "p50_ms": 250.0, "p99_ms": 500.0}
    assert figures["alone"] == {"events": 2, "p50_ms": 2.0, "p99_ms": 12.5}


def test_head_of_line_of_no_events_has_no_figures() -> None:
    figures = head_of_line_figures(head_of_line([]))
    assert figures["large_units"] is None
    assert figures["large"] == {"events": 0, "p50_ms": None, "p99_ms": None}


def test_comparisons_are_peer_p50_over_ours() -> None:
    main = [{"name": "flamestream", "p50_ms": 4.0}, {"name": "spark", "p50_ms": 400.0}]
    assert _comparisons(main) == {"spark_p50_over_ours_p50": 100.0}


def test_cpu_per_unit_is_microseconds_of_all_processes_per_unit_done() -> None:
    assert cpu_per_unit(7.5, 98_051) == 76.5  # the index at 20 pages/s: 7.5 s of CPU for 98,051 changelog records
    assert cpu_per_unit(1.0, 0) is None  # nothing done: no figure, not a division by zero


def test_without_matplotlib_the_plot_is_skipped_not_a_traceback(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None in sys.modules: the import raises ImportError
    assert plot_cdf(tmp_path / "latency.png", "t", {"flamestream": [1.0, 2.0]}) is None
    assert not (tmp_path / "latency.png").exists()


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", "bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_smoke_run_writes_result_and_plot_ours_first(tmp_path: Path) -> None:
    done = bench("wordcount", "--rate", "20", "--duration", "2", "--peers", "python", "--out", str(tmp_path),
                 cwd=ROOT)
    assert done.returncode == 0, done.stderr
    (run_dir,) = tmp_path.iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    names = [s["name"] for s in result["systems"]]
    assert names == ["flamestream", "flamestream (guarantees off)", "python"]
    for entry in result["systems"]:
        assert entry["complete"], entry
        assert entry["correct"] or entry["name"] == "flamestream (guarantees off)", entry
        assert entry["p50_ms"] <= entry["p90_ms"] <= entry["p99_ms"] <= entry["max_ms"]
        assert entry["throughput"] > 0 and entry["cpu_seconds"] > 0 and entry["peak_rss_mb"] > 0
        if entry["name"] == "flamestream":  # exactly once: a word count record per word, the unit
            assert entry["cpu_us_per_unit"] == cpu_per_unit(entry["cpu_seconds"], entry["records_consumed"]), entry
    assert result["systems"][0]["replay_overhead"] >= 1.0
    assert result["machine"]["cores"] and result["seed"] == 1 and result["rate"] == 20
    assert result["versions"]["flamestream core"] == core.BUILD, "the result says which core ran"
    assert (run_dir / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["wordcount", "--peers", "flink"], "unknown peer(s) flink"),
    (["wordcount", "--rate", "0"], "must be > 0"),
    (["pagerank"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    done = bench(*args, "--out", str(tmp_path), cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr
    assert not any(tmp_path.iterdir())
