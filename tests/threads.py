"""Worker threads for tests: anyio's default limiter used up, sync tools that block, and
work started in several threads at once.

Under trio, a worker thread its caller stopped waiting for keeps its token of the limiter
until it returns; ``default_threads_taken`` stands for many such threads.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio.to_thread

from littleghost import Agent, Message, ToolCall, tool
from littleghost.models import ModelResponse, StopReason
from littleghost.sessions.base import SessionStore
from littleghost.testing import ScriptedModel, text_response

BLOCKED_CALLS = 40
"""As many sync tool calls as anyio's default limiter has tokens."""


@asynccontextmanager
async def default_threads_taken(at_most: float = 3.0) -> AsyncIterator[None]:
    """Every token of anyio's default thread limiter is taken while the context is open,
    for ``at_most`` seconds (so that a shielded wait for one ends in a failed
    assertion, not a hung test)."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    borrowers = [object() for _ in range(int(limiter.available_tokens))]
    for borrower in borrowers:
        limiter.acquire_on_behalf_of_nowait(borrower)

    def release() -> None:
        while borrowers:
            limiter.release_on_behalf_of(borrowers.pop())

    async def release_later() -> None:
        await anyio.sleep(at_most)
        release()

    async with anyio.create_task_group() as group:
        group.start_soon(release_later)
        try:
            yield
        finally:
            release()
            group.cancel_scope.cancel()


def blocking_agent(store: SessionStore, release: threading.Event) -> Agent:
    """An agent on ``store`` whose model asks for ``BLOCKED_CALLS`` calls of a sync tool
    that blocks until ``release`` (30 s at most), past its 0.1 s timeout; then answers
    ``done``."""

    class Blocker(Agent):
        cleanup_grace = 0.2

        @tool(timeout=0.1)
        def block(self) -> str:
            """Block a worker thread."""
            release.wait(30)
            return "late"

    calls = [ToolCall(f"c{index}", "block", {}) for index in range(BLOCKED_CALLS)]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    return Blocker(model=model, session_store=store)


def in_threads(work: Callable[[int], object], count: int) -> list[object]:
    """``work(0)``, ``work(1)``, ... each in its own thread, released at once; what each
    returned or raised."""
    outcomes: list[object] = [None] * count
    start = threading.Barrier(count)

    def call(index: int) -> None:
        start.wait()
        try:
            outcomes[index] = work(index)
        except BaseException as error:
            outcomes[index] = error

    threads = [threading.Thread(target=call, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes
