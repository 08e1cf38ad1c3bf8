"""Fact retention under context compaction, on a real model.

After the context window has filled and older turns were compacted, does the agent still
know what the user (or a tool) told it early on? Long conversations are replayed turn by
turn through each framework's own loop, so compaction happens as in production:
incrementally, as the window fills. Three (``retention_data.py``: a support chat, a
tool-heavy case, a debugging session; about 3 000 tokens each, 8 facts planted early in
each) and three that stress compaction (``retention_stress.py``: a customer correcting
values she gave, some corrections summarized with the old value and some left in the
preserved tail; a 57-turn trip plan compacted again and again, facts early and spread
over the middle; a support chat in Japanese). The assistant's turns come from the script, each
reporting the input tokens the server counts for its request; summary calls go to the
real model, and a request over the window goes to the server, which rejects it as it
would in production. Then, for each fact, the final log is branched and the real model is
asked the probe question; an answer counts when it contains the expected value, and is
*stale* when it gives a value a correction superseded instead. The model is
Qwen2.5-0.5B-Instruct (Q4 GGUF, ``/work/shared/bin/benchmark-model.sh``) on llama.cpp's
server, temperature 0, seed 7.

Conditions (W, the compaction window, is a quarter of the ceiling's 8 192 tokens):

- ``ceiling``: no context management, the whole conversation in an 8 192-token window;
- ``default``: ``@manage_context(context_window_override=W)``;
- ``masking``: the same plus ``mask_tool_results=2``;
- ``sliding-window``: ``strategy=SlidingWindow(keep_last_turns=N)``, N the most turns
  that always fit the share of W the default compaction aims at;
- ``bounded-view``: ``budget=PromptBudget(...)`` sized to W, ``summarize=False``;
- ``langchain``: ``create_agent`` with ``SummarizationMiddleware`` (trigger at 85 % of W,
  keep 40 % of W) summarizing with ``ChatOpenAI`` on the same server;
- ``default (base)``, with ``--base DIR``: the default condition with the littleghost of
  another checkout (a process of its own with its own servers, same binary, model and
  settings; its answers judged here), side by side with this one's.

Every condition but the ceiling talks to a server started with ``n_ctx`` W (same
binary, same model; one server runs at a time), so a request that does not fit W fails as it would in a deployment
with that window. Prints a markdown table (facts answered, % of the ceiling, facts in
view — the expected value somewhere in the request that asked the probe question —,
stale answers, summary calls and their output tokens, seconds), the per-turn
compactions, the answers judged, which facts each new summary of the replay holds (in
its notes, in its quotes), and the final summaries of the default conditions and
langchain.

Set up once with ``sh benchmarks/setup.sh``, then run::

    benchmarks/.env/bin/python benchmarks/retention.py
    benchmarks/.env/bin/python benchmarks/retention.py --quick      # one conversation
    benchmarks/.env/bin/python benchmarks/retention.py --conversations tools \\
        --conditions ceiling,default --base ../lg-base
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
from attrs import define, frozen
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from retention_data import CONVERSATIONS, Conversation, Fact, Turn
from retention_stress import CONVERSATIONS as STRESS_CONVERSATIONS

from littleghost import Agent, Message, Role, ToolCall, manage_context
from littleghost.context import PromptBudget, SlidingWindow
from littleghost.context.summarize import QUOTES_HEADING, summary_text
from littleghost.events import CompactionFinished
from littleghost.models import ModelRequest, ModelResponse, ToolSpec, Usage
from littleghost.models.local import SERVER_ENV, LocalModel
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import Fact as JudgedFact
from littleghost.testing import text_response, tool_call_response

SERVER = Path("/work/shared/bin/llama-server")
MODEL_SCRIPT = Path("/work/shared/bin/benchmark-model.sh")
CEILING_WINDOW = 8192
WINDOW = CEILING_WINDOW // 4
SEED = 7
MAX_TOKENS = 128
SETTINGS = {"temperature": 0, "seed": SEED, "max_tokens": MAX_TOKENS}
THRESHOLD = 0.85
"""littleghost's default compression threshold; langchain's trigger uses the same share."""
SIZED_SHARE = 0.8 * THRESHOLD
"""The share of W the sliding window is sized to: what the default compaction aims at."""
SAFETY_TOKENS = WINDOW // 10
LANGCHAIN_KEEP = 0.4
SUMMARY_CAP = WINDOW // 4
"""littleghost's default summary cap at W, given to langchain's summarizer too."""
REPLAY_SESSION = "replay"
NOT_FOUND = "No record found."
LANGCHAIN_SUMMARY_PREFIX = "Here is a summary of the conversation to date:\n\n"
UNAVAILABLE = "Lookups are unavailable during this check; answer from the conversation so far."
ALL_CONVERSATIONS = (*CONVERSATIONS, *STRESS_CONVERSATIONS)
BASE = "default (base)"
"""The default condition run on another checkout (``--base``)."""


# --- the llama.cpp servers ---------------------------------------------------------


class TokenCounter:
    """Counts tokens as the server does: its chat template, then its tokenizer."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def text(self, text: str) -> int:
        """The tokens of ``text``."""
        answer = await self._client.post("/tokenize", json={"content": text})
        answer.raise_for_status()
        return len(answer.json()["tokens"])

    async def prompt(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> int:
        """The prompt tokens of a chat request in OpenAI form."""
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        answer = await self._client.post("/apply-template", json=body)
        answer.raise_for_status()
        return await self.text(answer.json()["prompt"])

    async def request(self, request: ModelRequest) -> int:
        """The prompt tokens of a littleghost request."""
        return await self.prompt(openai_messages(request.messages), openai_tools(request.tools))


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """littleghost messages as chat-completions messages (for counting only)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        if message.role is Role.TOOL:
            converted += [
                {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
                for result in message.tool_results
            ]
        elif message.role is Role.ASSISTANT:
            entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            if message.tool_calls:
                entry["tool_calls"] = [openai_call(call) for call in message.tool_calls]
            converted.append(entry)
        else:
            role = "system" if message.role.is_trusted else message.role.value
            converted.append({"role": role, "content": message.text})
    return converted


def openai_call(call: ToolCall) -> dict[str, Any]:
    arguments = (
        call.arguments if isinstance(call.arguments, str) else json.dumps(dict(call.arguments))
    )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def openai_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in specs
    ]


@frozen
class Servers:
    """The server of the conditions being run (its ``n_ctx`` their window) and the token
    counter (the same binary and model for every window: the same counts)."""

    model: LocalModel
    window: int
    counter: TokenCounter

    def for_window(self, window: int) -> LocalModel:
        assert window == self.window
        return self.model

    def url(self, model: LocalModel) -> str:
        assert model.base_url is not None
        return model.base_url

    def key(self, model: LocalModel) -> str:
        """The API key the server takes requests with (random per server)."""
        assert model.api_key is not None
        return model.api_key


def model_path() -> Path:
    """The Qwen2.5-0.5B-Instruct GGUF the benchmark script assembles."""
    printed = subprocess.run([str(MODEL_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(printed.stdout.strip())


# --- tools -----------------------------------------------------------------------------


@frozen
class ToolResults:
    """What the tools answer: the script's results by call, or ``fallback``."""

    results: dict[str, str]
    fallback: str

    def answer(self, name: str, **arguments: str) -> str:
        return self.results.get(call_key(name, arguments), self.fallback)


def call_key(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}:{json.dumps(arguments, sort_keys=True)}"


def scripted_results(conversation: Conversation) -> ToolResults:
    results = {
        call_key(step.name, dict(step.arguments)): step.result
        for turn in conversation.turns
        for step in turn.tool_steps
    }
    return ToolResults(results, NOT_FOUND)


def care_tools(results: ToolResults) -> list[Callable[..., str]]:
    """The care desk's tools, answering from ``results``."""

    def get_account(customer_id: str) -> str:
        """Get a customer's account: name, tier, credit, language, open orders."""
        return results.answer("get_account", customer_id=customer_id)

    def lookup_order(order_id: str) -> str:
        """Look up an order: items, total, payment, tracking number."""
        return results.answer("lookup_order", order_id=order_id)

    def track_shipment(tracking_number: str) -> str:
        """Track a parcel by its tracking number."""
        return results.answer("track_shipment", tracking_number=tracking_number)

    def check_inventory(sku: str) -> str:
        """Check the stock of a product by its SKU."""
        return results.answer("check_inventory", sku=sku)

    def create_ticket(customer_id: str, summary: str) -> str:
        """Open a ticket for another team about a customer."""
        return results.answer("create_ticket", customer_id=customer_id, summary=summary)

    return [get_account, lookup_order, track_shipment, check_inventory, create_ticket]


def tools_for(conversation: Conversation, results: ToolResults) -> list[Callable[..., str]]:
    return care_tools(results) if conversation.uses_tools else []


# --- sizes -----------------------------------------------------------------------------


def turn_messages(turn: Turn, number: int) -> list[Message]:
    """A turn of the script as littleghost messages."""
    messages = [Message.user(turn.user)]
    for index, step in enumerate(turn.tool_steps):
        call = ToolCall(f"call_{number}_{index}", step.name, dict(step.arguments))
        messages += [Message.assistant(tool_calls=(call,)), Message.tool(call.id, step.result)]
    return [*messages, Message.assistant(turn.answer)]


@frozen
class Sizing:
    """A conversation's sizes in the model's tokens."""

    fixed_tokens: int
    """Instructions and tool schemas."""
    turn_tokens: tuple[int, ...]
    total_tokens: int

    def turns_that_fit(self, budget: int) -> int:
        """The most consecutive turns that always fit ``budget`` beside the fixed part."""
        room = budget - self.fixed_tokens
        count = 1
        while count < len(self.turn_tokens) and all(
            sum(self.turn_tokens[start : start + count + 1]) <= room
            for start in range(len(self.turn_tokens) - count)
        ):
            count += 1
        return count


async def measure(conversation: Conversation, counter: TokenCounter) -> Sizing:
    tools = openai_tools(agent_class(conversation, InMemorySessionStore(), None)().tool_specs)
    system = openai_messages([Message.system(conversation.instructions)])
    fixed = await counter.prompt(system, tools)
    bare = await counter.prompt(system, [])
    turns = [turn_messages(turn, number) for number, turn in enumerate(conversation.turns)]
    sizes = [await counter.prompt(system + openai_messages(turn), []) - bare for turn in turns]
    return Sizing(fixed, tuple(sizes), fixed + sum(sizes))


# --- littleghost -----------------------------------------------------------------------


def turn_responses(turn: Turn, number: int) -> list[ModelResponse]:
    """What the assistant answers in a turn: its tool calls, then its answer."""
    calls = [
        tool_call_response(step.name, dict(step.arguments), call_id=f"call_{number}_{index}")
        for index, step in enumerate(turn.tool_steps)
    ]
    return [*calls, text_response(turn.answer)]


def reply_text(message: Message) -> str:
    return message.text or json.dumps([openai_call(call) for call in message.tool_calls])


@define
class SummaryLedger:
    """The summary calls made through a model, and their output tokens."""

    calls: int = 0
    tokens: int = 0

    async def call(self, model: LocalModel, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        response = await model.respond(request)
        self.tokens += response.usage.output_tokens
        return response


class LedgerModel:
    """A littleghost model over the real one that records the summary calls."""

    provider = "local"

    def __init__(self, real: LocalModel, ledger: SummaryLedger) -> None:
        self._real = real
        self.ledger = ledger
        self.chats: list[ModelRequest] = []
        """The chat requests, in order."""

    @property
    def name(self) -> str:
        return self._real.name

    @property
    def context_window(self) -> int | None:
        return self._real.context_window

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if request.purpose != "chat":
            return await self.ledger.call(self._real, request)
        return await self.chat(request)

    async def chat(self, request: ModelRequest) -> ModelResponse:
        self.chats.append(request)
        return await self._real.respond(request)


class ReplayModel(LedgerModel):
    """Plays the script for chat requests; a chat request over the window goes to the
    real model, whose server rejects it. Scripted answers report the input tokens the
    server counts."""

    def __init__(self, real: LocalModel, ledger: SummaryLedger, counter: TokenCounter) -> None:
        super().__init__(real, ledger)
        self._counter = counter
        self._queue: list[ModelResponse] = []

    def play(self, responses: Sequence[ModelResponse]) -> None:
        """Answer the next chat requests with ``responses``."""
        self._queue = list(responses)

    async def chat(self, request: ModelRequest) -> ModelResponse:
        prompt = await self._counter.request(request)
        window = self.context_window
        if window is not None and prompt > window:
            return await super().chat(request)
        scripted = self._queue.pop(0)
        output = await self._counter.text(reply_text(scripted.message))
        return attrs.evolve(scripted, usage=Usage(prompt, output))


Decorate = Callable[[type[Agent]], type[Agent]]


def agent_class(
    conversation: Conversation, store: InMemorySessionStore, context: Decorate | None
) -> type[Agent]:
    """An agent class for ``conversation``, with ``context`` management if given."""
    namespace = {
        "instructions": conversation.instructions,
        "settings": SETTINGS,
        "session_store": store,
        "tools": tools_for(conversation, scripted_results(conversation)),
    }
    cls = type(f"{conversation.name.title()}Agent", (Agent,), namespace)
    return cls if context is None else context(cls)


@frozen
class Outcome:
    """One run of an agent: its answer (or the error), and its compaction events."""

    answer: str
    compactions: tuple[CompactionFinished, ...]
    error: str | None = None


def describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:180]}"


