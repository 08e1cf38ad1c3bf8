"""The run loop: results, history, usage, limits, the output limit and bad run() input."""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import math
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest

from littleghost import (
    Agent,
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    RunContext,
    RunResult,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
    after_model,
    after_tool,
    before_tool,
    manage_context,
    tool,
)
from littleghost.context import Summarization
from littleghost.errors import (
    ConfigurationError,
    LimitExceededError,
    OutputLimitError,
    OutputValidationError,
    ProtocolError,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason
from littleghost.models.streaming import (
    ReasoningChunk,
    StreamDone,
    TextChunk,
    ToolCallChunk,
)
from littleghost.runner import MAX_NESTED_RUNS, WITHHELD_TEXT
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

pytestmark = pytest.mark.anyio


class Counter(Agent):
    instructions = "Count things."

    @tool
    async def count(self, n: int) -> int:
        """Count up from n."""
        return n + 1


async def test_a_tool_round_trip() -> None:
    """A tool call, its result and the final answer make up the run's new messages."""
    model = ScriptedModel([tool_call_response("count", {"n": 1}, call_id="c1"), text_response("2")])
    result = await Counter(model=model).run("count from 1")
    assert isinstance(result, RunResult)
    assert (result.output, result.stop_reason) == ("2", StopReason.END_TURN)
    assert [m.role for m in result.messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert result.messages[2].tool_results[0].content == "2"


async def test_the_model_sees_instructions_then_the_conversation() -> None:
    """Each request starts with the instructions and carries the log so far."""
    model = ScriptedModel([tool_call_response("count", {"n": 1}, call_id="c1"), text_response("2")])
    await Counter(model=model).run("count from 1")
    second = model.requests[1].messages
    assert [m.role for m in second] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert second[0].text == "Count things."


def test_run_sync_works() -> None:
    """run_sync runs the agent from synchronous code and passes the run options on."""
    history = [Message.user("earlier"), Message.assistant("before")]
    model = ScriptedModel([text_response("sync answer")])
    result = Counter(model=model).run_sync("hi", history=history, timeout=10)
    assert result.output == "sync answer"
    assert result.messages[:2] == tuple(history)


@pytest.mark.parametrize("sent_to", ["the process", "another thread"])
def test_ctrl_c_stops_run_sync_with_keyboard_interrupt(tmp_path: Path, sent_to: str) -> None:
    """Ctrl-C in ``run_sync`` raises ``KeyboardInterrupt`` on every Python; on 3.10 the
    event loop raised it as a bare ``CancelledError``, which ``except KeyboardInterrupt``
    misses. One taken by another thread (an exporter's, a client's) as the event loop
    sleeps on no timer stopped nothing: its handler waits for the main thread."""
    script = f"""
import signal
import sys
import threading

import anyio
from littleghost import Agent
from littleghost.testing import ScriptedModel

def take_a_ctrl_c():
    if sys.stdin.readline() == "take it\\n":
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

async def answer_until_stopped(request):
    threading.Thread(target=take_a_ctrl_c, daemon=True).start()
    await anyio.Path({str(tmp_path / "asked")!r}).touch()
    await anyio.sleep_forever()

class Waiting(Agent):
    model = ScriptedModel([answer_until_stopped])

try:
    Waiting().run_sync("hi")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell starts it
    ) as child:
        assert child.stdin is not None
        while not (tmp_path / "asked").exists() and child.poll() is None:
            time.sleep(0.05)
        if sent_to == "the process":
            child.send_signal(signal.SIGINT)
        else:
            child.stdin.write("take it\n")
            child.stdin.flush()
        try:
            out, err = child.communicate(timeout=60)
        finally:
            child.kill()  # not left behind when it hangs
    assert (child.returncode, out, err) == (0, "KeyboardInterrupt\n", "")


def test_a_run_s_own_cancellation_leaves_run_sync_as_itself() -> None:
    """Only Ctrl-C becomes ``KeyboardInterrupt``: a cancellation exception of the run's own
    (a model's, here) where no Ctrl-C can come (a worker thread, whose event loop takes no
    signal) leaves ``run_sync`` as it is, as from ``anyio.run``; it was a
    ``KeyboardInterrupt``, which a thread pool's ``result()`` raised in the main thread."""
    raised: list[BaseException] = []

    def ask() -> None:
        try:
            Agent(model=ScriptedModel([asyncio.CancelledError()])).run_sync("hi")
        except BaseException as error:
            raised.append(error)

    worker = threading.Thread(target=ask)
    worker.start()
    worker.join()
    assert [type(error) for error in raised] == [asyncio.CancelledError]


def test_a_run_s_own_cancellation_in_the_main_thread_leaves_run_sync_as_itself() -> None:
    """In the main thread too, where Ctrl-C can come: on Python 3.10 any cancellation
    that left the loop was taken for Ctrl-C, and a model's own became
    ``KeyboardInterrupt``, which a script's ``except KeyboardInterrupt`` takes for the
    user's stop."""
    script = """
import asyncio
from littleghost import Agent
from littleghost.testing import ScriptedModel

try:
    Agent(model=ScriptedModel([asyncio.CancelledError()])).run_sync("hi")
except BaseException as error:
    print(type(error).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell starts it
    )
    assert (done.stdout, done.stderr) == ("CancelledError\n", "")


async def test_messages_hold_history_and_new_messages() -> None:
    """RunResult.messages is the history followed by what the run added."""
    history = [Message.user("earlier"), Message.assistant("earlier answer")]
    model = ScriptedModel([text_response("now")])
    result = await Counter(model=model).run("again", history=history)
    assert result.messages[:2] == tuple(history)
    assert [m.text for m in result.messages[2:]] == ["again", "now"]
    assert [m.text for m in model.requests[0].messages[1:]] == [
        "earlier",
        "earlier answer",
        "again",
    ]


async def test_history_is_not_modified() -> None:
    """The list passed as history is left as it was."""
    history = [Message.user("earlier"), Message.assistant("earlier answer")]
    await Counter(model=ScriptedModel([text_response("now")])).run("again", history=history)
    assert len(history) == 2


async def test_usage_is_summed_over_every_model_call() -> None:
    """RunResult.usage adds up the usage of every model call."""
    model = ScriptedModel(
        [
            tool_call_response("count", {"n": 1}, input_tokens=10, output_tokens=2),
            tool_call_response("count", {"n": 2}, input_tokens=20, output_tokens=3),
            text_response("3", input_tokens=30, output_tokens=4),
        ]
    )
    result = await Counter(model=model).run("count")
    assert result.usage == Usage(60, 9)


async def test_max_turns_raises_limit_exceeded() -> None:
    """A run still calling tools after max_turns model calls raises LimitExceededError."""
    model = ScriptedModel([tool_call_response("count", {"n": n}) for n in range(5)])
    with pytest.raises(LimitExceededError, match="max_turns=3") as caught:
        await Counter(model=model, max_turns=3).run("count forever")
    assert (caught.value.limit, caught.value.value) == ("max_turns", 3)
    assert str(caught.value) == (
        "Counter reached max_turns=3: the run had no answer after 3 model calls; if the "
        "task needs more, raise max_turns (a class attribute or constructor keyword)"
    )
    assert len(model.requests) == 3


async def test_the_calls_of_the_last_turn_are_answered_unrun() -> None:
    """At max_turns no model call would read their results: the last turn's calls never
    run, and the log answers them as not run."""
    ran: list[int] = []

    class Recording(Counter):
        @tool
        async def record(self, n: int) -> int:
            """Record n."""
            ran.append(n)
            return n

    model = ScriptedModel([tool_call_response("record", {"n": n}) for n in range(3)])
    agent = Recording(model=model, max_turns=2, session_store=InMemorySessionStore())
    with pytest.raises(LimitExceededError, match="max_turns=2"):
        await agent.run("record", session_id="s")
    assert ran == [0]
    last = (await agent.session_store.load("s"))[-1]
    assert last.tool_results[0].is_error
    assert last.tool_results[0].content == "Not run: the run reached max_turns=2."


async def test_a_result_an_after_tool_hook_failed_on_is_logged_as_withheld() -> None:
    """The tool finished, then its after_tool hook raised: the run ends with the hook's
    error, and the log tells the model the call ran, its result withheld (not that it was
    stopped before it finished)."""

    class Audited(Counter):
        @after_tool
        def audit(self, result: ToolResult) -> ToolResult:
            raise RuntimeError("the audit log is down")

    model = ScriptedModel([tool_call_response("count", {"n": 1}), text_response("never")])
    agent = Audited(model=model, session_store=InMemorySessionStore())
    with pytest.raises(RuntimeError, match="the audit log is down"):
        await agent.run("count", session_id="s")
    last = (await agent.session_store.load("s"))[-1]
    assert last.tool_results[0].is_error
    assert last.tool_results[0].content == WITHHELD_TEXT


async def test_max_tool_calls_raises_limit_exceeded() -> None:
    """A response whose calls would pass max_tool_calls raises LimitExceededError unrun."""
    calls = [ToolCall(f"c{n}", "count", {"n": n}) for n in range(3)]
    model = ScriptedModel(
        [
            tool_call_response("count", {"n": 0}),
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("never"),
        ]
    )
    with pytest.raises(LimitExceededError, match="max_tool_calls=3") as caught:
        await Counter(model=model, max_tool_calls=3).run("count a lot")
    assert (caught.value.limit, caught.value.value) == ("max_tool_calls", 3)
    assert str(caught.value) == (
        "Counter reached max_tool_calls=3: the model asked for more than 3 tool calls in "
        "the run; if the task needs more, raise max_tool_calls (a class attribute or "
        "constructor keyword)"
    )
    assert len(model.requests) == 2


async def test_exactly_max_tool_calls_is_allowed() -> None:
    """Reaching max_tool_calls without passing it is fine."""
    model = ScriptedModel([tool_call_response("count", {"n": 0}), text_response("done")])
    assert (await Counter(model=model, max_tool_calls=1).run("once")).output == "done"


async def test_final_answer_cut_at_max_tokens_raises_output_limit() -> None:
    """A final response that stopped at max_tokens raises OutputLimitError with it."""
    cut = text_response("The answer is", stop_reason=StopReason.MAX_TOKENS)
    with pytest.raises(OutputLimitError) as caught:
        await Counter(model=ScriptedModel([cut])).run("long question")
    assert caught.value.response is cut


async def test_an_answer_cut_at_max_tokens_says_the_cap_and_what_to_do() -> None:
    """The OutputLimitError names the cap the request sent and says to raise it (or ask
    for less); without a cap it says none was sent, so the provider's own limit stopped
    it, and never to raise a max_tokens the agent does not set."""
    cut = text_response("The answer is", stop_reason=StopReason.MAX_TOKENS)
    with pytest.raises(OutputLimitError) as caught:
        await Counter(model=ScriptedModel([cut]), settings={"max_tokens": 40}).run("long")
    assert str(caught.value) == (
        "the model stopped at its output limit (max_tokens=40) before completing its "
        "answer: raise max_tokens in the agent's settings, or ask for a shorter answer "
        "(the error's response holds what it wrote)"
    )
    with pytest.raises(OutputLimitError) as caught:
        await Counter(model=ScriptedModel([cut])).run("long")
    assert str(caught.value) == (
        "the model stopped at its output limit before completing its answer: no "
        "max_tokens was sent, so the provider's own limit stopped it (its default cap, or "
        "its context window filled: a small local model may write until it does); set "
        "max_tokens in the agent's settings (higher for a longer answer, lower to stop a "
        "rambling model sooner), or ask for a shorter answer (the error's response holds "
        "what it wrote)"
    )
    assert "raise max_tokens" not in str(caught.value)


@pytest.mark.parametrize("arguments", [{"n": 1}, {}, '{"n": 1'])
async def test_tool_calls_cut_at_max_tokens_never_run(arguments: Any) -> None:
    """A response cut at max_tokens may carry a call cut short (arguments half written, or
    none: Anthropic gives ``{}``): it raises OutputLimitError, no call runs, and each is
    answered with an error result saying it was not run, and why (not that a run stopped
    it: the model, reading the session again, would take it for begun)."""
    ran: list[int] = []

    class Counting(Counter):
        @before_tool
        def record(self, call: ToolCall) -> None:
            ran.append(1)

    cut = ModelResponse(
        Message.assistant(tool_calls=[ToolCall("c1", "count", arguments)]), StopReason.MAX_TOKENS
    )
    store = InMemorySessionStore()
    agent = Counting(model=ScriptedModel([cut, text_response("2")]), session_store=store)
    with pytest.raises(OutputLimitError) as caught:
        await agent.run("count", session_id="s")
    assert caught.value.response.message.tool_calls[0].id == "c1" and ran == []
    *_, answered = await store.load("s")
    assert [(r.call_id, r.is_error) for r in answered.tool_results] == [("c1", True)]
    assert answered.tool_results[0].content.startswith("Not run: the answer asking for it")


@pytest.mark.parametrize("output_type", [None, int])
async def test_tool_calls_of_a_filtered_answer_never_run(output_type: type | None) -> None:
    """A refused or filtered answer (``content_filter``) may still carry calls: none runs,
    each is answered with an error result, and the run ends with the answer; a typed
    run's final-result call in it is not taken either (the answer's text must fit)."""
    ran: list[int] = []

    class Counting(Counter):
        @before_tool
        def record(self, call: ToolCall) -> None:
            ran.append(1)

    asked = [ToolCall("c1", "count", {"n": 1}), ToolCall("c2", "final_result", {"result": 1})]
    refused = ModelResponse(
        Message.assistant("I cannot help with that.", tool_calls=asked),
        StopReason.CONTENT_FILTER,
    )
    store = InMemorySessionStore()
    model = ScriptedModel([refused, text_response("2")])
    agent = Counting(
        model=model,
        session_store=store,
        output_type=output_type,
        output_strategy="tool",
        max_turns=1,  # no repair turn
    )
    if output_type is None:
        result = await agent.run("count", session_id="s")
        assert result.output == "I cannot help with that."
        assert result.stop_reason is StopReason.CONTENT_FILTER
    else:
        with pytest.raises(OutputValidationError):
            await agent.run("count", session_id="s")
    assert ran == [] and len(model.requests) == 1
    log = await store.load("s")
    answered = [(r.call_id, r.is_error) for m in log for r in m.tool_results]
    assert answered == [("c1", True), ("c2", True)]


async def test_a_history_with_an_orphan_result_fails_before_any_model_call() -> None:
    """A tool result whose call is missing raises ConfigurationError naming it; no call is made."""
    history = [Message.user("hi"), Message.tool("ghost", "boo")]
    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match=r"history\[1\].*'ghost'"):
        await Counter(model=model).run("again", history=history)
    assert model.requests == []


@pytest.mark.parametrize(
    ("stray", "named"),
    [
        (Message(Role.USER, (ToolCall("c9", "count", {"n": 1}),)), "role 'user'.*not ToolCall"),
        (Message(Role.ASSISTANT, (ToolResult("c9", "1"),)), "role 'assistant'.*not ToolResult"),
        (
            Message(Role.SYSTEM, (ImagePart(url="https://a.example/b.png"),)),
            "role 'system'.*not ImagePart",
        ),
        (Message(Role.USER, (ReasoningPart("thought"),)), "role 'user'.*not ReasoningPart"),
        (
            Message(Role.TOOL, (ToolResult("c9", "1"), TextPart("note"))),
            "role 'tool'.*not TextPart",
        ),
    ],
)
async def test_a_history_message_holding_a_part_its_role_cannot_carry_fails(
    stray: Message, named: str
) -> None:
    """A provider drops such a part (OpenAI: a tool call in a user message) or refuses the
    request (Anthropic): refused before any model call, as ``input`` is, naming where."""
    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match=rf"history\[1\]: a message of {named}"):
        await Counter(model=model).run("again", history=[Message.user("hi"), stray])
    assert model.requests == []


def calls(*ids: str) -> Message:
    return Message.assistant(tool_calls=[ToolCall(call_id, "count", {"n": 1}) for call_id in ids])


def results(*ids: str) -> Message:
    return Message(Role.TOOL, tuple(ToolResult(call_id, "1") for call_id in ids))


@pytest.mark.parametrize(
    ("history", "named"),
    [
        ([calls("a"), results("a", "b"), calls("b")], r"history\[2\].*'b'"),
        ([calls("a"), calls("b"), results("b", "a")], r"history\[3\].*'a'"),
        ([calls("a"), results("a"), calls("b"), results("b", "a")], r"history\[4\].*'a'"),
        ([calls("a"), results("a"), results("a")], r"history\[3\].*'a'"),
        ([calls("a"), results("a", "a")], r"history\[2\].*'a'"),
        ([calls("a", "x"), calls("x"), results("a", "x")], r"history\[3\].*'x'"),
        ([results("zz", "a"), calls("a")], r"history\[1\].*'zz'"),
        ([calls("a"), Message(Role.TOOL, ())], r"history\[2\] is a tool message without"),
    ],
    ids=[
        "later-call",
        "earlier-call",
        "answered-call",
        "second-answer",
        "second-answer-in-one-message",
        "repeated-id-of-a-later-message",
        "before-its-call",
        "no-result",
    ],
)
async def test_a_history_with_a_result_out_of_its_place_fails_before_any_model_call(
    history: list[Message], named: str
) -> None:
    """A tool message answers open calls of one assistant message, each once: any other
    result raises ConfigurationError naming its position and call id."""
    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match=named):
        await Counter(model=model).run("again", history=[Message.user("count"), *history])
    assert model.requests == []


@pytest.mark.parametrize(
    "history",
    [
        [calls("a", "b"), results("b", "a")],
        [calls("x", "x"), results("x"), results("x")],
        [calls("x", "x"), results("x", "x")],
        [calls("a"), calls("a"), results("a"), results("a")],
    ],
    ids=["parallel-in-one-message", "repeated-ids", "repeated-ids-in-one-message", "nested"],
)
async def test_a_history_whose_results_answer_their_calls_is_accepted(
    history: list[Message],
) -> None:
    """Results answer the nearest open call with their id; the request shows each call's
    results right after it, and nothing needs repairing."""
    seed = [Message.user("count"), *history]
    model = ScriptedModel([text_response("ok")])
    result = await Counter(model=model).run("again", history=seed)
    assert len(result.messages) == len(seed) + 2
    assert answered_in_place(model.requests[0].messages)


def answered_in_place(messages: Sequence[Message]) -> bool:
    """Each call is answered once by the tool messages right after its assistant message,
    and no tool message stands anywhere else."""
    waiting: collections.Counter[str] = collections.Counter()
    for message in messages:
        if message.role is Role.TOOL:
            answered = collections.Counter(r.call_id for r in message.tool_results)
            if answered - waiting:
                return False
            waiting -= answered
        elif waiting:
            return False
        else:
            waiting.update(call.id for call in message.tool_calls)
    return not waiting


async def test_a_call_without_result_is_repaired_with_an_error_result() -> None:
    """An unanswered call in history gets an appended error result; originals stay."""
    call = ToolCall("open", "count", {"n": 1})
    history = [Message.user("count"), Message.assistant(tool_calls=[call]), Message.user("hello?")]
    model = ScriptedModel([text_response("sorry")])
    result = await Counter(model=model).run("still there?", history=history)
    assert result.messages[:3] == tuple(history)
    repair = result.messages[3]
    assert repair.role is Role.TOOL
    assert (repair.tool_results[0].call_id, repair.tool_results[0].is_error) == ("open", True)
    seen = model.requests[0].messages
    position = next(i for i, m in enumerate(seen) if m.tool_calls)
    assert seen[position + 1].tool_results[0].call_id == "open"


async def test_a_replayed_response_is_logged_under_an_id_of_its_own() -> None:
    """A model that hands back one response object twice: the second copy enters the log
    under a fresh id; the model's response is left as it was."""
    same = tool_call_response("count", {"n": 1}, call_id="c")
    model = ScriptedModel([same, same, text_response("done")])
    result = await Counter(model=model).run("count twice")
    ids = [message.id for message in result.messages]
    assert len(set(ids)) == len(ids)
    first, second = (message for message in result.messages if message.tool_calls)
    assert first == same.message
    assert second.content == same.message.content and second.id != same.message.id


async def test_an_after_model_hook_reusing_a_logged_id_gets_a_fresh_one() -> None:
    class Reusing(Counter):
        @after_model
        def reuse(self, response: ModelResponse, context: RunContext) -> ModelResponse:
            message = attrs.evolve(response.message, id=context.messages[0].id)
            return attrs.evolve(response, message=message)

    model = ScriptedModel([tool_call_response("count", {"n": 1}), text_response("2")])
    result = await Reusing(model=model).run("count")
    ids = [message.id for message in result.messages]
    assert len(set(ids)) == len(ids)
    assert [message.role for message in result.messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]


async def test_a_history_with_a_repeated_id_fails_naming_both_positions() -> None:
    history = [Message.user("hi", id="same"), Message.assistant("hello", id="same")]
    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match=r"history\[0\] and history\[1\] .* 'same'"):
        await Counter(model=model).run("again", history=history)
    assert model.requests == []


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"input": 42}, TypeError, "input"),
        ({"input": Message.assistant("hi")}, TypeError, "input"),
        ({"history": "hello"}, TypeError, "history"),
        ({"history": 5}, TypeError, "history"),
        ({"history": ["hello"]}, TypeError, r"history\[0\]"),
        ({"timeout": "10"}, TypeError, "timeout"),
        ({"timeout": -1}, TypeError, "timeout"),
        ({"timeout": True}, TypeError, "timeout"),
        ({"deadline": "soon"}, TypeError, "deadline"),
        ({"timeout": math.nan}, TypeError, "timeout"),
        ({"deadline": math.nan}, TypeError, "deadline"),
        ({"settings": ["max_tokens"]}, ConfigurationError, "settings"),
        ({"settings": {1: 2}}, ConfigurationError, "settings"),
        ({"session_id": 5}, TypeError, "session_id"),
        ({"session_id": ""}, TypeError, "session_id"),
    ],
)
async def test_run_rejects_wrong_types(
    options: dict[str, Any], error: type[Exception], names: str
) -> None:
    """Wrong types to run() raise TypeError or ConfigurationError naming the argument."""
    model = ScriptedModel([text_response("never")])
    arguments = {"input": "hi", **options}
    with pytest.raises(error, match=names):
        await Counter(model=model).run(**arguments)
    assert model.requests == []


