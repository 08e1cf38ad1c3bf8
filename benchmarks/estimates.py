"""Token estimates against the local model's reported input tokens.

Starts ``LocalModel(n_ctx=4096)`` (SmolLM2-135M-Instruct by default), sends a set of
varied requests with ``max_tokens=1`` — short chat turns, long prose, JSON, code, Polish
and Japanese text, tool-call exchanges with tool schemas — and prints per request the
provider's ``usage.input_tokens`` beside ``estimate_request(...)`` with ``ByteEstimator()``
and with ``CharacterEstimator()``, and each ratio estimate ÷ reported (above 1 is the safe
side). A summary gives the mean, min and max ratio per estimator and the per-message
overhead that would make each unbiased (mean ratio 1) and that would make each safe on
every request (no ratio below 1). Images are not measured: SmolLM2 reads no images.

Run ``python benchmarks/estimates.py``, or ``python benchmarks/estimates.py MODEL.gguf``
for another model (the Qwen2.5 of ``../shared/bin/benchmark-model.sh``, whose tokenizer
knows CJK well); set ``LITTLEGHOST_LLAMA_SERVER`` to use another llama.cpp
``llama-server`` build. If the server cannot start (for instance SIGILL on a
CPU the build does not support), the script says so and exits 1: nothing was measured.
"""

from __future__ import annotations

import json
import statistics
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from littleghost import Message, ToolCall
from littleghost.context.tokens import (
    ByteEstimator,
    CharacterEstimator,
    Tokenizer,
    estimate_request,
)
from littleghost.errors import ConfigurationError, ProviderError
from littleghost.models.base import ModelRequest, ToolSpec
from littleghost.models.local import LocalModel

SETTINGS = {"max_tokens": 1}
SYSTEM = Message.system("You are a concise assistant. Answer in one sentence.")

PROSE = (
    "The river had been rising for three days before anyone in the valley took it "
    "seriously. At first it was a matter for the ferryman, who complained that the "
    "current pulled his boat a little further downstream on every crossing, and for the "
    "children, who found that the flat stones they used for skipping had disappeared "
    "under brown water. By the second evening the lower meadow was a shallow lake, and "
    "the miller walked the length of the embankment with a lantern, tapping the earth "
    "with his stick as if he could hear where it would give way. "
) * 5

JSON_PAYLOAD = (
    '{"orders":[{"id":10231,"customer":{"name":"Ada Lovelace","email":"ada@example.com"},'
    '"items":[{"sku":"A-113","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5.5}],'
    '"shipped":false,"tags":["priority","gift"]},{"id":10232,"customer":{"name":"Alan '
    'Turing","email":"alan@example.org"},"items":[{"sku":"C-42","qty":10,"price":0.99}],'
    '"shipped":true,"tags":[]}],"page":{"next":"cursor_8f3a2b","size":2}}'
)

