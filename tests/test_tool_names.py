"""Tool names are unique per agent: a second tool with a taken name fails the class
definition, naming the name and both places it is declared."""

from __future__ import annotations

import re

import pytest

from littleghost import Agent, tool
from littleghost.errors import ConfigurationError


def lookup(order_id: str) -> str:
    """Find an order."""
    return order_id


@tool(name="lookup")
def other_lookup(order_id: str) -> str:
    """Find an order elsewhere."""
    return order_id


def test_two_methods_with_one_tool_name_fail() -> None:
    """Two ``@tool(name="x")`` methods no longer overwrite each other silently."""
    with pytest.raises(
        ConfigurationError,
        match=re.escape("Twice: two tools are named 'search': method 'first' and method 'second'"),
    ):

        class Twice(Agent):
            @tool(name="search")
            def first(self) -> str:
                """Search one way."""
                return ""

            @tool(name="search")
            def second(self) -> str:
                """Search another way."""
                return ""


class Parent(Agent):
    @tool
    def search(self) -> str:
        """Search."""
        return "parent"


def test_a_subclass_tool_taking_an_inherited_name_fails() -> None:
    """A new method whose tool name an inherited tool already has is refused."""
    with pytest.raises(
        ConfigurationError,
        match=re.escape("two tools are named 'search': method 'search' and method 'find'"),
    ):

        class Child(Parent):
            @tool(name="search")
            def find(self) -> str:
                """Find."""
                return "child"


def test_overriding_a_tool_method_replaces_it() -> None:
    """Overriding the same attribute is not a duplicate: the subclass's tool replaces it."""

    class Child(Parent):
        @tool
        def search(self) -> str:
            """Search better."""
            return "child"

    assert [spec.description for spec in Child().tool_specs] == ["Search better."]


def test_a_method_and_a_function_with_one_name_fail_naming_both() -> None:
    """A method tool and a function in ``tools`` with one name are both named."""
    with pytest.raises(
        ConfigurationError,
        match=r"two tools are named 'lookup': method 'lookup' and tools\[0\] \(lookup\)",
    ):

        class Mixed(Agent):
            tools = [lookup]

            @tool
            def lookup(self, order_id: str) -> str:
                """Find an order here."""
                return order_id


@pytest.mark.parametrize(
    ("functions", "places"),
    [
        ([lookup, lookup], r"tools\[0\] \(lookup\) and tools\[1\] \(lookup\)"),
        ([lookup, other_lookup], r"tools\[0\] \(lookup\) and tools\[1\] \(other_lookup\)"),
    ],
    ids=["same-function", "renamed-function"],
)
def test_two_functions_with_one_name_fail(functions: list[object], places: str) -> None:
    """In the class's ``tools`` and in ``tools=`` given to the constructor."""
    with pytest.raises(ConfigurationError, match=rf"two tools are named 'lookup': {places}"):
        type("Functions", (Agent,), {"tools": functions})
    with pytest.raises(ConfigurationError, match=rf"two tools are named 'lookup': {places}"):
        Agent(tools=functions)