async def run_streamed(agent: Agent, text: str, session_id: str) -> Outcome:
    """Run ``agent`` on ``text`` in the session, keeping its compaction events."""
    compactions: list[CompactionFinished] = []
    try:
        async with agent.stream(text, session_id=session_id) as events:
            async for event in events:
                if isinstance(event, CompactionFinished):
                    compactions.append(event)
        return Outcome(events.result.output, tuple(compactions))
    except Exception as error:
        return Outcome("", tuple(compactions), describe(error))


def turn_mark(outcome: Outcome) -> str:
    """One character for a replayed turn: ``.`` nothing, ``s`` a summary, ``c`` a
    compaction without a model, ``!`` a failed compaction, ``x`` a failed turn."""
    if outcome.error is not None:
        return "x"
    if any(event.outcome != "completed" for event in outcome.compactions):
        return "!"
    if any(event.summary_outcome is not None for event in outcome.compactions):
        return "s"
    return "c" if outcome.compactions else "."


def is_correct(answer: str, fact: Fact) -> bool:
    """An accepted spelling stands in the answer as a whole word or number, as
    ``littleghost.testing.Fact`` judges (``45 seconds`` is not in ``145 seconds``)."""
    return JudgedFact(fact.question, fact.expected).found_in(answer)


def is_stale(answer: str, fact: Fact) -> bool:
    """The answer gives a value ``fact`` superseded, and not its current one."""
    if not fact.superseded or is_correct(answer, fact):
        return False
    return JudgedFact(fact.question, fact.superseded).found_in(answer)


