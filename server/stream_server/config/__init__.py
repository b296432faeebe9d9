"""Settings: each one declared once, here, and everything else derived from it.

A setting is a field of ``Settings`` made by ``setting()``: its default, its
group (the concern it belongs to), its help text, its unit and the checks its
value must pass. From that one declaration come the command-line flag
(``--long-poll-timeout``), the environment variable (``DS_LONG_POLL_TIMEOUT``;
flags win), the validation at start (a refusal names the flag and the
variable), ``serve --help`` and the README's table (``python -m stream_server
settings --markdown``; a test keeps the README equal to it). The operator's
defaults and the CRD are checked against these defaults by a test too.

A part receives its group of settings as it is (``declared/groups.py``: the layers
may import it, as it imports nothing of ours); ``Settings`` inherits every group and
declares the settings not yet in one, which the node passes on by name.

Every value is checked when a ``Settings`` is made, and what the settings ask of
this machine when the server starts (``settings_from``: the files they name, the
data directory, the host's address, workers and connections against its CPUs and
open-file limit; a ``Settings`` made for another machine, as the operator's tests
make one, names files that are not here), so
the server stops with exit status 2 before it opens its data directory or a
socket, not later when a value is first used (``checks.py`` says where each
bound comes from).

The package: ``declaration.py`` (``Settings`` and the checks across settings or
layers), ``flags.py`` (flags and variables), ``table.py`` (the
README's table); ``declared/`` holds what a setting is, its checks and the groups.
"""

from stream_server.config.declaration import (
    DEFAULT_PORT,
    SettingError,
    Settings,
    check_on_disk,
    described,
    validate,
)
from stream_server.config.flags import (
    NOT_SETTINGS,
    add_arguments,
    check_environment,
    env_names,
    parse_value,
    settings_from,
    values_from,
)
from stream_server.declared import checks
from stream_server.declared.about import About, Described, Group

__all__ = [
    "DEFAULT_PORT",
    "NOT_SETTINGS",
    "About",
    "Described",
    "Group",
    "SettingError",
    "Settings",
    "add_arguments",
    "check_environment",
    "check_on_disk",
    "checks",
    "described",
    "env_names",
    "parse_value",
    "settings_from",
    "validate",
    "values_from",
]
