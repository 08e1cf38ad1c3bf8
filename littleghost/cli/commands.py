"""The ``littleghost`` commands: click wiring, one-line errors, and the event loop at the
edge (``run_blocking``); what each command reads and prints lives in its own module."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import FrameType
from typing import Any, TypeVar

import click

from littleghost._validators import MAX_TOKEN_COUNT
from littleghost._version import __version__
from littleghost.agent import Agent
from littleghost.blocking import run_blocking
from littleghost.cli.agents import agent_class, users_code
from littleghost.cli.compact import compact_document, print_compaction
from littleghost.cli.delete import confirm, delete_document, described, print_deletion
from littleghost.cli.export import export_log
from littleghost.cli.listing import print_sessions, sessions_document
from littleghost.cli.log import log_document, print_log
from littleghost.cli.output import Output, escape_unwritable, one_line, shell_word, shown
from littleghost.cli.stores import StoreAddress, store_address
from littleghost.cli.view import print_view, view_document
from littleghost.cli.window import run_model, window_of
from littleghost.errors import LittleGhostError
from littleghost.sessions.base import check_session_id

__all__ = ["READER_GONE", "STORE_VARIABLE", "main"]

STORE_VARIABLE = "LITTLEGHOST_STORE"
"""The environment variable ``--store`` defaults to."""

T = TypeVar("T")


STOPPING = ("SIGTERM", "SIGHUP")
"""The signals a command stops on as on Ctrl-C (``timeout``, a service manager, a closed
terminal) rather than dying at once, which would leave a local model's server running;
one the command was started ignoring (``nohup``) stays ignored."""


@contextmanager
def _stopped_as_interrupted() -> Iterator[list[int]]:
    """While open, a ``STOPPING`` signal stops the command as Ctrl-C does (the SIGINT
    handler of the moment runs: an event loop's cancels its work); yields ``[number]``,
    the signal that stopped it (SIGINT unless one of these did)."""
    stopped_by = [int(signal.SIGINT)]

    def interrupt(number: int, frame: FrameType | None) -> None:
        stopped_by[0] = number
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # Ctrl-C ignored (a background job): stop all the same
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in STOPPING:
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) is signal.SIG_DFL:
                previous[number] = signal.signal(number, interrupt)
    try:
        yield stopped_by
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


READER_GONE = 128 + 13
"""The exit status of a command whose output's reader is gone (``| head``): a process
stopped by SIGPIPE's, as the shell reports ``cat`` or ``git log`` there."""


def _drop_the_rest() -> None:
    """Send what is left of standard output (and its buffer) to the null device: its
    reader is gone, and the flush at exit would fail again (exit 120, or a traceback)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's runner)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)


class _Command(click.Command):
    """A command whose error for words it has no place for (a ``--store`` conninfo left
    unquoted: ``host=db password=...``) shows a ``name=value`` word by its name alone, and
    no word holding ``@`` or ``://``: such words may hold a password."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.allow_extra_args = True  # told below, not by click's error, which quotes them
        rest = super().parse_args(ctx, args)
        if rest and not ctx.resilient_parsing:
            words = " ".join(map(_unquoted, rest))
            hint = ""
            if any("=" in word for word in rest):
                hint = "; a conninfo is one argument, in quotes: --store 'host=... dbname=...'"
            ctx.fail(f"Got unexpected extra argument{'s' * (len(rest) > 1)} ({words}){hint}")
        return rest


def _unquoted(word: str) -> str:
    """An extra word as ``_Command``'s error shows it: ``name=…`` for ``name=value``,
    ``…`` for one holding ``@`` or ``://``."""
    if "@" in word or "://" in word:
        return "…"
    name, equals, _ = word.partition("=")
    return f"{name}=…" if equals else word


class _Group(click.Group):
    """A command group that says where an option of its commands given before one goes
    (``littleghost --store X sessions list``): after the command's name. Its commands
    are ``_Command``."""

    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            taking = _taking(self, error.option_name, ())
            if taking is None:
                raise
            raise click.NoSuchOption(
                error.option_name,
                f"No such option {error.option_name!r} before the command: it is an option "
                "of the commands, written after the command's name "
                f"({ctx.command_path} {' '.join(taking)} ... {error.option_name} ...)",
                ctx=ctx,
            ) from None


class _SessionCommand(_Command):
    """A command of one session: an ``ID`` that starts with ``-`` (a Telegram group's chat
    id, ``-1001234567890``) is read as options (``No such option '-1'``); the error says
    to write it after ``--``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            options = given[: given.index("--")] if "--" in given else given
            typed = [arg for arg in options if arg.startswith(error.option_name)]
            if (
                error.option_name.startswith("--")
                or not typed
                or _names(self, ctx, given, typed[0])
            ):
                raise  # a long option, or a short one mistyped after the ID
            word = typed[0]
            within = "" if word == error.option_name else f" (in {word!r})"
            raise click.NoSuchOption(
                error.option_name,
                f"No such option {error.option_name!r}{within}; a session ID that starts "
                f"with '-' is written last, after '--' "
                f"({ctx.command_path} ... -- {shell_word(word)})",
                ctx=ctx,
            ) from None


def _names(command: click.Command, ctx: click.Context, args: list[str], word: str) -> bool:
    """Whether ``args`` without ``word`` give ``command`` its session ID (then ``word`` is
    a mistyped option, not an ID)."""
    rest = list(args)
    rest.remove(word)
    try:
        given, _, _ = command.make_parser(ctx).parse_args(args=rest)
    except click.UsageError:
        return False
    return isinstance(given.get("session_id"), str)


def _taking(group: click.Group, option: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The names leading from ``group`` to the first command that takes ``option``."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found = _taking(command, option, (*path, name))
            if found is not None:
                return found
        elif any(option in param.opts for param in command.params):
            return (*path, name)
    return None


@contextmanager
def _escaped_errors() -> Iterator[None]:
    """An error's message with what a terminal would act on as escapes (``shown``): it
    quotes text littleghost does not write (a provider's message, from its server; a
    store's path; the agent's own code's exception; an argument click repeats); the help
    a group given no command shows as its error is its own, laid out as written."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.ClickException as error:
        error.message = shown(error.message)  # type: ignore[misc]  # Final: set only as made
        raise


class _Commands(_Group):
    """The command group: a command stopped with Ctrl-C, working or writing, exits 130
    (stopped by a ``STOPPING`` signal, 128 + its number); one whose output cannot be
    written (a full disk) fails in one line, and one whose reader is gone (``| head``)
    exits quietly with ``READER_GONE``. No error's message can act on a terminal."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _escaped_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        escape_unwritable(sys.stdout)
        with _escaped_errors(), _stopped_as_interrupted() as stopped_by:
            try:
                done = super().invoke(ctx)
                if sys.stdout is not None:  # closed (>&-): delete or compact does its work
                    sys.stdout.flush()  # a reader gone fails here, not at exit
                return done
            except KeyboardInterrupt:
                click.echo("Interrupted", err=True)
                raise SystemExit(128 + stopped_by[0]) from None
            except OSError as error:
                if error.errno == errno.EPIPE:
                    _drop_the_rest()
                    raise SystemExit(READER_GONE) from None
                raise click.ClickException(one_line(error, named=True)) from None


def _run(work: Callable[..., Awaitable[T]], *args: Any, agents_code: bool = False) -> T:
    """Run ``work`` in an event loop, as ``users_code`` if it calls ``agents_code`` (a
    model, tokenizer, strategy: what they print goes to standard error, and so would what
    ``work`` writes); a littleghost error becomes one line and exit 1, and so does a
    ``sys.exit()`` of the agent's own code it runs (littleghost raises no
    ``SystemExit``), which is not the command's exit."""
    try:
        with users_code() if agents_code else nullcontext():
            return run_blocking(work, *args)
    except LittleGhostError as error:
        raise click.ClickException(one_line(error)) from None
    except SystemExit as error:
        failure = one_line(error, named=True)
        raise click.ClickException(f"the agent's own code exited: {failure}") from None


def _output_open(command: str) -> None:
    """Fail in one line when standard output is closed (``>&-``) for a command whose only
    work is what it writes (``list``, ``show``, ``view``, ``export``, a dry run), before it
    reads anything: it would do nothing and exit 0. ``delete`` and ``compact`` do their
    work without it."""
    if sys.stdout is None:
        raise click.ClickException(
            f"standard output is closed: {command} has nowhere to write what it reads"
        )


def _write(document: T, as_json: bool, show: Callable[[Output, T], None]) -> None:
    """Write a command's ``document`` as JSON (``--json``), or as ``show`` prints it."""
    output = Output.detect()
    if as_json:
        output.json(document)
    else:
        show(output, document)


def _instance(cls: type[Agent]) -> Agent:
    """An instance of the class ``--agent`` names (its model is not made), made as
    ``users_code``; its ``sys.exit()`` is a failure too."""
    try:
        with users_code():
            return cls()
    except (Exception, SystemExit) as error:
        failure = one_line(error, named=True)
        raise click.ClickException(f"--agent: {cls.__name__}() failed: {failure}") from None


def _agent_option(
    text: str, *, required: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--agent module:Class``: the class, imported while the command line is parsed."""
    return click.option(
        "--agent",
        "agent_type",
        required=required,
        metavar="module:Class",
        callback=lambda context, parameter, value: None if value is None else agent_class(value),
        help=text,
    )


store_option = click.option(
    "--store",
    "address",
    required=True,
    envvar=STORE_VARIABLE,
    show_envvar=True,
    metavar="URL",
    callback=lambda context, parameter, value: store_address(value),
    help=(
        "sqlite:///path.db (sqlite:////var/app.db for an absolute path), or a PostgreSQL "
        "URL (postgresql://...) or conninfo."
    ),
)


def _typed(value: str) -> str:
    """Text from the command line as typed: where Python reads it as ASCII (``LC_ALL=C``
    with UTF-8 mode off), the bytes of ``日本`` or ``café`` come as lone surrogates
    (``\\udce6``), read here as the UTF-8 they are; text it read as the locale's own
    (Latin-1, EUC-JP) is kept, and so are bytes that are no UTF-8."""
    try:
        value.encode()
    except UnicodeEncodeError:
        try:
            return os.fsencode(value).decode()
        except UnicodeError:
            pass
    return value


def _message(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """``--message``, as typed (``_typed``)."""
    return None if value is None else _typed(value)


def _session_id(context: click.Context, parameter: click.Parameter, value: str) -> str:
    """``ID`` as typed (``_typed``), if it can name a stored session (a longer id than a
    session is written under too: an earlier littleghost stored some)."""
    try:
        return check_session_id(_typed(value), stored=True)
    except (TypeError, LittleGhostError) as error:
        raise click.BadParameter(str(error)) from None


session_argument = click.argument("session_id", metavar="ID", callback=_session_id)
json_option = click.option("--json", "as_json", is_flag=True, help="Write JSON, for scripts.")
window_option = click.option(
    "--window",
    type=click.IntRange(min=1, max=MAX_TOKEN_COUNT),
    metavar="N",
    help=(
        "The context window in tokens, at most 2**63-1 "
        "[default: the class's context_window_override, else "
        "the window its model is known to have without starting it, else "
        "context_window_tokens; compact without --dry-run starts the model and takes the "
        "window it reports]."
    ),
)


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="littleghost")
def main() -> None:
    """littleghost: look into the conversations your agents keep.

    Point --store (or LITTLEGHOST_STORE) at the SQLite file or PostgreSQL database of a
    SQLiteSessionStore or PostgresSessionStore. Every command opens it read-only, except
    `sessions compact` without --dry-run and `sessions delete`. Tables and colours are
    for terminals; piped output is plain tab-separated text, and --json gives JSON.

    Exit status: 0 done; 1 failed, said in one line on standard error; 2 a wrong command,
    option or value; 130 stopped by Ctrl-C (143 by SIGTERM, 129 by SIGHUP); 141 the
    reader of its output gone (| head).
    """


@main.group(cls=_Group, short_help="Inspect, compact and delete stored sessions.")
def sessions() -> None:
    """Inspect stored sessions: what was said, what the model sees next, and why.

    \b
      littleghost sessions list    --store sqlite:///sessions.db
      littleghost sessions show    ID --store sqlite:///sessions.db
      littleghost sessions view    ID --store sqlite:///sessions.db --agent app:Support
      littleghost sessions compact ID --store sqlite:///sessions.db --agent app:Support --dry-run
      littleghost sessions export  ID --store sqlite:///sessions.db > ID.jsonl
      littleghost sessions delete  ID --store sqlite:///sessions.db
      littleghost sessions delete  ID --store sqlite:///sessions.db --yes --json
    """


@sessions.command("list", short_help="List the sessions: messages, summaries, last activity.")
@store_option
@json_option
def list_sessions(address: StoreAddress, as_json: bool) -> None:
    """List the sessions, oldest first: messages, summaries, last activity (UTC)."""
    _output_open("sessions list")

    async def read() -> list[dict[str, Any]]:
        async with address.open() as store:
            return await sessions_document(store)

    _write(_run(read), as_json, print_sessions)


@sessions.command(cls=_SessionCommand, short_help="Show the whole log of a session.")
@session_argument
@store_option
@json_option
def show(session_id: str, address: StoreAddress, as_json: bool) -> None:
    """Show the whole log of session ID, as stored.

    One row per message: position, time stored, role, id and a one-line excerpt; tool
    calls with the result that answered each; compaction records (summaries, collapses,
    exclusions) with the messages they cover, and [in #N] on each message a record hides.
    """
    _output_open("sessions show")
    log = _run(address.log, session_id)
    _write(log_document(session_id, log, quote=not as_json), as_json, print_log)


@sessions.command(
    cls=_SessionCommand, short_help="Show what the model would see next, with estimates."
)
@session_argument
@store_option
@_agent_option(
    "The agent class whose instructions, tools, settings and @manage_context "
    "configuration apply [default: a default @manage_context on the log alone]."
)
@window_option
@click.option(
    "--message",
    "next_message",
    metavar="TEXT",
    callback=_message,
    help="The next user message: the view is then exactly the next run's first request.",
)
@json_option
def view(
    session_id: str,
    address: StoreAddress,
    agent_type: type[Agent] | None,
    window: int | None,
    next_message: str | None,
    as_json: bool,
) -> None:
    """Show what the model would see next in session ID, and its token estimates.

    The messages of the next run's first model call as littleghost builds it (the class's
    own before_model hooks aside): the instructions, the view of the log with compaction
    records in place of what they cover, tool results clipped and the view bounded by a
    PromptBudget. Then the estimate per message and in total, the window, the threshold
    and whether the next call tries to compact first, and the budget's figures.
    """
    _output_open("sessions view")
    agent = None if agent_type is None else _instance(agent_type)

    async def read() -> dict[str, Any]:
        declared = run_model(agent)  # may call the class's resolve_model (the agent's code)
        used = window_of(agent, window, declared)  # may ask the model its window
        log = await address.log(session_id)
        return view_document(session_id, log, agent, used, next_message, declared)

    _write(_run(read, agents_code=True), as_json, print_view)


@sessions.command(
    cls=_SessionCommand, short_help="Compact a session now, or show what would be covered."
)
@session_argument
@store_option
@_agent_option(
    "The agent class whose @manage_context configuration and model compact.", required=True
)
@window_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only show what would be covered: nothing is written and no model is called.",
)
def compact(
    session_id: str,
    address: StoreAddress,
    agent_type: type[Agent],
    window: int | None,
    dry_run: bool,
) -> None:
    """Compact session ID now, as the agent class would, whatever its threshold.

    The class's strategy, or its default summarizer aiming at half of the conversation's
    estimate with the newest messages kept; the summary is written by the class's model.
    The session is held as a run holds it (a run of it under way ends first: the command
    says it is waiting; Ctrl-C stops it, appending nothing), and the records are
    appended: nothing stored is removed. With --dry-run the store is only read and no
    model is called, so the records say what would be covered but hold no summary text.
    """
    if dry_run:
        _output_open("sessions compact --dry-run")
    agent = _instance(agent_type)
    output = Output.detect()
    with output.progress_bar(2 if dry_run else 4, "compacting") as advance:
        document = _run(
            lambda: compact_document(
                address,
                session_id,
                agent,
                window,
                dry_run=dry_run,
                advance=advance,
                notice=not output.progress,  # a progress bar says it waits
            ),
            agents_code=True,
        )
    print_compaction(output, document)


@sessions.command(cls=_SessionCommand, short_help="Write a session as JSON Lines, the stored form.")
@session_argument
@store_option
def export(session_id: str, address: StoreAddress) -> None:
    """Write session ID as JSON Lines: one message a line, in the stored form.

    Each line is the message as the store keeps it (littleghost.sessions.message_from_json
    reads it back). The log is written as it was when the export began, read 1 000
    messages at a time: memory does not grow with the session.
    """
    _output_open("sessions export")
    _run(export_log, address, session_id, Output.detect())


@sessions.command(
    cls=_SessionCommand, short_help="Delete a session and all its messages, for good."
)
@session_argument
@store_option
@click.option(
    "--yes",
    "-y",
    "confirmed",
    is_flag=True,
    help="Delete without asking (needed when standard input is not a terminal).",
)
@json_option
def delete(session_id: str, address: StoreAddress, confirmed: bool, as_json: bool) -> None:
    """Delete session ID and all its messages, compaction records included, for good.

    On a terminal it asks first (answer y); elsewhere pass --yes. The session is held as
    a run holds it: a run of it under way ends first (the command says it is waiting;
    Ctrl-C stops it, deleting nothing). SQLite overwrites the text in the file and
    empties its write-ahead log; PostgreSQL keeps deleted rows until VACUUM. Prints the
    messages and records deleted, never their content.
    """
    session = _run(described, address, session_id)
    if not confirmed:
        confirm(session)
    begun: list[bool] = []
    try:
        document = _run(delete_document, address, session_id, lambda: begun.append(True))
    except KeyboardInterrupt:
        if begun:  # its transaction may be committed (SQLite then empties its -wal file)
            name = shell_word(session_id, in_prose=True)
            click.echo(
                f"stopped as session {name} was being deleted: it may be deleted already "
                "(sessions show tells)",
                err=True,
            )
        raise
    _write(document, as_json, print_deletion)
