"""The CEL of a CRD's ``x-kubernetes-validations``, as kube-apiserver evaluates it.

The expressions are parsed and run by cel-python (``celpy``), the language's Python
implementation; this module adds what Kubernetes adds to the language for CRD rules
and what the chart's rules call: the ``quantity`` library (``quantity()``,
``isQuantity()`` and a quantity's ``compareTo``, ``isLessThan``, ``isGreaterThan``,
``asInteger``, ``asApproximateFloat``, ``sign``, ``isInteger``, ``add``, ``sub``),
with quantities parsed by the Kubernetes Python client's ``parse_quantity``
(https://kubernetes.io/docs/reference/using-api/cel/#kubernetes-quantity-library).
``size()``, ``matches()`` (RE2), ``has()`` and the logic operators, whose errors are
absorbed as CEL's commutative ``||`` and ``&&`` absorb them, are celpy's own.

A rule's outcome is ``Outcome``: passed, refused (the message, or the result of its
``messageExpression``), or an evaluation error (a missing key, a malformed quantity),
which kube-apiserver reports as ``<error> evaluating rule: <rule>``.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
import typing
from typing import Any, NamedTuple

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError


def parse_quantity(text: str) -> decimal.Decimal:
    """The client's parser, imported at the first quantity: importing ``kubernetes``
    imports its whole generated client (0.4 s of CPU), which an emulator that serves
    only Leases and pods (a replica set's, started for most process tests) never needs."""
    from kubernetes.utils import parse_quantity as parse

    return typing.cast(decimal.Decimal, parse(text))  # type: ignore[no-untyped-call]


class Quantity(celtypes.StringType):
    """A Kubernetes resource quantity as a CEL value (Kubernetes' ``Quantity`` type):
    the string it was written as, with its exact decimal value."""

    value: decimal.Decimal

    def __new__(cls, text: str) -> Quantity:
        obj = typing.cast(Quantity, super().__new__(cls, text))
        obj.value = parse_quantity(str(text))
        return obj


def _quantity(text: celtypes.StringType) -> Quantity:
    try:
        return Quantity(str(text))
    except ValueError as exc:
        raise CELEvalError(f"invalid quantity: {text}: {exc}") from None


def _is_quantity(text: celtypes.StringType) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _cmp(a: Quantity, b: Quantity) -> int:
    return (a.value > b.value) - (a.value < b.value)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value != q.value.to_integral_value():
        raise CELEvalError(f"cannot convert {q} to an integer: it has a fraction")
    return celtypes.IntType(int(q.value))


def _sum(q: Quantity, other: Any, sign: int) -> Quantity:
    right = other.value if isinstance(other, Quantity) else decimal.Decimal(int(other))
    return Quantity(str(q.value + sign * right))


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "isInteger": lambda q: celtypes.BoolType(q.value == q.value.to_integral_value()),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "add": lambda q, other: _sum(q, other, 1),
    "sub": lambda q, other: _sum(q, other, -1),
}


class Outcome(NamedTuple):
    """One rule's result: ``passed``, else ``message`` says why (or ``error`` is set:
    the rule could not be evaluated)."""

    passed: bool
    message: str = ""
    error: bool = False


_MISSING = re.compile(r"no such member in mapping: '([^']*)'")


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=FUNCTIONS)


def _run(expression: str, self: Any, old: Any, transition: bool) -> Any:
    activation = {"self": json_to_cel(self)}
    if transition:
        activation["oldSelf"] = json_to_cel(old)
    return _program(expression).evaluate(activation)


def uses_old_self(rule: dict[str, Any]) -> bool:
    """Whether ``rule`` is a transition rule (kube-apiserver looks for ``oldSelf`` in
    the compiled rule; a name in the text is the same test for these rules)."""
    return "oldSelf" in str(rule["rule"])


def evaluate(rule: dict[str, Any], self: Any, old: Any = None) -> Outcome:
    """One ``x-kubernetes-validations`` entry against ``self`` (and ``oldSelf``: the
    stored value, for a transition rule on an update). A rule's outcome depends on
    nothing else, and celpy interprets slowly (tens of milliseconds for the chart's
    rules on each write), so outcomes are kept by rule and values."""
    key = json.dumps([rule, self, old if uses_old_self(rule) else None], sort_keys=True)
    return _evaluate(key)


@functools.lru_cache(maxsize=4096)
def _evaluate(key: str) -> Outcome:
    rule, self, old = json.loads(key)
    transition = uses_old_self(rule)
    try:
        result = _run(str(rule["rule"]), self, old, transition)
    except CELEvalError as exc:
        # celpy's words for a missing field, in cel-go's (what kube-apiserver reports).
        text = _MISSING.sub(r"no such key: \1", str(exc.args[0]))
        return Outcome(False, f"{text} evaluating rule: {rule['rule']}", error=True)
    if not isinstance(result, celtypes.BoolType):
        return Outcome(False, f"rule did not evaluate to a bool: {rule['rule']}", error=True)
    if result:
        return Outcome(True)
    return Outcome(False, _message(rule, self, old, transition))


def _message(rule: dict[str, Any], self: Any, old: Any, transition: bool) -> str:
    """The refusal's text: ``messageExpression``'s string when it gives a non-empty one
    (kube-apiserver falls back to ``message`` otherwise), then ``message``, then
    ``failed rule: <rule>``."""
    expression = rule.get("messageExpression")
    if expression:
        try:
            text = _run(str(expression), self, old, transition)
        except CELEvalError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return str(text)
    return str(rule.get("message") or f"failed rule: {rule['rule']}")
