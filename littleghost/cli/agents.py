"""``--agent module:Class``: the agent class whose context configuration a command uses."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

import click

from littleghost.agent import Agent
from littleghost.cli.output import one_line

__all__ = ["agent_class", "agent_spec", "users_code"]


@contextmanager
def users_code() -> Iterator[None]:
    """While the user's own code runs (the ``--agent`` module imported, its class made, a
    command's calls into it: tokenizer, model, strategy), what it prints goes to standard
    error, through ``sys.stdout`` or past it (file descriptor 1: ``os.write``, C code, a
    server it starts): standard output is the command's (``--json``)."""
    for stream in (sys.stdout, sys.__stdout__):
        if stream is not None:
            stream.flush()  # what the command wrote so far stays on standard output
    kept = _moved_to_standard_error()
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        if kept is not None:
            try:
                if sys.__stdout__ is not None:  # what it wrote to the stream past sys.stdout
                    sys.__stdout__.flush()
            finally:
                os.dup2(kept, 1)
                os.close(kept)


def _moved_to_standard_error() -> int | None:
    """Point file descriptor 1 at standard error's; a copy of what it was, to restore
    (``None``: either is closed, and it is left as it is)."""
    try:
        kept = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(kept)
        return None
    return kept


def agent_class(spec: str) -> type[Agent]:
    """The ``Agent`` subclass ``spec`` (``module:Class``) names, imported with the current
    directory on the import path (as ``python -m`` has it), as ``users_code``.

    Raises:
        click.BadParameter: It cannot be imported (its module's code fails or calls
            ``sys.exit()``), or is not an ``Agent`` subclass.
    """
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise click.BadParameter(f"{spec!r} is not module:Class (for example myapp.agents:Support)")
    if module_name.startswith(".") or "/" in module_name or "\\" in module_name:
        raise click.BadParameter(_file_named(module_name, qualname))
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with users_code():
            found: object = importlib.import_module(module_name)
    except ImportError as error:
        if module_name.endswith(".py"):
            raise click.BadParameter(_file_named(module_name, qualname)) from None
        raise click.BadParameter(f"cannot import {module_name!r}: {one_line(error)}") from None
    except (Exception, SystemExit) as error:  # the module's own code failed, or exited
        raise click.BadParameter(
            f"importing {module_name!r} failed: {one_line(error, named=True)}"
        ) from None
    for attribute in qualname.split("."):
        if not hasattr(found, attribute):
            raise click.BadParameter(f"{module_name!r} has no {qualname!r}")
        found = getattr(found, attribute)
    if not (isinstance(found, type) and issubclass(found, Agent)):
        raise click.BadParameter(f"{spec} is not an Agent subclass")
    return found


def _file_named(module_name: str, qualname: str) -> str:
    """The error for a file path given for the module (``app.py``, ``./agents/app.py``):
    ``--agent`` takes the name ``import`` takes, which it suggests."""
    path = module_name.replace("\\", "/").removesuffix(".py")
    where = ""
    if path.startswith("/"):  # the file's own name, from its directory
        directory, _, path = path.rpartition("/")
        where = f", from {directory or '/'}"
    name = path.lstrip("./").replace("/", ".") or "myapp.agents"
    return (
        f"{module_name!r} is a file path or a relative name; --agent takes the module's "
        f"import name, as from the current directory (for example {name}:{qualname}{where})"
    )


def agent_spec(agent: Agent) -> str:
    """The ``module:Class`` of ``agent``'s class, as ``--agent`` names it."""
    return f"{type(agent).__module__}:{type(agent).__qualname__}"
