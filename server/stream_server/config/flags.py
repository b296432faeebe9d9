"""Flags and ``DS_*`` variables: how a setting is given (flags win over variables)."""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream_server.config.declaration import SettingError, Settings, check_on_disk, described
from stream_server.declared.about import Described, Group


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """A flag per setting (``only``: just these), in groups, each saying its variable and
    default. Flags default to None, so that ``settings_from`` can tell one given."""
    groups: dict[Group, argparse._ArgumentGroup] = {}
    for d in described():
        if only and d.name not in only:
            continue
        if d.about.group not in groups:
            groups[d.about.group] = parser.add_argument_group(d.about.group.value)
        target = groups[d.about.group]
        if d.is_list:
            sep = "semicolon" if d.about.separator == ";" else "comma"
            target.add_argument(
                d.flag,
                dest=d.name,
                action="append",
                help=f"{d.about.help} [env {d.env}, {sep}-separated; default none]",
            )
        else:
            target.add_argument(
                d.flag,
                dest=d.name,
                metavar=_metavar(d),
                help=f"{d.about.help} [env {d.env}; default {d.default}]",
            )


def _metavar(d: Described) -> str:
    """What the flag takes, in a word: BYTES, SECONDS, N, ... (else the setting's name)."""
    by_unit = {"bytes": "BYTES", "s": "SECONDS"}
    by_type = {bool: "BOOL", int: "N", float: "NUMBER"}
    return by_unit.get(d.about.unit) or by_type.get(type(d.default)) or d.name.upper()


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: _parse_bool,
    int: int,
    float: float,
    str: str,
}


def _split_list(raw: str | list[str], sep: str = ",") -> list[str]:
    items = [raw] if isinstance(raw, str) else raw
    return [part.strip() for item in items for part in item.split(sep) if part.strip()]


def parse_value(d: Described, raw: str | list[str]) -> Any:
    """A flag's or a variable's text as the setting's type; SettingError naming it."""
    if d.is_list:
        return _split_list(raw, d.about.separator)
    assert isinstance(raw, str)
    parse = _PARSERS.get(type(d.default), Path)
    try:
        return parse(raw)
    except ValueError:
        kind = {bool: "true or false", int: "a whole number", float: "a number"}
        expected = kind.get(type(d.default), "a value")
        raise SettingError(f"{d.flag} must be {expected} (env {d.env}; given {raw!r})") from None


# DS_* variables that are not settings: fault injection for the crash tests.
NOT_SETTINGS = frozenset({"DS_FAULT"})
# DS_* prefixes another program owns: the operator's settings, which a shell or
# a test runner may export next to the server's.
NOT_SETTINGS_PREFIXES = ("DS_OPERATOR_",)


def env_names() -> dict[str, str]:
    """Every setting's environment variable, mapped to its field name."""
    return {d.env: d.name for d in described()}


def check_environment(environ: dict[str, str]) -> None:
    """Refuse a ``DS_*`` variable that names no setting: a typo would otherwise be
    ignored in silence, and the server would run with a default the user did not want."""
    known = env_names()
    for name in sorted(environ):
        if (
            name.startswith("DS_")
            and name not in known
            and name not in NOT_SETTINGS
            and not name.startswith(NOT_SETTINGS_PREFIXES)
        ):
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SettingError(
                f"unknown setting {name}{hint}; `durable-streams-server serve --help` lists them"
            )


def values_from(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, Any]:
    """Each setting given, by flag or else by ``DS_<NAME>``, as its type (unchecked)."""
    check_environment(environ)
    values: dict[str, Any] = {}
    for d in described():
        raw = getattr(args, d.name, None)
        if raw is None:
            raw = environ.get(d.env)
        if raw is not None:
            values[d.name] = parse_value(d, raw)
    return values


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    """The settings to start with: flag, else ``DS_<NAME>`` from the environment, else
    default; every value checked, and the files named (SettingError naming the setting)."""
    settings = Settings(**values_from(args, dict(os.environ) if environ is None else environ))
    check_on_disk(settings)
    return settings