async def test_run_settings_override_agent_settings() -> None:
    """settings= given to run() are laid over the agent's for that run only."""
    model = ScriptedModel([text_response("a"), text_response("b")])
    agent = Counter(model=model, settings={"temperature": 0.2, "seed": 1})
    await agent.run("hi", settings={"temperature": 0.9})
    await agent.run("hi")
    assert [dict(r.settings) for r in model.requests] == [
        {"temperature": 0.9, "seed": 1},
        {"temperature": 0.2, "seed": 1},
    ]


async def test_a_script_that_runs_out_raises_protocol_error() -> None:
    """A model with no step left raises ProtocolError out of the run, saying which call
    came past the script's end, what it followed (a role, no content) and what to add."""
    model = ScriptedModel([tool_call_response("count", {"n": 1})])
    with pytest.raises(ProtocolError) as caught:
        await Counter(model=model).run("count")
    assert str(caught.value) == (
        "ScriptedModel 'scripted' ran out of steps: call 2 came after the script's 1 step(s) "
        "(the request ends with a tool message); add a step for it: each model call takes "
        "one, the call after tool results included"
    )


async def test_a_script_that_a_summary_call_used_up_says_so() -> None:
    """A summary call of @manage_context takes a step too: the call past the script's end
    says which calls came before it."""

    @manage_context(context_window_override=2_000, preserve_recent_messages=2)
    class Managed(Agent):
        pass

    words = "word " * 40
    history = [
        message
        for n in range(20)
        for message in (Message.user(f"question {n} {words}"), Message.assistant(words))
    ]
    model = ScriptedModel([text_response("It shipped.")])
    with pytest.raises(ProtocolError) as caught:
        await Managed(model=model).run("Where is it?", history=history)
    assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]
    assert str(caught.value) == (
        "ScriptedModel 'scripted' ran out of steps: call 2 came after the script's 1 step(s) "
        "(the request ends with a user message; the calls before it: context_compaction); "
        "add a step for it: each model call takes one, the call after tool results included"
    )


