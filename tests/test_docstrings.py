"""What ``help()`` shows of the public names: each says what it is, and a value class
names each of its constructor's parameters (in ``Args:``, ``Attributes:`` or its text)."""

from __future__ import annotations

import importlib
import inspect
import itertools
import re

import attrs
import pytest

import littleghost
from littleghost import (
    Agent,
    after_model,
    after_model_error,
    after_tool,
    before_model,
    before_tool,
    errors,
)
from littleghost.testing import ScriptedModel

from .public_api import PUBLIC_MODULES

PUBLIC = [
    (module, name, getattr(importlib.import_module(module), name))
    for module in PUBLIC_MODULES
    for name in importlib.import_module(module).__all__
]
DOCUMENTABLE = [
    (f"{module}.{name}", value)
    for module, name, value in PUBLIC
    if inspect.isclass(value) or inspect.isfunction(value)
]


def own_doc(value: object) -> str:
    """The docstring of ``value`` itself, not one it inherits."""
    doc = vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__
    return doc or ""


@pytest.mark.parametrize(("name", "value"), DOCUMENTABLE, ids=[n for n, _ in DOCUMENTABLE])
def test_a_public_name_says_what_it_is(name: str, value: object) -> None:
    assert own_doc(value).strip(), f"{name} has no docstring of its own"


VALUE_CLASSES = [
    (name, value) for name, value in DOCUMENTABLE if inspect.isclass(value) and attrs.has(value)
]


@pytest.mark.parametrize(("name", "value"), VALUE_CLASSES, ids=[n for n, _ in VALUE_CLASSES])
def test_a_value_class_names_its_parameters(name: str, value: type) -> None:
    doc = own_doc(value)
    public = [field.alias for field in attrs.fields(value) if field.init and field.name[0] != "_"]
    unnamed = [alias for alias in public if not re.search(rf"\b{alias}\b", doc)]
    assert not unnamed, f"{name}'s docstring does not name {unnamed}"


@pytest.mark.parametrize(
    ("decorator", "given"),
    [
        (before_model, "ModelRequest"),
        (after_model, "ModelResponse"),
        (after_model_error, "ModelRequest"),
        (before_tool, "ToolCall"),
        (after_tool, "ToolResult"),
    ],
)
def test_a_hook_decorator_says_what_the_hook_gets_and_returns(
    decorator: object, given: str
) -> None:
    doc = own_doc(decorator)
    assert doc.count(f"``{given}``") == 2, doc  # what it is called with, and may return
    assert "``context=``" in doc
    assert not re.search(r"\ba ``a", doc), doc  # "an ``after_model`` hook"


def test_a_documented_module_says_what_it_holds() -> None:
    assert littleghost.__all__
    assert all(importlib.import_module(module).__doc__ for module in PUBLIC_MODULES)


def error_tree() -> list[str]:
    """The lines of the tree ``littleghost.errors``'s docstring draws: its literal block,
    the indented lines after ``::`` up to the first line that is not."""
    block = (errors.__doc__ or "").split("::", 1)[1].lstrip("\n").splitlines()
    return list(itertools.takewhile(lambda line: line.startswith("    "), block))


def test_the_errors_module_draws_the_tree_of_its_exceptions() -> None:
    """Each line of the tree in ``littleghost.errors``'s docstring is a class under the
    nearest less indented one, with the builtin bases its ``(also X)`` names."""
    drawn: dict[str, str | None] = {}
    parents: list[tuple[int, str]] = []
    for line in error_tree():
        found = re.match(r"\s*(?:[│ ]*[├└]── )?([A-Z]\w+Error)(?: \(also (\w+)\))?", line)
        assert found, f"not a class of the tree: {line!r}"
        depth = found.start(1)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        name, also = found.groups()
        drawn[name] = parents[-1][1] if parents else None
        parents.append((depth, name))
        kind = getattr(errors, name)
        builtin = [base.__name__ for base in kind.__bases__ if base.__module__ == "builtins"]
        assert builtin == ([also] if also else []) or drawn[name] is None, name
    raised = [
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), errors.LittleGhostError)
    ]
    assert sorted(drawn) == sorted(raised)
    for name, parent in drawn.items():
        kind = getattr(errors, name)
        if parent is not None:
            assert getattr(errors, parent) in kind.__bases__, name


def raises_section(function: object) -> set[str]:
    """The exception names a docstring's ``Raises:`` section lists."""
    section = inspect.getdoc(function).split("Raises:", 1)[1]  # type: ignore[union-attr]
    return set(re.findall(r"^    (\w+):", section, re.MULTILINE))


@pytest.mark.parametrize(
    "step",
    [
        errors.InvalidRequestError("refused", status=400),
        errors.ContextWindowOverflowError("too long", status=400),
        errors.ProtocolError("the answer's content is a number"),
        errors.RateLimitError("slow down", status=429, retry_after=0.0),
    ],
    ids=lambda step: type(step).__name__,
)
def test_run_names_what_a_failing_run_raises(step: Exception) -> None:
    class Support(Agent):
        max_retries = 0

    model = ScriptedModel([step])
    with pytest.raises(errors.LittleGhostError) as raised:
        Support(model=model).run_sync("Hello")
    named = raises_section(Agent.run)
    assert {kind.__name__ for kind in type(raised.value).__mro__} & named, raised.value


def test_run_names_the_error_of_a_model_it_cannot_make() -> None:
    class Support(Agent):
        model = "nosuchprovider:model"

    with pytest.raises(errors.LittleGhostError) as raised:
        Support().run_sync("Hello")
    assert {kind.__name__ for kind in type(raised.value).__mro__} & raises_section(Agent.run)


def parameters(value: object) -> list[str]:
    """The parameters a caller passes to ``value``, by name or position."""
    try:
        signature = inspect.signature(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        name
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind not in variadic
    ]


WITH_ARGS = [
    (name, value)
    for name, value in DOCUMENTABLE
    if not (inspect.isclass(value) and attrs.has(value))
    and re.search(
        r"^\s*Args:$",
        own_doc(value) + (own_doc(vars(value).get("__init__")) if inspect.isclass(value) else ""),
        re.MULTILINE,
    )
]


@pytest.mark.parametrize(("name", "value"), WITH_ARGS, ids=[n for n, _ in WITH_ARGS])
def test_an_args_section_lists_every_parameter(name: str, value: object) -> None:
    doc = own_doc(value)
    if inspect.isclass(value):  # its own, and what the classes it extends document
        ours = [kind for kind in value.__mro__ if kind.__module__.startswith("littleghost")]
        doc = "".join(own_doc(k) + own_doc(vars(k).get("__init__")) for k in ours)
    sections = doc.split("Args:")[1:]
    listed = {
        name
        for section in sections
        for name in re.findall(r"^\s*\*{0,2}(\w+)(?: \([^)]*\))?:", section, re.MULTILINE)
    }
    if inspect.isclass(value) and issubclass(value, BaseException):
        listed.add("message")  # the module's docstring: every exception takes its message
    assert [p for p in parameters(value) if p not in listed] == [], name
