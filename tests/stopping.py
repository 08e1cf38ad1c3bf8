"""Agents and stores whose stop takes time: a waiting tool, slow appends, a release that
never ends (the fault tests' and the nested-grace tests')."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from littleghost import Agent, Message, tool
from littleghost.errors import SessionStoreError
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

GRACE = 0.3
"""The cleanup grace of the agents here (short, so the tests are quick)."""


def valid(log: Sequence[Message]) -> None:
    """Every tool result follows its call; every call (repeated ids counted apart) is
    answered at most once."""
    open_calls: Counter[str] = Counter()
    ids = [message.id for message in log]
    assert len(ids) == len(set(ids)), "a message is stored twice"
    for message in log:
        open_calls.update(call.id for call in message.tool_calls)
        for result in message.tool_results:
            assert open_calls[result.call_id], f"result for {result.call_id} without an open call"
            open_calls[result.call_id] -= 1


class SlowStore:
    """A store whose appends (after the first ``fast`` of them) take ``delay`` seconds."""

    def __init__(self, delay: float, fast: int = 0, fail: bool = False) -> None:
        self.inner = InMemorySessionStore()
        self.delay = delay
        self.fast = fast
        self.fail = fail
        self.appends = 0

    async def load(self, session_id: str) -> tuple[Message, ...]:
        return await self.inner.load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        if self.appends > self.fast:
            await anyio.sleep(self.delay)
            if self.fail:
                raise SessionStoreError("the store is down")
        await self.inner.append(session_id, messages)

    async def list_sessions(self) -> tuple[str, ...]:
        return await self.inner.list_sessions()

    async def delete(self, session_id: str) -> None:
        await self.inner.delete(session_id)


class Waiter(Agent):
    instructions = "Wait."
    cleanup_grace = GRACE

    @tool
    async def wait(self, seconds: float) -> str:
        """Wait a while."""
        await anyio.sleep(seconds)
        return "waited"


def waiting_model() -> ScriptedModel:
    return ScriptedModel(
        [tool_call_response("wait", {"seconds": 10}, call_id="c1"), text_response("done")]
    )


class HangingRelease(InMemorySessionStore):
    """A store that holds its sessions itself and never finishes releasing one."""

    @asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await anyio.sleep(60)