async def test_an_assert_in_a_summary_step_fails_only_that_compaction() -> None:
    """As the README warns: a callable step's exception is the model call's error, so an
    ``assert`` failing in the step that answers a summary call fails that compaction
    only; the run goes on, and ``model.requests`` is where a test asserts instead."""

    @manage_context(context_window_override=2_000, preserve_recent_messages=2)
    class Managed(Agent):
        pass

    def summary(request: ModelRequest) -> ModelResponse:
        assert "order 99" in request.messages[-1].text  # it is not: this fails
        return text_response("notes")

    words = "word " * 40
    history = [
        message
        for n in range(20)
        for message in (Message.user(f"question {n} {words}"), Message.assistant(words))
    ]
    model = ScriptedModel([summary, text_response("It shipped.")])
    result = await Managed(model=model).run("Where is it?", history=history)
    assert (result.output, model.remaining) == ("It shipped.", 0)
    assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]
    assert "order 99" not in model.requests[0].messages[-1].text


class Prepared:
    """A model with ``prepare()``, noting what it was asked to do, in order."""

    provider = "custom"
    name = "prepared"
    context_window = None

    def __init__(self) -> None:
        self.events: list[str] = []

    async def prepare(self) -> None:
        self.events.append("prepare")

    async def respond(self, request: ModelRequest) -> ModelResponse:
        self.events.append("respond")
        if not any(message.role is Role.TOOL for message in request.messages):
            return tool_call_response("count", {"n": 1})
        return text_response("done")


