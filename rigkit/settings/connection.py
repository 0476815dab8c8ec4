"""The inventory's connection data rigkit reads itself, typed like every setting.

pyinfra's SSH connector reads ``ssh_*`` keys; rigkit reads some of them too (the API tunnel, the model stager's
rig-to-rig ``ssh``, Prometheus targets, the firewalls' sources), so each is checked once per host before any host
is touched, with the same kinds the settings use: an ``ssh_port`` of ``'22; x'`` or an ``ssh_hostname`` with a
space would otherwise reach ``int()`` deep in a tunnel or become a Prometheus target.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from rigkit.errors import ConfigError
from rigkit.remote.tunnel import STRICT_HOST_KEY_DEFAULT
from rigkit.settings.knobs import check_port
from rigkit.settings.types import ControllerPath, HostAddress, SecretText
from rigkit.settings.variables import Variable, check_of, one_of

# What pyinfra 3's SSH connector takes (sshuserclient.client.get_missing_host_key_policy raises on anything else);
# "accept-new" is its default. rigkit's own connections (rigkit.remote.tunnel) read them the same way.
STRICT_HOST_KEY_CHECKING = ("accept-new", "yes", "no", "off", "ask")
# ssh(1) and useradd take a user name that starts with a letter or '_' (a leading '-' would be an ssh option).
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _user_problem(value: str) -> str | None:
    if not _USER_NAME.fullmatch(value):
        return "is not a user name (a letter or '_', then letters, digits, '_', '.', '-'; at most 32)"
    return None


def _strict_host_key_checking(value: str) -> None:
    one_of(STRICT_HOST_KEY_CHECKING)(value)


_strict_host_key_checking.fix = (
    "write one of " + ", ".join(STRICT_HOST_KEY_CHECKING) + " as text (in quotes: YAML reads a bare yes or on "
    "as a boolean)"
)

CONNECTION_VARIABLES: list[Variable] = [
    Variable("ssh_hostname", None, "address pyinfra and rigkit reach the host at", str, HostAddress()),
    Variable("ssh_port", 22, "the host's SSH port", int, check_port),
    Variable(
        "ssh_user",
        None,
        "the user pyinfra and rigkit log in as",
        str,
        check_of(_user_problem, "write a user name such as root or deploy"),
    ),
    Variable("ssh_key", None, "private key file on the controller", str, ControllerPath()),
    Variable("ssh_known_hosts_file", None, "known_hosts file on the controller", str, ControllerPath()),
    Variable(
        "ssh_strict_host_key_checking",
        STRICT_HOST_KEY_DEFAULT,
        "what an unknown host key does (pyinfra's values)",
        str,
        _strict_host_key_checking,
    ),
    Variable("ssh_password", None, "the user's password", str, SecretText(), secret=True),
    Variable("ssh_key_password", None, "the key's passphrase", str, SecretText(), secret=True),
    Variable("ssh_allow_agent", True, "use the controller's ssh-agent", bool),
    Variable("ssh_look_for_keys", True, "try ~/.ssh/id_* keys", bool),
]
CONNECTION_VARIABLES_BY_NAME = {variable.name: variable for variable in CONNECTION_VARIABLES}


def connection_values(data: Mapping[str, Any], host: str = "") -> dict[str, Any]:
    """The connection keys ``data`` sets, typed; ConfigError naming ``host.key`` (or the key alone) otherwise.
    A boolean where pyinfra wants a word (YAML's ``on``, ``--data ssh_strict_host_key_checking=true``) is refused:
    pyinfra would stop on it at connect time, and no reading of it as "yes" is safe to guess."""
    found = {}
    for name, variable in CONNECTION_VARIABLES_BY_NAME.items():
        if name not in data or data[name] is None:
            continue
        value = data[name]
        field = f"{host}.{name}" if host else name
        if variable.type is str and isinstance(value, bool):
            raise ConfigError(
                field,
                value,
                "a boolean where text is wanted (YAML reads a bare yes, no, on or off as one)",
                variable._fix("text"),
            )
        try:
            found[name] = variable.coerce(value)
        except ConfigError as exc:
            raise ConfigError(field, exc.value, exc.problem, exc.fix) from None
    return found
