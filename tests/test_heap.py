"""Collector settings for processes that hold stream state (``flamestream/runtime/heap.py``)."""

from __future__ import annotations

import gc

import pytest

from flamestream.runtime.heap import loading_state


@pytest.mark.parametrize("enabled", [True, False])
def test_a_load_runs_without_the_collector_and_leaves_what_it_built_frozen(enabled: bool) -> None:
    """While a state loads the collector does not run; afterwards what was built is out of its walks (frozen) and
    the collector is on or off as it was found."""
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        frozen = gc.get_freeze_count()
        with loading_state():
            assert not gc.isenabled()
            built = [[i] for i in range(10_000)]
        assert gc.isenabled() is enabled
        assert gc.get_freeze_count() >= frozen + len(built)
    finally:
        gc.unfreeze()  # the rest of the test session walks as before
        (gc.enable if was else gc.disable)()


def test_a_load_that_fails_still_gives_the_collector_back() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError, match="damaged"), loading_state():
        raise ValueError("damaged snapshot")
    assert gc.isenabled()
    gc.unfreeze()