async def test_prepare_is_awaited_once_before_the_first_call() -> None:
    """A model's prepare() runs once per run, before its first call."""
    model = Prepared()
    await Counter(model=model).run("hi")
    assert model.events == ["prepare", "respond", "respond"]


class Junk:
    """A model that answers with something other than a ModelResponse."""

    provider = "custom"
    name = "junk"
    context_window = None

    async def respond(self, request: ModelRequest) -> Any:
        return "not a response"


async def test_a_model_returning_junk_raises_protocol_error() -> None:
    """A model that does not return a ModelResponse raises ProtocolError."""
    with pytest.raises(ProtocolError, match="not a ModelResponse"):
        await Counter(model=Junk()).run("hi")


async def _answered(answer: object) -> object:
    return answer


@pytest.mark.parametrize(
    ("answer", "told"),
    [
        (Message.assistant("hi"), "(wrap the message: ModelResponse(message, stop_reason, usage))"),
        ("hi", "(wrap the text: ModelResponse(Message.assistant(text), stop_reason, usage))"),
        ({"text": "hi"}, "returned dict, not a ModelResponse"),
    ],
)
async def test_a_model_returning_its_answer_unwrapped_is_told_to_wrap_it(
    answer: object, told: str
) -> None:
    """A model of your own that returns the answer's message or text (a natural first
    draft) was told only ``returned Message, not a ModelResponse``."""
    model = Junk()
    model.respond = lambda request: _answered(answer)  # type: ignore[method-assign]
    with pytest.raises(ProtocolError) as caught:
        await Counter(model=model).run("hi")
    assert str(caught.value).endswith(told)


