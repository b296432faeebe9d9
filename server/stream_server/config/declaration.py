"""The server's ``Settings``: every group of the declaration (``declared/``) in one
object, the settings not yet in a group, and the checks made when one is built.

A part receives its group (``declared/groups.py``, ``declared/network.py``): the
object is one of each. A new concern is a new ``Group`` and a group class there.

Every value passes its own checks (``declared/checks.py``), then the ones across
settings or that need a layer's parser (imported late, so that importing the
settings imports no layer); the files they name are checked at start only
(``check_on_disk``). A refusal names the setting's flag and variable, so that a bad
value stops the server with a message saying which setting to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stream_server.declared import checks
from stream_server.declared.about import Described, Group, describe, setting_list
from stream_server.declared.groups import ArchiveSettings, ReplicationSettings, SubscriptionSettings
from stream_server.declared.network import DEFAULT_PORT, ProtocolSettings

__all__ = ["DEFAULT_PORT", "SettingError", "Settings", "check_on_disk", "described", "validate"]


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


class SettingError(ValueError):
    """A value a setting may not have; the message names the flag and the variable."""


def validate(s: Settings) -> None:
    """Every setting's own checks, then the ones that look at several together; not
    the files they name (``check_on_disk``)."""
    _each(s, lambda check: check not in checks.ON_DISK)
    for problem in _together(s):
        if problem is not None:
            raise SettingError(name_settings(problem, describe(s)))


def check_on_disk(s: Settings) -> None:
    """The files the settings name: there, readable, and holding what they should."""
    _each(s, lambda check: check in checks.ON_DISK)
    problem = checks.tls_loads(s.tls_cert, s.tls_key)
    if problem is not None:
        raise SettingError(name_settings(problem, describe(s)))


def _each(s: Settings, which: Callable[[checks.Check], bool]) -> None:
    for d in describe(s):
        value = getattr(s, d.name)
        for check in filter(which, d.about.checks):
            problem = check(value)
            if problem is not None:
                given = str(value) if isinstance(value, Path) else value
                raise SettingError(f"{d.flag} {problem} (env {d.env}; given {given!r})")


def _together(s: Settings) -> Iterator[str | None]:
    """The checks across settings, or that need another layer's parser (imported here,
    so that importing the settings imports no layer); the first that fails stops the rest."""
    from stream_server.replication.settings import check_settings
    from stream_server.subscriptions.urls import WebhookAllowList

    yield checks.tls_pair(s.tls_cert, s.tls_key)
    yield _retention_rules(s.retention, s.max_path_bytes)
    yield _refusal(lambda: WebhookAllowList.from_settings(s.webhook_allow), "webhook-allow: ")
    yield _refusal(lambda: check_settings(s))
    yield checks.archive_follow(s.archive_follow, s.archive_url, s.replication_lease)


def _refusal(check: Callable[[], object], prefix: str = "") -> str | None:
    try:
        check()
    except ValueError as exc:
        return prefix + str(exc)
    return None


_WORD = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def name_settings(message: str, settings: Iterable[Described]) -> str:
    """``message`` (from a check that names settings by their flag, without the dashes)
    with the first setting it names given as a flag, and their variables added."""
    known = {d.flag[2:]: d for d in settings}
    # Single words ("host", "port") are settings only first: elsewhere they are English.
    found = _WORD.findall(message)
    words = [w for i, w in enumerate(found) if w in known and ("-" in w or i == 0)]
    if not words:
        return message
    if message.startswith(words[0]):
        message = "--" + message
    envs = ", ".join(dict.fromkeys(known[w].env for w in words))
    return f"{message} (env {envs})"


def _retention_rules(rules: Iterable[str], max_path_bytes: int) -> str | None:
    """ValueError-free words for the first rule that can never take effect: its prefix
    names no stream a request can create, or its size or age overflows."""
    from stream_server.streams.retention import parse_policies  # a layer: imported late

    try:
        policies = parse_policies(rules)
    except ValueError as exc:
        return str(exc)
    for p in policies:
        problem = _never_matches(p.prefix, max_path_bytes)
        if problem is not None:
            return f"retention prefix {p.prefix!r} can never match: {problem}"
        if p.max_bytes is not None and p.max_bytes > checks.INT_MAX:
            return f"retention {p.prefix!r}: max-bytes must be at most {checks.INT_MAX}"
        if p.max_age is not None and p.max_age > checks.MAX_SECONDS:
            return f"retention {p.prefix!r}: max-age must be at most {checks.MAX_SECONDS:g} seconds"
    return None


def _never_matches(prefix: str, max_path_bytes: int) -> str | None:
    """Why no stream path (protocol/paths.py) can start with ``prefix``, or None."""
    from stream_server.protocol.paths import RESERVED_SEGMENT

    # Only whole segments (followed by "/") are known: "lo" may still match "logs".
    whole_segments = prefix.split("/")[:-1]
    if any(s in ("", ".", "..") for s in whole_segments):
        return "stream paths have no empty, '.' or '..' segment"
    if whole_segments and whole_segments[0] == RESERVED_SEGMENT:
        return f"{RESERVED_SEGMENT}/ is reserved"
    if any(c < " " or c in "\x7f\\" for c in prefix):
        return "stream paths hold no control characters or backslashes"
    if len(prefix.encode()) > max_path_bytes:
        return "it is longer than --max-path-bytes"
    return None