CODE = '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class LRU:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: dict[str, int] = {}

    def get(self, key: str) -> int | None:
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value
'''

POLISH = (
    "Wczoraj wieczorem poszliśmy z przyjaciółmi na długi spacer wzdłuż Wisły. Pogoda była "
    "zaskakująco łagodna jak na październik, a nad rzeką unosiła się lekka mgła. Rozmawialiśmy "
    "o książkach, o pracy i o tym, że żadne z nas nie potrafi już odpocząć bez zaglądania do "
    "telefonu. Czy możesz mi polecić trzy sposoby na spokojniejszy wieczór?"
)

JAPANESE = (
    "昨日の夜、友人たちと川沿いを長い時間散歩しました。十月にしては驚くほど穏やかな天気で、"
    "川の上には薄い霧が漂っていました。本や仕事の話をしたり、誰も携帯電話を見ずに休むことが"
    "できなくなったという話をしたりしました。落ち着いた夜を過ごすための方法を三つ教えてください。"
)

WEATHER = ToolSpec(
    "get_weather",
    "The current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city name."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
SEARCH = ToolSpec(
    "search_orders",
    "Search the order database by customer email and date range.",
    {
        "type": "object",
        "properties": {
            "email": {"type": "string"},
            "since": {"type": "string", "format": "date"},
            "until": {"type": "string", "format": "date"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "required": ["email"],
    },
)


def _turns(count: int) -> list[Message]:
    messages = [SYSTEM]
    for turn in range(count):
        messages.append(Message.user(f"Question {turn}: what is {turn} plus {turn}?"))
        messages.append(Message.assistant(f"{turn} plus {turn} is {2 * turn}."))
    messages.append(Message.user("And what is 7 times 6?"))
    return messages


def requests() -> list[tuple[str, ModelRequest]]:
    """The requests to measure, each with a short name."""
    weather_call = ToolCall("call_1", "get_weather", {"city": "Kraków", "unit": "celsius"})
    order_call = ToolCall("call_2", "search_orders", {"email": "ada@example.com", "limit": 5})
    cases: list[tuple[str, list[Message], tuple[ToolSpec, ...]]] = [
        ("short chat", [SYSTEM, Message.user("Hi! How are you today?")], ()),
        ("no system message", [Message.user("Hi! How are you today?")], ()),
        (
            "3 short turns",
            [
                SYSTEM,
                Message.user("Name a colour."),
                Message.assistant("Blue."),
                Message.user("Another one?"),
                Message.assistant("Green."),
                Message.user("And a third?"),
            ],
            (),
        ),
        ("20 short turns", _turns(20), ()),
        ("long prose", [SYSTEM, Message.user("Summarise this story:\n\n" + PROSE)], ()),
        ("JSON", [SYSTEM, Message.user("Which orders shipped?\n" + JSON_PAYLOAD)], ()),
        (
            "Python code",
            [SYSTEM, Message.user("Review this code:\n```python\n" + CODE + "```")],
            (),
        ),
        ("Polish", [SYSTEM, Message.user(POLISH)], ()),
        ("Japanese", [SYSTEM, Message.user(JAPANESE)], ()),
        (
            "tool schemas only",
            [SYSTEM, Message.user("What is the weather in Kraków?")],
            (WEATHER, SEARCH),
        ),
        (
            "tool exchange",
            [
                SYSTEM,
                Message.user("What is the weather in Kraków?"),
                Message.assistant(tool_calls=[weather_call]),
                Message.tool("call_1", '{"temperature": 11, "sky": "overcast", "wind_kmh": 14}'),
            ],
            (WEATHER,),
        ),
        (
            "tool exchange, JSON result",
            [
                SYSTEM,
                Message.user("Find Ada's last orders and tell me the weather in Kraków."),
                Message.assistant("Let me look both up.", tool_calls=[order_call, weather_call]),
                Message.tool("call_2", JSON_PAYLOAD),
                Message.tool("call_1", '{"temperature": 11, "sky": "overcast"}'),
                Message.assistant("Ada has two orders; one shipped. It is 11 °C and overcast."),
                Message.user("Thanks. Which one has not shipped?"),
            ],
            (WEATHER, SEARCH),
        ),
    ]
    return [
        (name, ModelRequest(messages, tools=tools, settings=SETTINGS))
        for name, messages, tools in cases
    ]


ESTIMATORS: dict[str, Tokenizer] = {
    "ByteEstimator": ByteEstimator(),
    "CharacterEstimator": CharacterEstimator(),
}


def _estimate(request: ModelRequest, tokenizer: Tokenizer) -> int:
    return estimate_request(request.messages, request.tools, request.settings, tokenizer)


def _overhead(tokenizer: Tokenizer) -> int:
    return int(getattr(tokenizer, "message_overhead", 0))


Row = tuple[str, ModelRequest, int]


def _unbiased_overhead(rows: list[Row], tokenizer: Tokenizer) -> float:
    """The per-message overhead that makes the mean ratio estimate ÷ reported exactly 1."""
    base = _overhead(tokenizer)
    content = sum(
        (_estimate(request, tokenizer) - base * len(request.messages)) / reported
        for _, request, reported in rows
    )
    per_message = sum(len(request.messages) / reported for _, request, reported in rows)
    return (len(rows) - content) / per_message


def _safe_overhead(rows: list[Row], tokenizer: Tokenizer) -> float:
    """The smallest per-message overhead with which no request is under-estimated."""
    base = _overhead(tokenizer)
    return max(
        (reported - (_estimate(request, tokenizer) - base * len(request.messages)))
        / len(request.messages)
        for _, request, reported in rows
    )


def report(rows: list[Row], write: Callable[[str], None] = print) -> None:
    """Print the table and the summary for measured ``rows``."""
    header = f"{'request':<27} {'msgs':>4} {'bytes':>6} {'B/tok':>5} {'reported':>8}"
    for name in ESTIMATORS:
        short = name.removesuffix("Estimator")
        header += f" {short:>9} {'ratio':>6}"
    write(header)
    write("-" * len(header))
    for name, request, reported in rows:
        size = sum(len(message.text.encode()) for message in request.messages)
        line = (
            f"{name:<27} {len(request.messages):>4} {size:>6} {size / reported:>5.2f} {reported:>8}"
        )
        for tokenizer in ESTIMATORS.values():
            estimate = _estimate(request, tokenizer)
            line += f" {estimate:>9} {estimate / reported:>6.2f}"
        write(line)
    for title, subset in (
        ("all requests", rows),
        ("requests without tools", [row for row in rows if not row[1].tools]),
    ):
        if not subset:
            continue
        write("")
        write(
            f"{title + ':':<27} {'mean':>5} {'min':>5} {'max':>5} {'overhead':>8} "
            f"{'unbiased':>8} {'safe':>6}"
        )
        for name, tokenizer in ESTIMATORS.items():
            ratios = [_estimate(request, tokenizer) / reported for _, request, reported in subset]
            write(
                f"  {name:<25} {statistics.fmean(ratios):>5.2f} {min(ratios):>5.2f} "
                f"{max(ratios):>5.2f} {_overhead(tokenizer):>8} "
                f"{_unbiased_overhead(subset, tokenizer):>8.1f} "
                f"{_safe_overhead(subset, tokenizer):>6.1f}"
            )
    write("")
    write("bytes: UTF-8 bytes of the message text (tool calls and results not included);")
    write("B/tok: bytes ÷ reported; ratio: estimate ÷ reported (below 1: under-estimated).")
    write("overhead: tokens per message now; unbiased: the per-message overhead giving a mean")
    write("ratio of 1; safe: the smallest giving no ratio below 1 (negative: none needed).")


def _template_capabilities(base_url: str, key: str | None) -> dict[str, Any]:
    """What llama.cpp says the model's chat template renders (``/props``)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    asked = urllib.request.Request(base_url.removesuffix("/v1") + "/props")
    if key is not None:
        asked.add_header("Authorization", f"Bearer {key}")
    try:
        with opener.open(asked, timeout=5) as answer:
            capabilities: dict[str, Any] = json.load(answer).get("chat_template_caps") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return capabilities


async def main() -> int:
    """Measure every request against the local server; 1 when it cannot start (nothing
    was measured)."""
    try:
        model = LocalModel(*sys.argv[1:2], n_ctx=4096)
    except ConfigurationError as error:
        print(f"cannot run the local model: {error}")
        return 1
    try:
        try:
            await model.prepare()
        except ProviderError as error:
            print(f"the llama.cpp server could not start; nothing measured. {error}")
            return 1
        print(f"model {model.name}, n_ctx {model.context_window}, server pid {model.pid}")
        assert model.base_url is not None
        capabilities = await anyio.to_thread.run_sync(
            _template_capabilities, model.base_url, model.api_key
        )
        if capabilities.get("supports_tools") is False:
            print(
                "its chat template renders no tool schemas and no tool calls "
                "(llama.cpp: supports_tools=False): tool rows over-estimate by design"
            )
        print()
        rows: list[Row] = []
        for name, request in requests():
            try:
                response = await model.respond(request)
            except ProviderError as error:
                print(f"{name}: the server rejected the request: {error}")
                continue
            rows.append((name, request, response.usage.input_tokens))
        if rows:
            report(rows)
        return 0
    finally:
        await model.aclose()


if __name__ == "__main__":
    sys.exit(anyio.run(main))