class UnawaitedStream(Junk):
    """A model whose stream is an ``async def`` that returns its answer: no generator."""

    async def stream(self, request: ModelRequest) -> StreamDone:  # type: ignore[override]
        return StreamDone(text_response("answered"))


async def test_a_coroutine_a_model_left_unawaited_is_told_and_closed() -> None:
    """A model of your own whose respond returns a coroutine it did not await (``return
    self._ask(request)`` in an ``async def``) is told to await it, and a stream that is
    an ``async def`` without ``yield`` is named: either coroutine is closed, where Python
    also warned, once it was collected, that it was never awaited."""
    model = Junk()
    model.respond = lambda request: _answered(_answered(text_response("hi")))  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(ProtocolError) as answered:
            await Counter(model=model).run("hi")
        with pytest.raises(ConfigurationError) as streamed:
            await _streamed_output(UnawaitedStream())
        said = str(answered.value), str(streamed.value)
        del answered, streamed
        gc.collect()
    assert said[0] == (
        "model 'junk' returned coroutine, not a ModelResponse (await it: ModelResponse is "
        "what the coroutine gives)"
    )
    assert said[1].startswith("model 'junk': stream() returned coroutine, not an async ")
    assert [str(warning.message) for warning in warned] == []


WINDOW_SAID = "an int from 1 to 2**63-1 (tokens), or None (or 0) when unknown"
MISHELD = [
    ("name", None, "name must be a non-empty str, not None"),
    ("name", 5, "name must be a non-empty str, not 5"),
    ("name", "", "name must be a non-empty str, not ''"),
    ("provider", b"custom", "provider must be a non-empty str, not b'custom'"),
    *[
        ("context_window", window, f"context_window must be {WINDOW_SAID}, not {window!r}")
        for window in ["8192", -5, 1.5, True, 2**63, math.nan]
    ],
]