@frozen
class Probe:
    """A probe question's answer, and what the model saw (the request that asked, the
    question left out, as chat-completions JSON)."""

    fact: Fact
    outcome: Outcome
    seen: str

    @property
    def correct(self) -> bool:
        return is_correct(self.outcome.answer, self.fact)

    @property
    def stale(self) -> bool:
        return is_stale(self.outcome.answer, self.fact)

    @property
    def in_view(self) -> bool:
        """The fact's value was in what the model saw."""
        return is_correct(self.seen, self.fact)


@frozen
class ConversationRun:
    """What one condition did with one conversation."""

    conversation: str
    marks: str
    probes: tuple[Probe, ...]
    replay_summaries: tuple[int, int]
    """Summary calls and their output tokens during the replay."""
    probe_summaries: tuple[int, int]
    notes: tuple[str, ...]
    final_summary: str | None
    seconds: float
    generations: tuple[tuple[int, str], ...] = ()
    """Each new summary of the replay: the turn (from 1) that made it, and its text."""

    @property
    def score(self) -> int:
        return sum(probe.correct for probe in self.probes)

    @property
    def stale(self) -> int:
        return sum(probe.stale for probe in self.probes)


def compaction_kind(event: CompactionFinished) -> str:
    if event.outcome != "completed":
        return f"{event.reason} {event.outcome} ({event.error_type})"
    how = f"summary {event.summary_outcome}" if event.summary_outcome else "no model"
    return f"{event.reason} {how}"


