"""A real TCP server on 127.0.0.1 that answers each connection with a scripted behaviour,
byte by byte: whole HTTP answers, a reset before the headers or in the middle of a
stream, headers that come late, a stream that stalls, a server that never answers. It
runs in threads of its own, so it serves tests under asyncio and trio alike."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

Behaviour = Callable[["Connection"], None]
"""What the server does with one request on its connection."""


@attrs.frozen
class Request:
    """One request the server read: its method, path, lowercased headers and body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One accepted connection: writes answers, resets, stalls."""

    def __init__(self, sock: socket.socket, stopping: threading.Event) -> None:
        self.sock = sock
        self.stopping = stopping

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def head(self, status: int, headers: dict[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} Status"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode())

    def answer(
        self, status: int, body: bytes | str | object, headers: dict[str, str] | None = None
    ) -> None:
        """A whole answer; a body that is not bytes or str is sent as JSON."""
        kind = "application/json"
        if isinstance(body, str):
            kind, body = "text/html", body.encode()
        elif not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.head(
            status,
            {"Content-Type": kind, "Content-Length": str(len(body)), **(headers or {})},
        )
        self.send(body)

    def events(self, events: Iterable[bytes], *, pause: float = 0.0) -> None:
        """The head of an event stream (closed when the connection closes), then
        ``events``, ``pause`` seconds apart."""
        self.head(200, {"Content-Type": "text/event-stream", "Connection": "close"})
        for event in events:
            self.send(event)
            if pause:
                time.sleep(pause)
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def reset(self) -> None:
        """Close with a TCP reset (RST), as a crashed proxy or a dropped connection."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def stall(self) -> None:
        """Keep the connection open, silent, until the server stops."""
        self.stopping.wait()


class RawServer:
    """Serves ``behaviours`` in order, one per POST request (the last one again once they
    run out), and records each; any other request is a 404. With ``tls`` (a server
    context), it serves HTTPS and counts the handshakes tried in ``handshakes``."""

    def __init__(self, *behaviours: Behaviour, tls: ssl.SSLContext | None = None) -> None:
        self.behaviours = list(behaviours)
        self.tls = tls
        self.handshakes = 0
        self.requests: list[Request] = []
        self.times: list[float] = []
        self._stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            if self._stopping.is_set():  # the connection ``close`` makes to wake this
                sock.close()
                return
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        buffered = b""
        try:
            if self.tls is not None:
                self.handshakes += 1
                sock = self.tls.wrap_socket(sock, server_side=True)
            while not self._stopping.is_set():
                request, buffered = self._read(sock, buffered)
                if request is None:
                    return
                if request.method != "POST":  # a model's probe of the server's window
                    Connection(sock, self._stopping).answer(404, {"error": "not found"})
                    continue
                self.requests.append(request)
                self.times.append(time.monotonic())
                behaviour = self.behaviours.pop(0) if len(self.behaviours) > 1 else None
                behaviour = behaviour or self.behaviours[0]
                behaviour(Connection(sock, self._stopping))
                if sock.fileno() == -1:
                    return
        except OSError:
            return
        finally:
            if sock.fileno() != -1:
                sock.close()

    @staticmethod
    def _read(sock: socket.socket, buffered: bytes) -> tuple[Request | None, bytes]:
        while b"\r\n\r\n" not in buffered:
            data = sock.recv(65536)
            if not data:
                return None, b""
            buffered += data
        head, _, rest = buffered.partition(b"\r\n\r\n")
        first, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = first.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            data = sock.recv(65536)
            if not data:
                return None, b""
            rest += data
        return Request(method, path, headers, rest[:length]), rest[length:]

    def close(self) -> None:
        self._stopping.set()
        # a connection wakes the accepting thread at once
        socket.create_connection(self._listener.getsockname(), timeout=5).close()
        self._accepting.join()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


def refused_url() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