@pytest.mark.parametrize(("member", "held", "said"), MISHELD)
def test_a_model_holding_a_member_of_the_wrong_type_is_refused_where_declared(
    member: str, held: object, said: str
) -> None:
    """A model of your own holding its ``name``, ``provider`` or ``context_window`` as a
    plain value of the wrong type is refused where it is declared (the class, or the
    agent made with it), naming the model's class and the member: ``name = None`` ran,
    and a window of ``"8192"`` was refused only by ``@manage_context``, at the first
    call. A property's value may change (a local model learns its window): it is read at
    the call."""
    model = Junk()
    setattr(model, member, held)
    told = f"Counter.model: Junk's {said}"
    with pytest.raises(ConfigurationError) as declared:
        type("Declared", (Counter,), {"model": model})
    assert str(declared.value) == told.replace("Counter", "Declared", 1)
    with pytest.raises(ConfigurationError) as made:
        Counter(model=model)  # type: ignore[arg-type]
    assert str(made.value) == told.replace("Counter.model", "Counter(…, model=)", 1)
    for fine in (None, 0, 1, 2**63 - 1) if member == "context_window" else ("x",):
        setattr(model, member, fine)
        type("Declared", (Counter,), {"model": model})


@pytest.mark.parametrize(("member", "held", "said"), MISHELD)
async def test_a_model_holding_a_member_of_the_wrong_type_is_refused_wherever_given(
    member: str, held: object, said: str
) -> None:
    """Wherever else a model is given, one holding a member of the wrong type is refused
    as the agent's is, naming where and the model's class: ``agent.model =``,
    ``Summarization(model=)`` (it summarized with ``name = None``) and
    ``context.complete(model=)`` (the side call ran)."""
    model = Junk()
    setattr(model, member, held)
    agent = Counter(model=ScriptedModel([text_response("ok")]))
    with pytest.raises(ConfigurationError) as assigned:
        agent.model = model
    assert str(assigned.value) == f"Counter.model: Junk's {said}"
    with pytest.raises(ConfigurationError) as summarizing:
        Summarization(model=model)  # type: ignore[arg-type]
    assert str(summarizing.value) == f"Summarization.model: Junk's {said}"
    refused: list[str] = []

    class Asking(Agent):
        @tool
        async def ask(self, context: RunContext) -> str:
            """Ask aside."""
            try:
                await context.complete(ModelRequest([Message.user("?")]), model=model)  # type: ignore[arg-type]
            except ConfigurationError as error:
                refused.append(str(error))
            return "asked"

    turns = [tool_call_response("ask", {}), text_response("ok")]
    assert (await Asking(model=ScriptedModel(turns)).run("hi")).output == "ok"
    assert refused == [f"context.complete(model=): Junk's {said}"]


