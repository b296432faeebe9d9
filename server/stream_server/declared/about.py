"""What a setting is, apart from its value: its group, help, unit and checks.

``setting()`` makes a field of a group class (``groups.py``, ``network.py``);
``describe`` reads the fields of any of them, or of the whole ``Settings``, for the
flags, the variables, the checks and the README's table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import Field, dataclass, field, fields
from enum import Enum
from typing import Any, TypeVar

from stream_server.declared import checks

T = TypeVar("T")


class Group(Enum):
    """The concerns settings are grouped by, in the order --help and the README show them."""

    NETWORK = "Network"
    LIMITS = "Limits"
    STORAGE = "Storage"
    LOGS_AND_METRICS = "Logs and metrics"
    SUBSCRIPTIONS = "Subscriptions (webhooks)"
    RETENTION = "Retention"
    REPLICATION = "Replication"
    ARCHIVE = "Archive (object storage)"


@dataclass(frozen=True)
class About:
    """Everything about one setting but its name, type and default."""

    group: Group
    help: str
    checks: tuple[checks.Check, ...] = ()
    unit: str = ""  # "bytes" or "s": how the README shows the default
    separator: str = ","  # list settings: what separates items in the variable


def setting(default: T, group: Group, help: str, *check: checks.Check, unit: str = "") -> T:
    """A field of ``Settings``: typed as its default, described by ``About``."""
    about = About(group, help, check, unit)
    return field(default=default, metadata={"about": about})


def setting_list(group: Group, help: str, *check: checks.Check, separator: str = ",") -> list[str]:
    """A setting given any number of times (each flag one item; the variable separated)."""
    about = About(group, help, check, separator=separator)
    return field(default_factory=list[str], metadata={"about": about})


@dataclass(frozen=True)
class Described:
    """One setting as the CLI, the environment and the docs see it."""

    name: str
    default: Any
    about: About

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "DS_" + self.name.upper()

    @property
    def is_list(self) -> bool:
        return isinstance(self.default, list)


def describe(settings: Any) -> Iterator[Described]:
    """Every setting of a settings class (or instance), by ``Group`` and in declaration
    order within one: a group class (``groups.py``) a class inherits from comes first
    among its fields, and --help and the README show the groups in ``Group``'s order."""
    order = list(Group)
    found = [Described(f.name, _default(f), f.metadata["about"]) for f in fields(settings)]
    return iter(sorted(found, key=lambda d: order.index(d.about.group)))


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default
