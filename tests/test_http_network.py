"""The providers as an enterprise network serves them: the real SDK clients at a base
URL with a path and a query (Azure's ``?api-version=``, a gateway's), on 127.0.0.1,
under asyncio and trio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl

import pytest

from littleghost import Agent
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from tests.raw_http import Behaviour, RawServer
from tests.sdk_bodies import completion_body, message_body

pytestmark = pytest.mark.anyio

PROVIDERS = ("openai", "anthropic")
KEY = "sk-network-key-0123456789"
WINDOW = 200_000
Models = Callable[..., OpenAIModel | AnthropicModel]


class Plain(Agent):
    instructions = "Answer briefly."


@pytest.fixture
async def model_of() -> AsyncIterator[Models]:
    """Makes a provider's model of a base URL (the ``/v1`` OpenAI's takes added before
    any query), closed after the test; with its window given, it asks the server for
    none, so the server sees the calls alone."""
    made: list[OpenAIModel | AnthropicModel] = []

    def make(provider: str, url: str, suffix: str = "") -> OpenAIModel | AnthropicModel:
        if provider == "openai":
            path, _, query = suffix.partition("?")
            url = f"{url}{path or '/v1'}{'?' if query else ''}{query}"
            made.append(
                OpenAIModel("gpt-4o-mini", base_url=url, api_key=KEY, context_window=WINDOW)
            )
        else:
            url += suffix
            made.append(
                AnthropicModel("claude-sonnet-5", base_url=url, api_key=KEY, context_window=WINDOW)
            )
        return made[-1]

    yield make
    for model in made:
        await model.aclose()


def answered_whole(provider: str) -> Behaviour:
    if provider == "openai":
        body: Any = completion_body({"content": "fine"})
    else:
        body = message_body([{"type": "text", "text": "fine"}])
    return lambda connection: connection.answer(200, body)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    "suffix",
    [
        "/openai/deployments/support?api-version=2024-10-21",
        "/v1/proxy/gateway?tenant=t%201&empty=",
        "/v1/proxy/gateway",
    ],
)
async def test_a_base_url_keeps_its_path_and_query_on_every_request(
    servers: Callable[..., RawServer], model_of: Models, provider: str, suffix: str
) -> None:
    """The endpoint's path goes after the base URL's path, and its query after that, as
    a gateway or Azure's ``?api-version=`` expects: not inside the query."""
    server = servers(answered_whole(provider))
    async with Plain(model=model_of(provider, server.url, suffix)) as agent:
        assert (await agent.run("hello")).output == "fine"
    path, _, query = suffix.partition("?")
    endpoint = "/chat/completions" if provider == "openai" else "/v1/messages"
    [sent] = server.requests
    sent_path, _, sent_query = sent.path.partition("?")
    assert sent_path == path + endpoint
    assert parse_qsl(sent_query, keep_blank_values=True) == parse_qsl(query, True)