@manage_context
class ManagedCounter(Counter):
    """``Counter`` with the default ``@manage_context`` (which reads the model's window)."""


@pytest.mark.parametrize("member", ["name", "provider", "context_window"])
async def test_a_member_property_raising_attribute_error_is_told_as_its_own(
    member: str,
) -> None:
    """A model's property that raises ``AttributeError`` (a typo inside it) is told by
    its own error, not as a member the model lacks ("it has no name" hid the typo):
    where the model is declared, or at the run where Python's ``isinstance`` of a
    protocol reads no property (3.12+); a window's was read as unknown there, the run
    going on with 200 000 tokens assumed."""

    def mistyped(model: object) -> str:
        return model.nmae  # type: ignore[attr-defined, no-any-return]

    broken = type("Broken", (ScriptedModel,), {member: property(mistyped)})
    with pytest.raises((ConfigurationError, AttributeError)) as caught:
        await ManagedCounter(model=broken([text_response("ok")])).run("hi")
    said = str(caught.value)
    assert "'Broken' object has no attribute 'nmae'" in said
    assert "it has no" not in said


class Blocking:
    """A model whose respond is a plain def, as a newcomer may write one."""

    provider = "custom"
    name = "blocking"
    context_window = None

    def respond(self, request: ModelRequest) -> ModelResponse:
        return text_response("answered")


class BlockingPrepare(Junk):
    """A model whose optional prepare is a plain def."""

    def prepare(self) -> None:
        pass


class BlockingStream(Junk):
    """A model whose optional stream is a plain generator."""

    def stream(self, request: ModelRequest) -> Iterator[object]:
        yield from ()


async def _streamed_output(model: object) -> object:
    async with Counter(model=model).stream("hi") as events:  # type: ignore[arg-type]
        async for _ in events:
            pass
    return events.result.output


async def _run_output(model: object) -> object:
    return (await Counter(model=model).run("hi")).output  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "method", "returned", "run", "should_be"),
    [
        (Blocking(), "respond", "ModelResponse", _run_output, "awaitable"),
        (Blocking(), "respond", "ModelResponse", _streamed_output, "awaitable"),
        (BlockingPrepare(), "prepare", "NoneType", _run_output, "awaitable"),
        (BlockingStream(), "stream", "generator", _streamed_output, "async iterator"),
    ],
)
async def test_a_model_method_that_is_not_async_is_told_so(
    model: Any, method: str, returned: str, run: Any, should_be: str
) -> None:
    """A custom model's plain ``def`` where the protocol has an ``async def`` fails its
    first call naming the model and the method, not with Python's bare ``TypeError``."""
    with pytest.raises(ConfigurationError) as caught:
        await run(model)
    assert str(caught.value).startswith(
        f"model {model.name!r}: {method}() returned {returned}, not an {should_be}: "
        f"a Model's {method} is "
    )


