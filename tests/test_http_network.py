"""The providers as an enterprise network serves them: the real SDK clients behind a
proxy named by ``HTTPS_PROXY`` that refuses the tunnel, against a server whose TLS
certificate is self-signed, and at a base URL with a path and a query (Azure's
``?api-version=``, a gateway's), all on 127.0.0.1, under asyncio and trio."""

from __future__ import annotations

import base64
import logging
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from littleghost import Agent
from littleghost.errors import (
    ConfigurationError,
    InvalidRequestError,
    ProviderError,
    ProviderUnavailableError,
)
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from tests.conftest import Spans
from tests.raw_http import Behaviour, RawServer
from tests.sdk_bodies import answered_whole

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


class TunnelRefusingProxy:
    """An HTTP proxy on 127.0.0.1 that answers every ``CONNECT`` with ``status``, and
    records the head of each."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.heads: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with sock:
                head = b""
                while b"\r\n\r\n" not in head and (data := sock.recv(65536)):
                    head += data
                if not head:
                    return  # ``close`` woke the listener
                self.heads.append(head.decode("latin-1"))
                page = f"<html><body><h1>{self.status}</h1></body></html>".encode()
                sock.sendall(
                    f"HTTP/1.1 {self.status}\r\nContent-Type: text/html\r\n"
                    f'Proxy-Authenticate: Basic realm="corp"\r\n'
                    f"Content-Length: {len(page)}\r\n\r\n".encode()
                    + page
                )

    def close(self) -> None:
        socket.create_connection(self._listener.getsockname(), timeout=5).close()
        self._thread.join(timeout=5)
        self._listener.close()


PROXY_SECRET = "proxy-secret-pw-42"


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("answer", "kind", "attempts"),
    [
        ("407 Proxy Authentication Required", InvalidRequestError, 1),
        ("403 Forbidden", InvalidRequestError, 1),
        ("502 Bad Gateway", ProviderUnavailableError, 2),
        ("504 Gateway Timeout", ProviderUnavailableError, 2),
    ],
)
async def test_a_proxy_refusing_the_tunnel_is_named_and_retried_only_for_a_5xx(
    model_of: Models,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    spans: Spans,
    provider: str,
    answer: str,
    kind: type[ProviderError],
    attempts: int,
) -> None:
    """A proxy's refusal of the ``CONNECT`` says it is the proxy's, with its status; a
    407 or 403 is not asked again (the same credentials would be refused), a 502 or 504
    is; the proxy's user and password are in no message, log or span."""
    proxy = TunnelRefusingProxy(answer)
    monkeypatch.setenv("HTTPS_PROXY", f"http://corp-user:{PROXY_SECRET}@{proxy.address}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    caplog.set_level(logging.DEBUG)
    try:
        model = model_of(provider, "https://api.example.test")
        async with Plain(model=model, max_retries=1) as agent:
            with pytest.raises(ProviderError) as raised:
                await agent.run("hello")
    finally:
        proxy.close()
    error = raised.value
    assert type(error) is kind
    assert (error.status, error.code) == (int(answer[:3]), "proxy_error")
    assert f"the proxy {'could not connect' if attempts > 1 else 'refused to connect'}" in (
        str(error)
    )
    assert f"to the server at api.example.test:443 (HTTP {answer})" in str(error)
    assert ("HTTPS_PROXY its user and password" in str(error)) is answer.startswith("407")
    assert len(proxy.heads) == attempts
    assert all(head.startswith("CONNECT api.example.test:443 ") for head in proxy.heads)
    shown = [str(error), caplog.text, *spans.every_text()]
    assert not [text for text in shown if PROXY_SECRET in text or "corp-user" in text]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key, and that key."""
    certificate, key = directory / "cert.pem", directory / "key.pem"
    command = (
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
        "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1"
    )
    subprocess.run(
        [*command.split(), "-keyout", str(key), "-out", str(certificate)],
        check=True,
        capture_output=True,
    )
    return certificate, key


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[Callable[[Behaviour], RawServer]]:
    """Makes HTTPS servers of the self-signed ``certificate``, closed after the test."""
    made: list[RawServer] = []

    def make(behaviour: Behaviour) -> RawServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certificate)
        made.append(RawServer(behaviour, tls=context))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_untrusted_certificate_is_named_not_retried_and_ssl_cert_file_trusts_it(
    model_of: Models,
    tls_server: Callable[[Behaviour], RawServer],
    certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    """A self-signed certificate fails the call at once with an error that says so (a
    retry would meet the same certificate), without the URL's query; once
    ``SSL_CERT_FILE`` names it, the server is trusted."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    server = tls_server(answered_whole(provider))
    secret = "?token=url-secret-pw"
    async with Plain(model=model_of(provider, server.url, secret), max_retries=3) as agent:
        with pytest.raises(ProviderError) as raised:
            await agent.run("hello")
    assert type(raised.value) is ProviderError
    assert raised.value.code == "untrusted_certificate"
    address = server.url.removeprefix("https://")
    assert f"the server's TLS certificate at {address} is not trusted (self-signed " in str(
        raised.value
    )
    assert "SSL_CERT_FILE" in str(raised.value)
    assert "url-secret-pw" not in str(raised.value)
    assert (server.handshakes, server.requests) == (1, [])

    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    async with Plain(model=model_of(provider, server.url, secret)) as agent:
        assert (await agent.run("hello")).output == "fine"


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    "suffix",
    [
        "/openai/deployments/support?api-version=2024-10-21",
        "/v1/proxy/gateway?tenant=t%201&region=eu",
        "/v1/proxy/gateway?scope=read&scope=write&scope=read&region=eu&empty=",
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


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("where", ["base_url", "environment"])
async def test_a_base_urls_repeated_query_keys_go_on_every_request(
    servers: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch, provider: str, where: str
) -> None:
    """Every value of a key the base URL's query repeats goes with every request, in its
    order, from ``base_url=`` or the environment (the SDK's own query keeps one a key)."""
    query = "scope=read&scope=write&tenant=t1&scope=admin"
    server = servers(answered_whole(provider), answered_whole(provider))
    url = f"{server.url}{'/v1' if provider == 'openai' else ''}?{query}"
    variable = f"{provider.upper()}_BASE_URL"
    monkeypatch.setenv(variable, url)
    options = {"base_url": url} if where == "base_url" else {}
    kind = OpenAIModel if provider == "openai" else AnthropicModel
    model = kind("some-model", api_key=KEY, context_window=WINDOW, **options)
    try:
        for _ in range(2):
            assert (await Plain(model=model).run("hello")).output == "fine"
    finally:
        await model.aclose()
    expected = [("scope", "read"), ("scope", "write"), ("scope", "admin"), ("tenant", "t1")]
    for sent in server.requests:
        assert parse_qsl(sent.path.partition("?")[2], keep_blank_values=True) == expected


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("where", ["base_url", "environment"])
@pytest.mark.parametrize("user", ["corp-user:url-secret-pw", "corp-user", ":url-secret-pw"])
def test_a_user_or_password_in_the_base_url_beside_a_key_is_refused_unshown(
    monkeypatch: pytest.MonkeyPatch, provider: str, where: str, user: str
) -> None:
    """The HTTP client sends a user and password of the URL as Basic auth in the
    ``Authorization`` header, where the key goes: the key never reached the server. Making
    the model refuses them, naming neither, from ``base_url=`` or the environment."""
    url = f"https://{user}@gateway.example.com/v1"
    variable = f"{provider.upper()}_BASE_URL"
    kind = OpenAIModel if provider == "openai" else AnthropicModel
    options = {"base_url": url} if where == "base_url" else {}
    monkeypatch.setenv(variable, url)
    with pytest.raises(ConfigurationError) as raised:
        kind("some-model", api_key=KEY, **options)
    assert str(raised.value) == (
        f"{kind.__name__}: base_url (or {variable}) holds a user or password, which the HTTP "
        "client would send as Basic auth in place of the API key: take them out of the URL "
        "(for a gateway that asks for both, pass client= with an HTTP client that "
        "authenticates to it)"
    )


async def test_without_a_key_a_user_and_password_of_the_base_url_are_the_servers_basic_auth(
    servers: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server of OpenAI's API behind Basic auth (a self-hosted one), given no key: the
    URL's user and password are what authenticates, and are sent so."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = servers(answered_whole("openai"))
    url = server.url.replace("http://", "http://corp-user:url-secret-pw@") + "/v1"
    model = OpenAIModel("gpt-4o-mini", base_url=url, context_window=WINDOW)
    try:
        assert (await Plain(model=model).run("hello")).output == "fine"
    finally:
        await model.aclose()
    [sent] = server.requests
    basic = base64.b64encode(b"corp-user:url-secret-pw").decode()
    assert sent.headers["authorization"] == f"Basic {basic}"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_proxy_asking_for_authentication_over_plain_http_says_so_once(
    servers: Callable[..., RawServer],
    model_of: Models,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    spans: Spans,
    provider: str,
) -> None:
    """A proxy of ``http://`` requests (``HTTP_PROXY``) answers a 407 itself, with its
    HTML page: the error says it is the proxy's and is not retried; the proxy's user
    and password are in no message, log or span."""
    page = "<html><body><h1>407 Proxy Authentication Required</h1></body></html>"
    proxy = servers(lambda connection: connection.answer(407, page))
    address = proxy.url.removeprefix("http://")
    monkeypatch.setenv("HTTP_PROXY", f"http://corp-user:{PROXY_SECRET}@{address}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    caplog.set_level(logging.DEBUG)
    async with Plain(model=model_of(provider, "http://api.example.test"), max_retries=3) as agent:
        with pytest.raises(InvalidRequestError) as raised:
            await agent.run("hello")
    assert raised.value.status == 407
    assert "the proxy asks for authentication (HTTP 407): give HTTP_PROXY its user and " in (
        str(raised.value)
    )
    assert [request.path.split("/")[2] for request in proxy.requests] == ["api.example.test"]
    shown = [str(raised.value), caplog.text, *spans.every_text()]
    assert not [text for text in shown if PROXY_SECRET in text or "corp-user" in text]
