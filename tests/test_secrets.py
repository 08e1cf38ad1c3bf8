"""No credential surfaces anywhere: a canary scan over every way one is given.

Each credential a deployment hands littleghost carries a canary of its own: API keys
(``api_key=``, ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``), keys in a ``base_url``'s query
(``?key=``, ``?api-key=``, as Gemini- and Azure-style gateways take them), a user and
password in a ``base_url``, an SDK client's own credential headers (``Authorization``,
``x-api-key``, ``api-key``) and its HTTP client's Basic auth, PostgreSQL passwords in a
URL or a conninfo. Runs are driven against a real server on 127.0.0.1 that fails each
way a deployment meets (401, 404, an overflow, a gateway's page, an error event in a
stream, silence until the timeout, a port nothing listens on) and quotes back
everything it was sent, as hostile or careless servers do; stores fail to connect; the
command line gets those URLs, right and wrong. Nothing that can be shown
may hold a canary: log records of every logger at DEBUG (littleghost's, the SDKs', the
HTTP client's), spans and metrics, standard output and error, the command line's
output, and ``repr()``, ``str()`` and the whole traceback (its causes and contexts
included) of every error and of the models, agents and stores.
"""

from __future__ import annotations

import base64
import json
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest
from click.testing import CliRunner

from littleghost import Agent
from littleghost.cli import main
from littleghost.errors import ConfigurationError
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.sessions import PostgresSessionStore
from tests.raw_http import Connection, RawServer, refused_url

if TYPE_CHECKING:
    from conftest import Histograms, Spans

pytestmark = pytest.mark.anyio

API_KEY = "sk-canary-apikey-41a9"
ENV_KEY = "sk-canary-envkey-52b8"
QUERY_KEY = "canary-query-63c7"
URL_PASSWORD = "canary-urlpw-74d6"
HEADER_KEY = "canary-header-85e5"
BEARER = "canary-bearer-96f4"
PG_PASSWORD = "canary-pgpw-a7b3"
URL_USER = "gateway-user"
BASIC_AUTH = base64.b64encode(f"{URL_USER}:{URL_PASSWORD}".encode()).decode()
"""What the HTTP client sends of a ``base_url``'s user and password: as good as them."""
CANARIES = (API_KEY, ENV_KEY, QUERY_KEY, URL_PASSWORD, BASIC_AUTH, HEADER_KEY, BEARER, PG_PASSWORD)

_LOGGERS = ("littleghost", "openai", "anthropic", "httpx", "httpx2", "httpcore", "psycopg")