def compaction_counts(events: Sequence[CompactionFinished], what: str) -> list[str]:
    """One line counting ``events`` by reason, outcome and how."""
    counts = Counter(compaction_kind(event) for event in events)
    if not counts:
        return []
    return [
        f"{what} compactions: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    ]


def last_summary(log: Sequence[Message]) -> str | None:
    found = [message for message in log if message.is_summary]
    return summary_text(found[-1]) if found else None


def failures(outcomes: Sequence[Outcome], what: str) -> list[str]:
    return [
        f"{what} {number}: {outcome.error}"
        for number, outcome in enumerate(outcomes, 1)
        if outcome.error is not None
    ]


async def replay_littleghost(
    conversation: Conversation, agent: Agent, replay: ReplayModel, store: InMemorySessionStore
) -> tuple[list[Outcome], list[tuple[int, str]]]:
    """Replay the turns; the outcomes, and each new summary with the turn that made it."""
    outcomes, generations = [], []
    for number, turn in enumerate(conversation.turns):
        replay.play(turn_responses(turn, number))
        outcomes.append(await run_streamed(agent, turn.user, REPLAY_SESSION))
        summary = last_summary(await store.load(REPLAY_SESSION))
        if summary is not None and (not generations or generations[-1][1] != summary):
            generations.append((number + 1, summary))
    return outcomes, generations


async def probe_littleghost(
    cls: type[Agent],
    store: InMemorySessionStore,
    log: Sequence[Message],
    conversation: Conversation,
    real: LedgerModel,
) -> list[Probe]:
    """Ask each probe question in a branch of the final log, with the real model."""
    tools = tools_for(conversation, ToolResults({}, UNAVAILABLE))
    probes = []
    for fact in conversation.facts:
        session = f"probe-{uuid.uuid4().hex}"
        await store.append(session, log)
        agent = cls(model=real, tools=tools)
        real.chats.clear()
        outcome = await run_streamed(agent, fact.question, session)
        seen = openai_messages(real.chats[0].messages[:-1]) if real.chats else []
        probes.append(Probe(fact, outcome, shown(seen)))
    return probes


def shown(messages: Sequence[dict[str, Any]]) -> str:
    """What the model saw: ``messages`` (chat-completions messages, the question left
    out) as JSON."""
    return json.dumps(messages, ensure_ascii=False)


async def run_littleghost(
    condition: Condition, conversation: Conversation, servers: Servers, sizing: Sizing
) -> ConversationRun:
    started = time.monotonic()
    real = servers.for_window(condition.window)
    store = InMemorySessionStore()
    context = condition.context(sizing) if condition.context is not None else None
    cls = agent_class(conversation, store, context)
    replay = ReplayModel(real, SummaryLedger(), servers.counter)
    outcomes, generations = await replay_littleghost(conversation, cls(model=replay), replay, store)
    log = await store.load(REPLAY_SESSION)
    prober = LedgerModel(real, SummaryLedger())
    probes = await probe_littleghost(cls, store, log, conversation, prober)
    replay_events = [event for outcome in outcomes for event in outcome.compactions]
    probe_events = [event for probe in probes for event in probe.outcome.compactions]
    return ConversationRun(
        conversation=conversation.name,
        marks="".join(turn_mark(outcome) for outcome in outcomes),
        probes=tuple(probes),
        replay_summaries=(replay.ledger.calls, replay.ledger.tokens),
        probe_summaries=(prober.ledger.calls, prober.ledger.tokens),
        notes=(
            *failures(outcomes, "turn"),
            *compaction_counts(replay_events, "replay"),
            *compaction_counts(probe_events, "probe"),
            *failures([probe.outcome for probe in probes], "probe"),
        ),
        final_summary=last_summary(log),
        seconds=time.monotonic() - started,
        generations=tuple(generations),
    )


# --- langchain -------------------------------------------------------------------------


class ReplayChatModel(BaseChatModel):
    """A langchain chat model that plays the script, reporting the server's token
    counts as ``ChatOpenAI`` would; a request over the window goes to ``server``, which
    rejects it."""

    replies: list[AIMessage] = Field(default_factory=list)
    counter: Any
    server: Any
    window: int

    @property
    def _llm_type(self) -> str:
        return "replay"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        kwargs.pop("tool_choice", None)
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("the replay runs asynchronously")

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        tools = kwargs.get("tools", [])
        prompt = await self.counter.prompt(convert_to_openai_messages(messages), tools)
        if prompt > self.window:
            await self.server.ainvoke(messages, tools=tools)
        reply = self.replies.pop(0)
        text = reply.text or json.dumps(reply.tool_calls)
        output = await self.counter.text(text)
        usage = {"input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output}
        finish = "tool_calls" if reply.tool_calls else "stop"
        message = reply.model_copy(
            update={
                "usage_metadata": usage,
                "response_metadata": {"model_provider": "openai", "finish_reason": finish},
            }
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def langchain_replies(turn: Turn, number: int) -> list[AIMessage]:
    calls = [
        AIMessage(
            content="",
            tool_calls=[
                {"name": step.name, "args": dict(step.arguments), "id": f"call_{number}_{index}"}
            ],
        )
        for index, step in enumerate(turn.tool_steps)
    ]
    return [*calls, AIMessage(content=turn.answer)]


@frozen
class Tally:
    """Summary calls, their output tokens, the failed ones and those cut at the window."""

    calls: int = 0
    tokens: int = 0
    errors: int = 0
    cut: int = 0

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.calls - other.calls,
            self.tokens - other.tokens,
            self.errors - other.errors,
            self.cut - other.cut,
        )

    def note(self, what: str) -> list[str]:
        if not self.calls:
            return []
        return [
            f"{what} summary calls: {self.calls}, {self.errors} failed, {self.cut} stopped "
            "at their output cap (finish_reason length)"
        ]


class ChatRequests(BaseCallbackHandler):
    """Keeps the messages of each chat request."""

    run_inline = True

    def __init__(self) -> None:
        self.requests: list[list[BaseMessage]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self.requests.append(messages[0])


class SummaryCalls(BaseCallbackHandler):
    """Keeps the tally of the summarizer's calls."""

    run_inline = True

    def __init__(self) -> None:
        self.tally = Tally()

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        message = getattr(response.generations[0][0], "message", None)
        usage = getattr(message, "usage_metadata", None) or {}
        metadata = getattr(message, "response_metadata", None) or {}
        cut = metadata.get("finish_reason") == "length"
        self.tally = attrs.evolve(
            self.tally,
            calls=self.tally.calls + 1,
            tokens=self.tally.tokens + usage.get("output_tokens", 0),
            cut=self.tally.cut + cut,
        )

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        self.tally = attrs.evolve(
            self.tally, calls=self.tally.calls + 1, errors=self.tally.errors + 1
        )


def chat_model(url: str, key: str, max_tokens: int, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="qwen2.5-0.5b-instruct",
        base_url=url,
        api_key=key,
        temperature=0,
        seed=SEED,
        max_tokens=max_tokens,
        **options,
    )


def summarization(summarizer: ChatOpenAI) -> SummarizationMiddleware[Any, Any, Any]:
    return SummarizationMiddleware(
        model=summarizer, trigger=("fraction", THRESHOLD), keep=("fraction", LANGCHAIN_KEEP)
    )


def langchain_mark(turn: Tally, failed: bool) -> str:
    if failed:
        return "x"
    if turn.errors:
        return "!"
    return "s" if turn.calls else "."


def langchain_summary(log: Sequence[BaseMessage]) -> str | None:
    """The text of the summary message the middleware left in the state, if any."""
    found = [m for m in log if m.additional_kwargs.get("lc_source") == "summarization"]
    return found[-1].text.removeprefix(LANGCHAIN_SUMMARY_PREFIX) if found else None


async def run_langchain(
    condition: Condition, conversation: Conversation, servers: Servers, sizing: Sizing
) -> ConversationRun:
    started = time.monotonic()
    windowed = servers.for_window(condition.window)
    url, key = servers.url(windowed), servers.key(windowed)
    summary_calls = SummaryCalls()
    profile = {"max_input_tokens": WINDOW}
    summarizer = chat_model(url, key, SUMMARY_CAP, profile=profile, callbacks=[summary_calls])
    chat = chat_model(url, key, MAX_TOKENS, profile=profile)
    replay = ReplayChatModel(counter=servers.counter, server=chat, window=WINDOW)
    agent = create_agent(
        replay,
        tools=tools_for(conversation, scripted_results(conversation)) or None,
        system_prompt=conversation.instructions,
        middleware=[summarization(summarizer)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": REPLAY_SESSION}}
    marks, notes, generations = [], [], []
    for number, turn in enumerate(conversation.turns):
        replay.replies[:] = langchain_replies(turn, number)
        before = summary_calls.tally
        failed = False
        try:
            await agent.ainvoke({"messages": [HumanMessage(turn.user)]}, config)
        except Exception as error:
            failed = True
            notes.append(f"turn {number + 1}: {describe(error)}")
        marks.append(langchain_mark(summary_calls.tally - before, failed))
        state = await agent.aget_state(config)
        summary = langchain_summary(list(state.values.get("messages", [])))
        if summary is not None and (not generations or generations[-1][1] != summary):
            generations.append((number + 1, summary))
    state = await agent.aget_state(config)
    log = list(state.values["messages"])
    replayed = summary_calls.tally
    requests = ChatRequests()
    prober = chat_model(url, key, MAX_TOKENS, profile=profile, callbacks=[requests])
    probes = await probe_langchain(conversation, prober, summarizer, log, requests)
    probed = summary_calls.tally - replayed
    return ConversationRun(
        conversation=conversation.name,
        marks="".join(marks),
        probes=tuple(probes),
        replay_summaries=(replayed.calls, replayed.tokens),
        probe_summaries=(probed.calls, probed.tokens),
        notes=(
            *notes,
            *replayed.note("replay"),
            *probed.note("probe"),
            *failures([probe.outcome for probe in probes], "probe"),
        ),
        final_summary=langchain_summary(log),
        seconds=time.monotonic() - started,
        generations=tuple(generations),
    )


async def probe_langchain(
    conversation: Conversation,
    chat: ChatOpenAI,
    summarizer: ChatOpenAI,
    log: list[BaseMessage],
    requests: ChatRequests,
) -> list[Probe]:
    """Ask each probe question after the final state, with the real model (``chat``,
    whose requests ``requests`` keeps)."""
    agent = create_agent(
        chat,
        tools=tools_for(conversation, ToolResults({}, UNAVAILABLE)) or None,
        system_prompt=conversation.instructions,
        middleware=[summarization(summarizer)],
    )
    probes = []
    for fact in conversation.facts:
        requests.requests.clear()
        try:
            state = await agent.ainvoke({"messages": [*log, HumanMessage(fact.question)]})
            outcome = Outcome(state["messages"][-1].text, ())
        except Exception as error:
            outcome = Outcome("", (), describe(error))
        seen = convert_to_openai_messages(requests.requests[0][:-1]) if requests.requests else []
        probes.append(Probe(fact, outcome, shown(seen)))
    return probes


# --- conditions ------------------------------------------------------------------------


Runner = Callable[["Condition", Conversation, Servers, Sizing], Awaitable[ConversationRun]]


@frozen
class Condition:
    """A way to run the conversations: its runner, window and context management."""

    name: str
    run: Runner
    window: int = WINDOW
    context: Callable[[Sizing], Decorate] | None = None


def bounded_budget() -> PromptBudget:
    return PromptBudget(
        prompt_budget_tokens=WINDOW - MAX_TOKENS - SAFETY_TOKENS,
        response_reserve_tokens=MAX_TOKENS,
        safety_reserve_tokens=SAFETY_TOKENS,
    )


def sliding_turns(sizing: Sizing) -> int:
    return sizing.turns_that_fit(int(SIZED_SHARE * WINDOW) - MAX_TOKENS)


CONDITIONS = (
    Condition("ceiling", run_littleghost, window=CEILING_WINDOW),
    Condition(
        "default",
        run_littleghost,
        context=lambda sizing: manage_context(context_window_override=WINDOW),
    ),
    Condition(
        "masking",
        run_littleghost,
        context=lambda sizing: manage_context(context_window_override=WINDOW, mask_tool_results=2),
    ),
    Condition(
        "sliding-window",
        run_littleghost,
        context=lambda sizing: manage_context(
            context_window_override=WINDOW,
            strategy=SlidingWindow(keep_last_turns=sliding_turns(sizing)),
        ),
    ),
    Condition(
        "bounded-view",
        run_littleghost,
        context=lambda sizing: manage_context(
            context_window_override=WINDOW, budget=bounded_budget(), summarize=False
        ),
    ),
    Condition("langchain", run_langchain),
)


# --- output ----------------------------------------------------------------------------


def score_cell(runs: Sequence[ConversationRun]) -> str:
    total = sum(len(run.probes) for run in runs)
    return f"{sum(run.score for run in runs)} / {total}"


def view_cell(runs: Sequence[ConversationRun]) -> str:
    total = sum(len(run.probes) for run in runs)
    return f"{sum(probe.in_view for run in runs for probe in run.probes)} / {total}"


def stale_cell(runs: Sequence[ConversationRun]) -> str:
    total = sum(1 for run in runs for probe in run.probes if probe.fact.superseded)
    return f"{sum(run.stale for run in runs)} / {total}" if total else "—"


def percent(runs: Sequence[ConversationRun], ceiling: Sequence[ConversationRun] | None) -> str:
    if not ceiling:
        return "—"
    reference = sum(run.score for run in ceiling)
    return f"{100 * sum(run.score for run in runs) / reference:.0f} %" if reference else "—"


def summary_cell(runs: Sequence[ConversationRun]) -> tuple[str, str]:
    replay = [run.replay_summaries for run in runs]
    probes = [run.probe_summaries for run in runs]
    calls = f"{sum(c for c, _ in replay)} + {sum(c for c, _ in probes)}"
    tokens = f"{sum(t for _, t in replay)} + {sum(t for _, t in probes)}"
    return calls, tokens


def print_table(
    results: dict[str, list[ConversationRun]], conversations: Sequence[Conversation]
) -> None:
    names = [conversation.name for conversation in conversations]
    print(
        "| condition | facts answered | % of ceiling | facts in view | stale answers | summary "
        "calls (replay + probes) | summary tokens (replay + probes) | seconds | "
        + " | ".join(names)
        + " |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names))
    ceiling = results.get("ceiling")
    for condition, runs in results.items():
        calls, tokens = summary_cell(runs)
        by_name = {run.conversation: run for run in runs}
        scores = [f"{by_name[name].score} / {len(by_name[name].probes)}" for name in names]
        seconds = sum(run.seconds for run in runs)
        print(
            f"| {condition} | {score_cell(runs)} | {percent(runs, ceiling)} | {view_cell(runs)} "
            f"| {stale_cell(runs)} | {calls} | {tokens} "
            f"| {seconds:.0f} | " + " | ".join(scores) + " |"
        )


def print_details(results: dict[str, list[ConversationRun]]) -> None:
    print("\nPer-turn compactions of the replay (. none, s summary, c without a model,")
    print("! failed compaction, x failed turn), notes, and every answer, judged:")
    for condition, runs in results.items():
        for run in runs:
            print(f"\n{condition} / {run.conversation}: {run.marks}")
            for note in run.notes:
                print(f"  note: {note}")
            for probe in run.probes:
                answer = " ".join(probe.outcome.answer.split())[:160] or "(no answer)"
                where = "in view" if probe.in_view else "not in view"
                judged = "answered" if probe.correct else "stale" if probe.stale else "missed"
                print(f"  {judged} {probe.fact.expected[0]!r} ({where}): {answer}")


def generation_marks(text: str, facts: Sequence[Fact]) -> str:
    """Per fact: ``B`` in a summary's notes and quotes, ``N`` in the notes only, ``Q`` in
    the quotes only, ``.`` in neither."""
    notes, _, quotes = text.partition(f"\n{QUOTES_HEADING}\n")
    marks = ""
    for fact in facts:
        noted, quoted = is_correct(notes, fact), is_correct(quotes, fact)
        marks += "B" if noted and quoted else "N" if noted else "Q" if quoted else "."
    return marks


def print_generations(
    results: dict[str, list[ConversationRun]], conversations: Sequence[Conversation]
) -> None:
    print("\nFacts in each new summary of the replay, per fact in the order of the probes")
    print("(B in the notes and the quotes, N in the notes only, Q in the quotes only, . in")
    print("neither), and how many of them it holds:")
    facts = {conversation.name: conversation.facts for conversation in conversations}
    for condition, runs in results.items():
        for run in runs:
            if not run.generations:
                continue
            print(f"\n{condition} / {run.conversation}:")
            for turn, text in run.generations:
                marks = generation_marks(text, facts[run.conversation])
                held = len(marks) - marks.count(".")
                print(f"  turn {turn:>2}: {marks} {held} / {len(marks)}")


def print_summaries(condition: str, runs: Sequence[ConversationRun]) -> None:
    print(f"\nFinal summaries of the {condition} condition:")
    for run in runs:
        print(f"\n--- {run.conversation} ---\n{run.final_summary or '(no summary)'}")


# --- main ------------------------------------------------------------------------------


def progress(condition: str, run: ConversationRun) -> None:
    print(
        f"{condition:>15} / {run.conversation:<9} {run.score}/{len(run.probes)} facts, "
        f"replay {run.marks}, {run.seconds:.0f} s",
        flush=True,
    )


async def run_all(
    conditions: Sequence[Condition], conversations: Sequence[Conversation]
) -> dict[str, list[ConversationRun]]:
    """Run each condition on each conversation, the conditions of one window on one
    server, one server at a time (the machine may be shared)."""
    path = model_path()
    results: dict[str, list[ConversationRun]] = {c.name: [] for c in conditions}
    sizings: dict[str, Sizing] = {}
    for window in dict.fromkeys(condition.window for condition in conditions):
        server = LocalModel(path, n_ctx=window, threads=1)
        try:
            await server.prepare()
            base = server.base_url
            assert base is not None
            async with httpx.AsyncClient(
                base_url=base.removesuffix("/v1"),
                headers={"Authorization": f"Bearer {server.api_key}"},
                trust_env=False,
            ) as http:
                servers = Servers(server, window, TokenCounter(http))
                if not sizings:
                    sizings = {c.name: await measure(c, servers.counter) for c in conversations}
                    print_sizes(conversations, sizings)
                for condition in conditions:
                    if condition.window != window:
                        continue
                    for conversation in conversations:
                        run = await condition.run(
                            condition, conversation, servers, sizings[conversation.name]
                        )
                        progress(condition.name, run)
                        results[condition.name].append(run)
        finally:
            await server.aclose()
    return results


def print_sizes(conversations: Sequence[Conversation], sizings: dict[str, Sizing]) -> None:
    for conversation in conversations:
        sizing = sizings[conversation.name]
        print(
            f"{conversation.name}: {len(conversation.turns)} turns, "
            f"{sizing.total_tokens} tokens (instructions and tools "
            f"{sizing.fixed_tokens}); sliding window keeps {sliding_turns(sizing)} turns"
        )


def selected(names: str | None, available: Sequence[Any]) -> list[Any]:
    if names is None:
        return list(available)
    wanted = [name.strip() for name in names.split(",")]
    known = {item.name: item for item in available}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}; choose from {', '.join(known)}")
    return [known[name] for name in wanted]


def run_json(run: ConversationRun) -> dict[str, Any]:
    """``run`` as JSON, its probes' facts left out (the conversation has them)."""
    data = attrs.asdict(run, recurse=False)
    data["probes"] = [(p.outcome.answer, p.outcome.error, p.seen) for p in run.probes]
    return data


def run_from_json(data: dict[str, Any], conversation: Conversation) -> ConversationRun:
    probes = tuple(
        Probe(fact, Outcome(answer, (), error), seen)
        for fact, (answer, error, seen) in zip(conversation.facts, data["probes"], strict=True)
    )
    return ConversationRun(
        **{
            **data,
            "probes": probes,
            "replay_summaries": tuple(data["replay_summaries"]),
            "probe_summaries": tuple(data["probe_summaries"]),
            "notes": tuple(data["notes"]),
            "generations": tuple(map(tuple, data["generations"])),
        }
    )


def run_base(checkout: Path, conversations: Sequence[Conversation]) -> list[ConversationRun]:
    """The default condition with ``checkout``'s littleghost, in a process of its own (its
    own servers: the same binary, model and settings), judged here."""
    out = Path(f"/tmp/retention-base-{uuid.uuid4().hex}.json")
    names = ",".join(conversation.name for conversation in conversations)
    command = [sys.executable, __file__, "--worker", str(out), "--conversations", names]
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    try:
        subprocess.run([*command, "--conditions", "default"], env=env, check=True)
        data = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    import littleghost

    if Path(data["littleghost"]).resolve() == Path(littleghost.__file__).resolve():
        raise SystemExit(f"--base {checkout}: the worker imported this checkout's littleghost")
    print(f"{BASE}: littleghost from {data['littleghost']}")
    return [
        run_from_json(run, conversation)
        for run, conversation in zip(data["runs"], conversations, strict=True)
    ]


def with_base(
    results: dict[str, list[ConversationRun]], base: list[ConversationRun]
) -> dict[str, list[ConversationRun]]:
    """``results`` with the base's runs just before the default condition's."""
    merged: dict[str, list[ConversationRun]] = {}
    for name, runs in results.items():
        if name == "default":
            merged[BASE] = base
        merged[name] = runs
    merged.setdefault(BASE, base)
    return merged


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--conversations",
        help="comma-separated: " + ",".join(c.name for c in ALL_CONVERSATIONS),
    )
    parser.add_argument(
        "--conditions",
        help="comma-separated: ceiling,default,masking,sliding-window,bounded-view,langchain",
    )
    parser.add_argument("--quick", action="store_true", help="one conversation (support)")
    parser.add_argument(
        "--base", type=Path, help="another checkout: its default condition too, side by side"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    arguments = parse_arguments()
    os.environ.setdefault(SERVER_ENV, str(SERVER))
    conversations = selected(arguments.conversations, ALL_CONVERSATIONS)[
        : 1 if arguments.quick else None
    ]
    conditions = selected(arguments.conditions, CONDITIONS)
    if arguments.worker is not None:
        import littleghost

        (runs,) = anyio.run(run_all, conditions, conversations).values()
        data = {"littleghost": littleghost.__file__, "runs": [run_json(run) for run in runs]}
        arguments.worker.write_text(json.dumps(data, ensure_ascii=False))
        return
    started = time.monotonic()
    base = run_base(arguments.base, conversations) if arguments.base else None
    results = anyio.run(run_all, conditions, conversations)
    if base is not None:
        results = with_base(results, base)
    print()
    print_table(results, conversations)
    print_details(results)
    print_generations(results, conversations)
    for condition in (BASE, "default", "langchain"):
        if condition in results:
            print_summaries(condition, results[condition])
    print(f"\nTotal: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
