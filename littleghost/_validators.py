"""attrs validators shared by littleghost's values and configurations.

A configuration value rejects a wrong field with ``ConfigurationError``, a value type with
``TypeError``; either way the message names the field and what it accepts, as in
``"TokensExceed.limit must be an int >= 0, not -1"``. This module imports only
``errors.py``, so any module may use it.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard, TypeVar

from littleghost.errors import ConfigurationError

__all__ = [
    "MAX_DEPTH",
    "MAX_TOKEN_COUNT",
    "TOKENIZER",
    "TOKEN_COUNT",
    "Validator",
    "check",
    "count",
    "counts_tokens",
    "digits_limit",
    "has_method",
    "holds_unwritable",
    "instance_of",
    "int_at_least",
    "is_callable",
    "is_int",
    "is_number",
    "is_token_count",
    "nests_deeper",
    "optional",
    "safe_repr",
    "too_long_to_write",
    "tuple_of",
    "type_check",
    "wrong_value",
]

Validator = Callable[[Any, Any, Any], None]
"""An attrs validator: called with ``(instance, attribute, value)``, raises when wrong."""

T = TypeVar("T")


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """True for a finite ``float``, or an ``int`` (not a ``bool``) a float can hold: one
    past about 1.8e308 fails wherever it meets a float (``OverflowError: int too large to
    convert to float``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if not is_int(value):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


MAX_DEPTH = 100
"""How deeply lists, tuples and dicts may nest in a value the log holds (tool-call
arguments, metadata): the session stores' limit."""


def nests_deeper(value: object, levels: int = MAX_DEPTH) -> bool:
    """True when lists, tuples and mappings nest in ``value`` more than ``levels`` deep."""
    if not isinstance(value, (Mapping, list, tuple)):
        return False
    if levels == 0:
        return True
    items = value.values() if isinstance(value, Mapping) else value
    return any(nests_deeper(item, levels - 1) for item in items)


def digits_limit() -> int:
    """The most digits Python writes an int with (``sys.set_int_max_str_digits``, 4300 by
    default); 0 for no limit (as before Python 3.10.7 and 3.11)."""
    limit: int = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    return limit


def too_long_to_write(value: int) -> bool:
    """True when Python will not write ``value`` as decimal text: it has more digits than
    ``sys.set_int_max_str_digits`` allows (4300 by default, from Python 3.11 and 3.10.7)."""
    limit = digits_limit()
    if limit == 0 or value.bit_length() <= 3 * limit:  # 10**limit has ~3.32 * limit bits
        return False
    least: int = 10**limit  # the least int of limit + 1 digits
    return abs(value) >= least


def holds_unwritable(value: object) -> bool:
    """True when ``value`` is or holds (in mappings, their keys too, lists and tuples) a
    number JSON text cannot carry: ``NaN``, an infinity, or an int Python will not write
    (``too_long_to_write``)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int):
        return too_long_to_write(value)
    if isinstance(value, Mapping):
        return any(holds_unwritable(key) for key in value if isinstance(key, int)) or any(
            holds_unwritable(item) for item in value.values()
        )
    if isinstance(value, (list, tuple)):
        return any(holds_unwritable(item) for item in value)
    return False


def safe_repr(value: object) -> str:
    """``repr(value)`` for an error message; an int Python will not write
    (``too_long_to_write``) as ``"an int of more than N digits"``, and a value whose repr
    fails (a list holding such an int) by its type and the reason."""
    try:
        return repr(value)
    except ValueError as error:
        if isinstance(value, int):  # its only failure: the digit limit
            return f"an int of more than {digits_limit()} digits"
        return f"a {type(value).__name__} that cannot be shown ({error})"


def int_at_least(minimum: int) -> Callable[[object], bool]:
    """A predicate: an ``int`` (not a ``bool``) >= ``minimum``."""

    def ok(value: object) -> bool:
        return is_int(value) and value >= minimum

    return ok


MAX_TOKEN_COUNT = 2**63 - 1
"""The most tokens littleghost takes for a count (a context window, a prompt's size): what
64 bits hold and OpenTelemetry exports, far past any model's window; a provider's larger
figure is none, and a window or a count declared larger is refused (the estimates'
floating-point arithmetic overflowed on 10**400)."""
TOKEN_COUNT = "an int from 1 to 2**63-1"


def is_token_count(value: object) -> TypeGuard[int]:
    """True for a count of tokens littleghost takes: an int from 1 to ``MAX_TOKEN_COUNT``."""
    return is_int(value) and 0 < value <= MAX_TOKEN_COUNT


def has_method(name: str) -> Callable[[object], bool]:
    """A predicate: an object, not a class, with a callable attribute ``name`` (a
    protocol's method)."""
    return lambda value: not isinstance(value, type) and callable(getattr(value, name, None))


TOKENIZER = "an object with count_tokens(text), a plain (not async) method"
"""What ``counts_tokens`` accepts, as an error says it."""


def counts_tokens(value: object) -> bool:
    """True for a tokenizer: an object with a ``count_tokens`` method that answers at once
    (not a coroutine function, whose count the estimates could not add)."""
    return has_method("count_tokens")(value) and not inspect.iscoroutinefunction(
        value.count_tokens  # type: ignore[attr-defined]
    )


def is_callable(value: object) -> TypeGuard[Callable[..., Any]]:
    """True for a callable that is not a class: a function, a method, a callable object."""
    return not isinstance(value, type) and callable(value)


def wrong_value(value: object, plain: Callable[[object], str] = safe_repr) -> str:
    """A wrong configuration value as an error names it: a class as ``"the class X (did
    you mean X(...)?)"``, since an instance was wanted; anything else by ``plain``."""
    if isinstance(value, type):
        return f"the class {value.__name__} (did you mean {value.__name__}(...)?)"
    return plain(value)


def check(name: str, ok: Callable[[Any], bool], allowed: str) -> Validator:
    """A configuration validator: ``ConfigurationError`` unless ``ok(value)``.

    Args:
        name: The field as the user knows it (``"ByteEstimator.bytes_per_token"``).
        ok: The predicate the value must satisfy.
        allowed: What it accepts, completing "must be ..." (``"a number > 0"``).
    """

    def validate(instance: object, attribute: object, value: Any) -> None:
        if not ok(value):
            raise ConfigurationError(f"{name} must be {allowed}, not {wrong_value(value)}")

    return validate


def count(name: str, minimum: int = 0) -> Validator:
    """A configuration validator for an ``int`` (not a ``bool``) >= ``minimum``."""
    return check(name, int_at_least(minimum), f"an int >= {minimum}")


def optional(validator: Validator) -> Validator:
    """``validator``, letting ``None`` through."""

    def validate(instance: object, attribute: object, value: Any) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return validate


def _shown(value: object) -> str:
    """A wrong value as an error message shows it: numbers, bools and ``None`` as they are,
    anything else by its type (a value type's field may hold message content)."""
    if value is None or isinstance(value, (bool, int, float)):
        return safe_repr(value)
    return type(value).__name__


def type_check(name: str, ok: Callable[[Any], bool], allowed: str) -> Validator:
    """A value-type validator: ``TypeError`` unless ``ok(value)`` (arguments as ``check``)."""

    def validate(instance: object, attribute: object, value: Any) -> None:
        if not ok(value):
            raise TypeError(f"{name} must be {allowed}, not {_shown(value)}")

    return validate


def instance_of(name: str, kind: type | tuple[type, ...], allowed: str) -> Validator:
    """A value-type validator: ``TypeError`` unless the value is an instance of ``kind``."""

    def validate(instance: object, attribute: object, value: Any) -> None:
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be {allowed}, not {_shown(value)}")

    return validate


def tuple_of(value: object, name: str, kind: type[T], what: str) -> tuple[T, ...]:
    """``value``, any sequence (but a str, bytes or a mapping, whose keys it would take) of
    ``kind`` values (``what``), as a tuple, for an attrs converter; ``TypeError`` naming
    ``name`` otherwise (by types: values are content)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of {what}, not {type(value).__name__}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{name} must hold {what} values, not {type(item).__name__}")
    return items
