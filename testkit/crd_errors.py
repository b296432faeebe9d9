"""kube-apiserver's field errors for a custom resource it refuses, in its words
(k8s.io/apimachinery/pkg/util/validation/field: ``spec.x: Invalid value: 7: <detail>``),
and its OpenAPI validator's details, for testkit.crd_schema."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import jsonschema  # type: ignore[import-untyped]

# A rule's reason (x-kubernetes-validations[].reason) as the field error type it makes.
REASONS = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
}
# Error types written without the value (k8s.io/apimachinery field.Error.ErrorBody).
WITHOUT_VALUE = {"Forbidden", "Required value", "Too long", "Internal error"}


class FieldError(NamedTuple):
    """One of kube-apiserver's field errors (k8s.io/apimachinery/pkg/util/validation/field)."""

    field: str  # spec.storage.size
    type: str  # "Invalid value", "Required value", ...
    value: Any
    detail: str

    @property
    def body(self) -> str:
        text = self.type if self.type in WITHOUT_VALUE else f"{self.type}: {_shown(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    @property
    def reason(self) -> str:
        """The cause's reason in the Status (``FieldValueInvalid``, ...)."""
        found = [r for r, t in REASONS.items() if t == self.type]
        return found[0] if found else "FieldValueInvalid"


class Invalid(Exception):
    """The object is refused (422 Invalid) for ``errors``."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(map(str, errors)))
        self.errors = errors

    def message(self, kind: str, name: str) -> str:
        """kube-apiserver's: ``<Kind>.<group> "<name>" is invalid: <error>`` (a list in
        brackets for more than one)."""
        errors = [str(e) for e in self.errors]
        listed = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
        return f'{kind} "{name}" is invalid: {listed}'

    def causes(self) -> list[dict[str, str]]:
        return [{"reason": e.reason, "message": e.body, "field": e.field} for e in self.errors]


def _shown(value: Any) -> str:
    """A value as Go's %v/%q shows it in a field error: strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


def field_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "<nil>"  # Go's nil field.Path: a rule on the root


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", dict: "object", list: "array"}
    return names.get(type(value), "null")


def openapi_error(exc: jsonschema.ValidationError) -> FieldError:
    """A jsonschema error in the words kube-apiserver's OpenAPI validator uses."""
    where, value, rule = field_path(exc.absolute_path), exc.instance, exc.validator_value
    if exc.validator == "required":
        missing = [r for r in rule if r not in (value or {})]
        return FieldError(field_path([*exc.absolute_path, missing[0]]), "Required value", None, "")
    if exc.validator == "enum":
        allowed = ", ".join(_shown(v) for v in rule)
        return FieldError(where, "Unsupported value", value, f"supported values: {allowed}")
    details = {
        "type": f"{where} in body must be of type {rule}: {_shown(_json_type(value))}",
        "maximum": f"{where} in body should be less than or equal to {rule}",
        "minimum": f"{where} in body should be greater than or equal to {rule}",
        "pattern": f"{where} in body should match '{rule}'",
        "minLength": f"{where} in body should be at least {rule} chars long",
        "maxLength": f"{where} in body should be at most {rule} chars long",
        "maxItems": f"{where} in body should have at most {rule} items",
    }
    return FieldError(where, "Invalid value", value, details.get(str(exc.validator), exc.message))
