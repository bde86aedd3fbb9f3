"""TickGate: messages wait for their tick, those of a replaced state are void, and the wait is bounded."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from flamestream.runtime.hosting import LocalAbort, LocalContext
from flamestream.runtime.tick_gate import TickGate, TickNotDeployed


def test_a_message_waits_for_its_tick_and_one_of_a_replaced_state_is_void() -> None:
    async def scenario() -> None:
        gate = TickGate()
        early = asyncio.create_task(gate.admit(0))
        await asyncio.sleep(0.01)
        assert not early.done()  # nothing deployed yet
        gate.deploy(0, fresh=True)
        assert await early
        ahead = asyncio.create_task(gate.admit(2))
        gate.deploy(1, fresh=False)  # a hand-over carries the state on: tick 0's messages still belong to it
        assert await gate.admit(0) and await gate.admit(1)
        await asyncio.sleep(0.01)
        assert not ahead.done()
        gate.deploy(2, fresh=True)
        assert await ahead
        assert not await gate.admit(1) and not await gate.admit(0)  # their state went with tick 2's fresh start

    asyncio.run(scenario())


def test_a_tick_that_never_comes_is_refused_after_the_timeout() -> None:
    async def scenario() -> None:
        gate = TickGate()
        gate.deploy(3, fresh=True)
        with pytest.raises(TickNotDeployed, match=r"tick 9 was not deployed here within 0\.05s"):
            await gate.admit(9, timeout=0.05)
        assert await gate.admitted(3, LocalContext())

    asyncio.run(scenario())


def test_a_handler_call_whose_tick_never_comes_ends_with_failed_precondition() -> None:
    async def scenario() -> None:
        gate = TickGate()
        gate.deploy(3, fresh=True)
        with pytest.raises(LocalAbort) as aborted:
            await gate.admitted(4, LocalContext(), timeout=0.05)
        assert aborted.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "tick 4 was not deployed here within" in aborted.value.details

    asyncio.run(scenario())
