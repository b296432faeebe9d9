"""The server's ``Settings``: every group of the declaration (``declared/``) in one
object, the settings not yet in a group, and the checks made when one is built.

A part receives its group (``declared/groups.py``, ``declared/network.py``): the
object is one of each. A new concern is a new ``Group`` and a group class there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stream_server.config.validation import validate
from stream_server.declared.about import Described, Group, describe, setting_list
from stream_server.declared.groups import ArchiveSettings, ReplicationSettings, SubscriptionSettings
from stream_server.declared.network import DEFAULT_PORT, ProtocolSettings

__all__ = ["DEFAULT_PORT", "Settings", "described"]


@dataclass
class Settings(ProtocolSettings, SubscriptionSettings, ReplicationSettings, ArchiveSettings):
    """Every setting; ``describe`` shows them by ``Group``, whichever class declares one."""

    # -- Retention: bounded disk for streams that run forever (docs/retention.md).
    retention: list[str] = setting_list(  # noqa: RUF009 - a field(default_factory=list)
        Group.RETENTION,
        "PREFIX:RULES dropping old data of the streams under PREFIX (relative to the base path; "
        "longest prefix wins), RULES comma-separated max-bytes=SIZE (512KiB, 10MiB, 10GiB) and "
        "max-age=DURATION (30s, 15m, 12h, 7d), e.g. 'logs/:max-bytes=10GiB,max-age=7d'; repeat the"
        " flag",
        separator=";",
    )

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.base_path.startswith("/"):
            self.base_path = "/" + self.base_path
        if not self.base_path.endswith("/"):
            self.base_path += "/"
        validate(self)


def described() -> Iterator[Described]:
    """Every setting, by group (``Group``'s order) and in declaration order within one."""
    return describe(Settings)