class _Everything(logging.Handler):
    """Every record at any level, formatted with its traceback, its arguments and every
    attribute it was given (as a JSON formatter would ship it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(f"{self.format(record)} {vars(record)!r}")


@pytest.fixture
def logged() -> Iterator[list[str]]:
    handler = _Everything()
    loggers = [logging.getLogger(), *map(logging.getLogger, _LOGGERS)]
    levels = [logger.level for logger in loggers]
    loggers[0].addHandler(handler)
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    try:
        yield handler.texts
    finally:
        loggers[0].removeHandler(handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def shown(value: object) -> list[str]:
    """What can be shown of ``value``: its ``repr()`` and ``str()``, and for an exception
    its whole traceback and each exception of its chain, suppressed ones too."""
    texts = [repr(value), str(value)]
    if isinstance(value, BaseException):
        texts.append("".join(traceback.format_exception(value)))
        seen: set[int] = set()
        pending: list[BaseException | None] = [value]
        while pending:
            error = pending.pop()
            if error is None or id(error) in seen:
                continue
            seen.add(id(error))
            texts += [repr(error), str(error), *map(str, getattr(error, "__notes__", ()))]
            pending += [error.__cause__, error.__context__]
    return texts


def leaked(texts: list[str]) -> list[str]:
    """Each canary some text holds, with what surrounds it."""
    found = []
    for text in texts:
        for canary in CANARIES:
            at = text.find(canary)
            if at >= 0:
                found.append(f"{canary}: ...{text[max(0, at - 120) : at + 30]}...")
    return found


class Echo:
    """A server whose every answer quotes back what it was sent; ``behave`` says how it
    fails: ``401``, ``404``, ``overflow``, ``page`` (a gateway's HTML 502), ``stream`` (an
    error event after some text), ``silent``."""

    def __init__(self, behave: str) -> None:
        self.behave = behave
        self.server = RawServer(self._answer)

    def _answer(self, connection: Connection) -> None:
        request = self.server.requests[-1]
        credentials = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
        first = sorted(request.headers, key=lambda name: name not in credentials)
        headers = {name: request.headers[name] for name in first}  # before a cut
        said = f"{request.method} {request.path} {json.dumps(headers)}"
        if self.behave == "silent":
            connection.stall()
        elif self.behave == "stream":  # an error event after some text
            error = {"type": "api_error", "message": f"failed ({said})"}
            if request.path.split("?")[0].endswith("/messages"):
                start = {"type": "message_start", "message": {"id": "m", "content": []}}
                events = [
                    f"event: message_start\ndata: {json.dumps(start)}\n\n",
                    f"event: error\ndata: {json.dumps({'type': 'error', 'error': error})}\n\n",
                ]
            else:
                text = {"choices": [{"index": 0, "delta": {"content": "Your order"}}]}
                events = [
                    f"data: {json.dumps(text)}\n\n",
                    f"data: {json.dumps({'error': error})}\n\n",
                ]
            connection.events(event.encode() for event in events)
        elif self.behave == "page":
            connection.answer(502, f"<html>bad gateway for {said}</html>")
        elif self.behave == "overflow":
            message = f"maximum context length is 10 tokens, you sent 99 ({said})"
            error = {"message": message, "type": "invalid_request_error"}
            connection.answer(400, {"error": {**error, "code": "context_length_exceeded"}})
        else:
            status = int(self.behave)
            error = {"message": f"Incorrect API key provided ({said})", "type": "invalid"}
            connection.answer(status, {"type": "error", "error": error})


TIMEOUT = 0.2
"""Each attempt's ``request_timeout``, for the silent server."""
FAILURES = ("401", "404", "overflow", "page", "stream", "silent", "refused")


class Support(Agent):
    model = "openai:gpt-4o-mini"
    instructions = "You help."
    max_retries = 0


def openai_keyed(url: str, monkeypatch: pytest.MonkeyPatch) -> OpenAIModel:
    query = f"/v1?api-version=2024-10-21&key={QUERY_KEY}&api-key={QUERY_KEY}"
    return OpenAIModel("m", base_url=url + query, api_key=API_KEY, request_timeout=TIMEOUT)


def openai_from_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> OpenAIModel:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{url}/v1?key={QUERY_KEY}")
    return OpenAIModel("m", request_timeout=TIMEOUT)


def openai_basic_auth(url: str, monkeypatch: pytest.MonkeyPatch) -> OpenAIModel:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    at = url.replace("http://", f"http://{URL_USER}:{URL_PASSWORD}@")
    return OpenAIModel("m", base_url=f"{at}/v1", request_timeout=TIMEOUT)


def openai_client_headers(url: str, monkeypatch: pytest.MonkeyPatch) -> OpenAIModel:
    client = openai.AsyncOpenAI(
        max_retries=0,
        base_url=f"{url}/v1",
        api_key=API_KEY,
        default_headers={"api-key": HEADER_KEY, "Authorization": f"Bearer {BEARER}"},
        default_query={"key": QUERY_KEY},
    )
    _CLIENTS.append(client)
    return OpenAIModel("m", client=client, request_timeout=TIMEOUT)


def openai_client_auth(url: str, monkeypatch: pytest.MonkeyPatch) -> OpenAIModel:
    http = openai.DefaultAsyncHttpxClient(auth=(URL_USER, URL_PASSWORD))
    client = openai.AsyncOpenAI(
        max_retries=0, base_url=f"{url}/v1", api_key="unused", http_client=http
    )
    _CLIENTS.append(client)
    return OpenAIModel("m", client=client, request_timeout=TIMEOUT)


def anthropic_keyed(url: str, monkeypatch: pytest.MonkeyPatch) -> AnthropicModel:
    return AnthropicModel(
        "claude-x", base_url=f"{url}?key={QUERY_KEY}", api_key=API_KEY, request_timeout=TIMEOUT
    )


def anthropic_from_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> AnthropicModel:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENV_KEY)
    client = anthropic.AsyncAnthropic(
        max_retries=0,
        base_url=url,
        default_headers={"x-api-key": HEADER_KEY, "x-goog-api-key": HEADER_KEY},
    )
    _CLIENTS.append(client)
    return AnthropicModel("claude-x", client=client, request_timeout=TIMEOUT)