class StrStream(Junk):
    """A model whose stream yields its text as a bare str."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        yield "answered"
        yield StreamDone(text_response("answered"))


async def test_a_stream_chunk_of_another_type_is_named() -> None:
    """A custom stream's chunk that is not one of the four kinds (its text as a bare str)
    fails the run naming the model and what it yielded: it was skipped, and the run
    failed later, if at all, with "ended its stream without a response"."""
    log = []
    with pytest.raises(ConfigurationError) as caught:
        async with Counter(model=StrStream()).stream("hi") as events:  # type: ignore[arg-type]
            async for event in events:
                log.append(event)
    assert str(caught.value) == (
        "model 'junk': stream() yielded str, not a TextChunk, ReasoningChunk, "
        "ToolCallChunk or StreamDone"
    )
    assert [m.role.value for m in events.messages] == ["user"]


AFTER_DONE = {
    "TextChunk": TextChunk("more"),
    "ReasoningChunk": ReasoningChunk("more"),
    "ToolCallChunk": ToolCallChunk(),
    "StreamDone": StreamDone(text_response("another answer")),
}


class ChattyStream(Junk):
    """A model whose stream goes on after its StreamDone with the ``trailing`` chunks."""

    def __init__(self, before: list[object], trailing: list[object]) -> None:
        self.before = before
        self.trailing = trailing

    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        for chunk in self.before:
            yield chunk
        yield StreamDone(
            ModelResponse(Message.assistant("answered"), StopReason.END_TURN, Usage(7, 3))
        )
        for chunk in self.trailing:
            yield chunk


@pytest.mark.parametrize("seed", range(20))
async def test_a_stream_that_goes_on_after_its_stream_done_is_refused(seed: int) -> None:
    """A custom stream that yields after its StreamDone (a chunk, a second StreamDone)
    fails naming the model and the first chunk after it, billed the answer's usage: the
    chunks after it were streamed as the answer's text and a second StreamDone replaced
    the answer, so what was streamed and what the log kept disagreed."""
    rng = random.Random(seed)
    kinds = list(AFTER_DONE)
    before = [TextChunk("ans"), ReasoningChunk("why"), ToolCallChunk()][: rng.randrange(4)]
    trailing = [AFTER_DONE[rng.choice(kinds)] for _ in range(rng.randrange(1, 4))]
    streamed = []
    with pytest.raises(ProtocolError) as caught:
        async with Counter(model=ChattyStream(before, trailing)).stream("hi") as events:  # type: ignore[arg-type]
            async for event in events:
                streamed.append(event)
    assert str(caught.value) == (
        f"model 'junk': stream() yielded {type(trailing[0]).__name__} after its "
        "StreamDone (a stream ends with exactly one StreamDone)"
    )
    assert caught.value.usage == Usage(7, 3)
    assert [getattr(event, "text", None) for event in streamed].count("more") == 0
    assert [m.role.value for m in events.messages] == ["user"]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: TextChunk(5), "TextChunk.text must be a str, not 5"),
        (lambda: ReasoningChunk(None), "ReasoningChunk.text must be a str, not None"),
        (lambda: StreamDone("answered"), "StreamDone.response must be a ModelResponse, not str"),
    ],
)
def test_a_stream_chunk_of_the_wrong_content_is_refused_as_it_is_made(make: Any, said: str) -> None:
    """A chunk a custom stream makes of the wrong type fails where it is made: a
    ``TextChunk(5)`` was streamed as a ``TextDelta`` whose text is no str."""
    with pytest.raises(TypeError) as caught:
        make()
    assert str(caught.value) == said


TAKES = "input, history, settings, session_id, timeout, deadline, output_type"


async def test_an_unknown_run_keyword_names_the_method_and_what_it_takes() -> None:
    agent = Counter(model=ScriptedModel([]))
    for name, call in [
        ("run_sync", lambda: agent.run_sync("hi", max_turns=3)),
        ("stream", lambda: agent.stream("hi", max_turns=3)),
    ]:
        with pytest.raises(
            TypeError, match=rf"Counter\.{name}\(\) .* 'max_turns'; it takes {TAKES}"
        ):
            call()
    with pytest.raises(TypeError, match=rf"Counter\.run\(\) .* 'max_turns'; it takes {TAKES}"):
        await agent.run("hi", max_turns=3)  # type: ignore[call-arg]


async def test_run_sync_inside_an_event_loop_says_to_await_run() -> None:
    agent = Counter(model=ScriptedModel([text_response("ok")]))
    with pytest.raises(
        RuntimeError, match=r"Counter\.run_sync\(\) cannot run inside .*await agent\.run"
    ):
        agent.run_sync("hi")
    assert (await agent.run("hi")).output == "ok"


@pytest.mark.parametrize("seed", range(3))
async def test_an_agent_whose_tool_runs_it_again_stops_at_the_nesting_limit(seed: int) -> None:
    """A model that always has the agent's tool run the agent again, each level by
    ``run()`` or ``stream()`` (with a session or not) or ``run_sync()`` from a sync tool:
    the run nested past ``MAX_NESTED_RUNS`` raises ``LimitExceededError`` before it calls
    its model, which its caller's tool answers; every level ends."""
    rng = random.Random(seed)
    levels: list[int] = []
    limits: list[tuple[str | None, int | None]] = []
    sessions = itertools.count()

    def steps(level: int) -> list[Any]:
        return [tool_call_response("again", {"level": level}), text_response("done")]

    class Recursive(Agent):
        @tool
        async def again(self, level: int) -> str:
            """Ask the agent again."""
            levels.append(level)
            if level > 3 * MAX_NESTED_RUNS:  # so the test fails, never runs for ever
                return "too deep"
            try:
                return await ask(level + 1)
            except LimitExceededError as error:
                limits.append((error.limit, error.value))
                raise

    async def ask(level: int) -> str:
        how = rng.choice(["run", "session", "stream", "sync"])
        nested = Recursive(model=ScriptedModel(steps(level)))
        if how == "sync":
            result = await anyio.to_thread.run_sync(nested.run_sync, "again")
            return result.output
        session_id = f"s{next(sessions)}" if how == "session" else None
        if how == "stream":
            async with nested.stream("again") as events:
                async for _ in events:
                    pass
            return events.result.output
        return (await nested.run("again", session_id=session_id)).output

    result = await Recursive(model=ScriptedModel(steps(1))).run("go")
    assert result.output == "done"
    assert max(levels) == MAX_NESTED_RUNS
    assert limits == [("nested_runs", MAX_NESTED_RUNS)]


async def test_runs_a_tool_leaves_to_start_after_it_are_not_nested_in_it() -> None:
    """A tool that has a task group outside its run start the agent's next run, and
    returns: a chain of more runs than ``MAX_NESTED_RUNS``, each started from the one
    before but after it ended, all run."""
    ran: list[int] = []

    async with anyio.create_task_group() as group:

        class FollowUp(Agent):
            @tool
            async def schedule(self, number: int) -> str:
                """Schedule the next run."""
                ran.append(number)
                if number < MAX_NESTED_RUNS + 8:
                    group.start_soon(start, number + 1)
                return "scheduled"

        async def start(number: int) -> None:
            await anyio.sleep(0.001)  # once the run that started it has ended
            steps = [tool_call_response("schedule", {"number": number}), text_response("ok")]
            await FollowUp(model=ScriptedModel(steps)).run("next")

        group.start_soon(start, 1)
    assert ran == list(range(1, MAX_NESTED_RUNS + 9))