_CLIENTS: list[Any] = []
"""The SDK clients a test made, for it to close (a model closes none it was given)."""


MODELS: list[Callable[[str, pytest.MonkeyPatch], Any]] = [
    openai_keyed,
    openai_from_environment,
    openai_basic_auth,
    openai_client_headers,
    openai_client_auth,
    anthropic_keyed,
    anthropic_from_environment,
]


async def failed(agent: Agent, **keywords: Any) -> list[str]:
    """What the error of a run of ``agent``, which must fail, shows."""
    try:
        await agent.run("Where is my order?", **keywords)
    except Exception as error:
        return shown(error)
    raise AssertionError("the run did not fail")


async def failing_run(
    make: Callable[[str, pytest.MonkeyPatch], Any], failure: str, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """What a run on the model ``make`` gives shows, against a server that fails as
    ``failure`` says: the model, the agent and the run's error."""
    echo = None if failure == "refused" else Echo(failure)
    url = refused_url() if echo is None else echo.server.url
    try:
        model = make(url, monkeypatch)
        agent = Support(model=model)
        try:
            return [*shown(model), *shown(agent), *await failed(agent)]
        finally:
            await model.aclose()
            while _CLIENTS:
                await _CLIENTS.pop().close()
    finally:
        if echo is not None:
            echo.server.close()


BACKENDS_AND_FAILURES = [
    *(("asyncio", failure) for failure in FAILURES),
    *(("trio", failure) for failure in ("401", "stream", "silent", "refused")),
]
"""Every failure under asyncio; under trio, those whose errors its transport makes
(what the server says reaches the error the same way under both)."""


@pytest.mark.parametrize(("anyio_backend", "failure"), BACKENDS_AND_FAILURES)
@pytest.mark.parametrize("make", MODELS, ids=[make.__name__ for make in MODELS])
async def test_no_credential_of_a_model_surfaces_when_its_calls_fail(
    spans: Spans,
    histograms: Histograms,
    logged: list[str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[str, pytest.MonkeyPatch], Any],
    failure: str,
) -> None:
    """A server that quotes back every header and the URL it was sent, failing each
    way: no error (its causes included), log record, span or metric shows a key, a
    password or a credential header, however it was given."""
    texts = await failing_run(make, failure, monkeypatch)
    if failure not in ("silent", "refused"):  # what the server quoted back was hidden
        assert [text for text in texts if "[redacted]" in text]
    printed = capfd.readouterr()
    texts += [*spans.every_text(), *histograms.every_text(), *logged, printed.out, printed.err]
    assert not leaked(texts)


async def test_the_caller_s_own_exception_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that fails while its caller handles an exception of its own: what is hidden
    is hidden in littleghost's, the SDK's and the HTTP library's errors, and the caller's
    exception, at the end of their chain, keeps its text (a URL's query in it was cut)."""
    text = "lookup failed at https://example.com/orders?page=2&key=mine"
    echo = Echo("401")
    model = openai_keyed(echo.server.url, monkeypatch)
    try:
        try:
            raise LookupError(text)
        except LookupError as handled:
            texts = await failed(Support(model=model))
            assert str(handled) == text
            assert [line for line in texts if "[redacted]" in line]
            assert not leaked(texts)
    finally:
        await model.aclose()
        echo.server.close()


def pg_url(password: str = PG_PASSWORD) -> str:
    port = refused_url().rpartition(":")[2]
    return f"postgresql://app:{password}@127.0.0.1:{port}/sessions"


def pg_conninfo() -> str:
    port = refused_url().rpartition(":")[2]
    return f"host=127.0.0.1 port={port} user=app password={PG_PASSWORD} dbname=sessions"


STORES = {
    "url": pg_url,
    "conninfo": pg_conninfo,
    "url_password_with_at": lambda: pg_url(f"x@{PG_PASSWORD}"),
    "url_password_with_slash": lambda: pg_url(f"x/{PG_PASSWORD}"),
}


@pytest.mark.parametrize("dsn", list(STORES.values()), ids=list(STORES))
async def test_no_password_of_a_store_surfaces_when_it_cannot_connect(
    spans: Spans, logged: list[str], capfd: pytest.CaptureFixture[str], dsn: Callable[[], str]
) -> None:
    """A PostgreSQL store that cannot connect, or refuses its URL as it is made: its
    error (its causes included), its repr, the run's log records and spans never show
    the password."""
    try:
        store = PostgresSessionStore(dsn(), connect_timeout=2)
    except ConfigurationError as error:  # a password with a bare "@"
        assert not leaked(shown(error))
        return
    texts = shown(store)
    model = OpenAIModel("m", base_url=refused_url(), api_key=API_KEY)
    agent = Support(model=model, session_store=store)
    try:
        texts += await failed(agent, session_id="s")
    finally:
        await model.aclose()
        await store.aclose()
    printed = capfd.readouterr()
    texts += [*spans.every_text(), *logged, printed.out, printed.err]
    assert not leaked(texts)


def cli_cases() -> Iterator[list[str]]:
    for dsn in STORES.values():
        yield ["sessions", "list", "--store", dsn()]
        yield ["sessions", "show", "s", "--store", dsn()]
    yield ["sessions", "list", "--store", *pg_conninfo().split()]  # left unquoted
    yield ["sessions", "show", "s", "--store", *pg_conninfo().split(), "--json"]
    yield ["sessions", "list", "--store", f"mysql://app:{PG_PASSWORD}@db/app"]
    yield ["sessions", "list", "--store", f"POSTGRESQL://app:{PG_PASSWORD}@db/app"]
    yield ["sessions", "list", "--store", f"host=db password={PG_PASSWORD} bogus=1"]
    yield ["sessions", "lsit", "--store", pg_url()]
    yield ["--store", pg_url(), "sessions", "list"]
    yield ["sessions", "list", "--help"]


def test_the_command_line_never_shows_a_store_password(
    logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command given a PostgreSQL URL or conninfo with a password, right or wrong
    (a conninfo left unquoted, a misspelled command, an unknown scheme), and its help
    with the store in the environment: nothing it prints shows the password."""
    texts = []
    for args in cli_cases():
        result = CliRunner().invoke(main, args)
        assert result.exit_code != 0 or args[-1] == "--help", (args, result.output)
        texts += [result.output, *shown(result.exception or "")]
    monkeypatch.setenv("LITTLEGHOST_STORE", pg_url())
    texts += [CliRunner().invoke(main, ["sessions", "show", "--help"]).output, *logged]
    assert not leaked(texts)


WRONG_DECLARATIONS: list[Callable[[], object]] = [
    lambda: OpenAIModel("m", base_url=f"http://app:{URL_PASSWORD}@h:99999/v1?key={QUERY_KEY}"),
    lambda: OpenAIModel("m", base_url=f"h:8080/v1?key={QUERY_KEY}", api_key=API_KEY),
    lambda: OpenAIModel("m", base_url=f"http://app:{URL_PASSWORD}@h/v1", api_key=API_KEY),
    lambda: OpenAIModel("m", base_url="http://h/v1", api_key=f"{API_KEY}\n"),
    lambda: OpenAIModel("m", base_url="http://h/v1", api_key=f"{API_KEY} é"),
    lambda: AnthropicModel("c", base_url=f"http://app:{URL_PASSWORD}@h/", api_key=API_KEY),
    lambda: AnthropicModel("c", base_url=f"ftp://h/?key={QUERY_KEY}", api_key=API_KEY),
    lambda: PostgresSessionStore(f"postgresql://app:{PG_PASSWORD}@h/db?bogus=1"),
    lambda: PostgresSessionStore(f"host=h password={PG_PASSWORD} bogus=1"),
    lambda: PostgresSessionStore(f"host=h password='{PG_PASSWORD}"),
    lambda: PostgresSessionStore(f"mysql://app:{PG_PASSWORD}@h/db"),
    lambda: PostgresSessionStore(f"POSTGRESQL://app:{PG_PASSWORD}@h/db"),
    lambda: PostgresSessionStore(f"postgresql://app:{PG_PASSWORD}%zz@h/db"),
]


@pytest.mark.parametrize("make", WRONG_DECLARATIONS, ids=range(len(WRONG_DECLARATIONS)))
def test_a_wrong_declaration_never_shows_a_credential(
    logged: list[str], make: Callable[[], object]
) -> None:
    """A model or store refused as it is made: its error, its causes and the log
    records never show the key, password or query it was given."""
    with pytest.raises(ConfigurationError) as caught:
        make()
    assert not leaked([*shown(caught.value), *logged])
