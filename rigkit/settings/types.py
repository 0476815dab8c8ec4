"""Kinds of setting value, each declared once and typed by where the value goes.

A kind is a Variable check (rigkit.settings.variables) that also says what to write instead: ``Variable.coerce`` puts
its ``fix`` in the refusal, so a refusal reads "field=value: what is wrong. Fix: what to write", never the
setting's description again. Every role variable and serving knob uses one (tests/settings/test_setting_types.py
holds every declared variable to it): a URL that reaches an apt source, a Debian version that reaches
``apt-get install pkg=VERSION``, an fstab field, a filesystem label, an address as nft or a listener sees it,
a number with a floor and a ceiling, a JSON object with a schema. Each kind's property test feeds
arbitrary text in and reads what is accepted back with the target's own parser (tests/settings/test_setting_types.py).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

from rigkit.paths import bind_source_problem, device_path_problem, host_path_problem, relative_path_problem
from rigkit.settings.variables import CredentialInValue, check_of, closest_name

# Names of keys that carry a credential, in any structured setting (JSON adapter config, daemon options).
_CREDENTIAL_KEY = re.compile(r"pass(word|wd)?$|secret|token|credential|api[_-]?key|auth|private[_-]?key", re.IGNORECASE)


def _control_character(text: str) -> Optional[str]:
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return f"contains the control or format character {ascii(char)}"
    return None


@dataclass(frozen=True)
class Kind:
    """A kind of value: ``problem(value)`` says why a value is not one (None when it is); ``fix`` says what to
    write instead. Calling it is the Variable check (ValueError with the problem)."""

    fix: str

    def problem(self, value: Any) -> Optional[str]:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def __call__(self, value: Any) -> None:
        reason = self.problem(value)
        if reason:
            raise ValueError(reason)


@dataclass(frozen=True)
class NumberRange(Kind):
    """A number with a floor and a ceiling (both always declared: a timeout of a century or a size past 2^64,
    which a server reads as "no limit", is as wrong as a negative one). ``off``: a value below the floor that
    means "off" (0)."""

    floor: float = 0
    ceiling: float = 0
    unit: str = ""
    off: Optional[int] = None
    fix: str = ""

    def problem(self, value: Any) -> Optional[str]:
        if self.off is not None and value == self.off:
            return None
        if self.floor <= value <= self.ceiling:
            return None
        unit = f" {self.unit}" if self.unit else ""
        off = f" (or {self.off}: off)" if self.off is not None else ""
        return f"must be between {self.floor} and {self.ceiling}{unit}{off}"

    def __post_init__(self) -> None:
        if not self.fix:
            unit = f" {self.unit}" if self.unit else ""
            off = f", or {self.off} for off" if self.off is not None else ""
            object.__setattr__(self, "fix", f"write a number from {self.floor} to {self.ceiling}{unit}{off}")


def between(floor: float, ceiling: float, unit: str = "", off: Optional[int] = None) -> NumberRange:
    return NumberRange(floor=floor, ceiling=ceiling, unit=unit, off=off)


@dataclass(frozen=True)
class IntegersBetween(Kind):
    """Integers (rigkit.settings.variables.IntegerList), each with a floor and a ceiling; none at all is legal
    (the setting is then off). ``example``: what the fix suggests writing."""

    floor: int = 0
    ceiling: int = 0
    unit: str = ""
    example: str = ""
    fix: str = ""

    def problem(self, value: Any) -> Optional[str]:
        outside = [item for item in value if not self.floor <= item <= self.ceiling]
        if not outside:
            return None
        unit = f" {self.unit}" if self.unit else ""
        return f"{', '.join(f'{item:,}' for item in outside)} not between {self.floor:,} and {self.ceiling:,}{unit}"

    def __post_init__(self) -> None:
        if not self.fix:
            unit = f" {self.unit}" if self.unit else ""
            example = f", e.g. {self.example}" if self.example else ""
            object.__setattr__(
                self,
                "fix",
                f"write integers from {self.floor} to {self.ceiling}{unit} separated by commas{example}, "
                "or nothing for none",
            )


# Schemes a URL setting may use, by where it goes. Package repositories: https, so nobody on the path can hold a
# rig back on old packages (apt checks signatures, not freshness); http only with package_repos_allow_http.
PACKAGE_REPOSITORY_SCHEMES = ("https", "http")
SECURE_SCHEMES = ("https",)


@dataclass(frozen=True)
class Url(Kind):
    """An absolute URL of ``schemes``, one token (an apt sources line or a command argument): no whitespace or
    control character (a newline would write a second ``deb`` line), no credentials (a world-readable sources
    file and ``ps`` would show them: put them in apt's auth.conf), no query or fragment."""

    schemes: tuple = SECURE_SCHEMES
    fix: str = "write an https:// URL such as https://download.docker.com/linux"

    def problem(self, value: Any) -> Optional[str]:
        bad = _control_character(value)
        if bad:
            return bad
        if any(char.isspace() for char in value):
            return "contains whitespace: a URL is one token on an apt sources line"
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError as exc:
            return f"is not a URL ({exc})"
        if parts.scheme not in self.schemes or not value.startswith(f"{parts.scheme}://"):
            return f"scheme {value.partition(':')[0]!r} is not one of {', '.join(self.schemes)} (lowercase, then ://)"
        if not parts.hostname:
            return "names no host"
        host = parts.hostname
        if not (_HOST_NAME.fullmatch(host) and not re.fullmatch(r"[0-9.]+", host)) and address_problem(host):
            return f"host {host!r} is not a DNS name or an IP address"
        if parts.username is not None or parts.password is not None:
            return "carries credentials (user:password@): they would be readable in the rig's apt sources and ps"
        if parts.query or parts.fragment or value.endswith(("?", "#")):
            return "has a query or fragment, which a repository base URL never has"
        if port == 0:
            return "names port 0"
        if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", parts.netloc):
            return f"host {parts.netloc!r} is not a DNS name or an IP address"
        if not re.fullmatch(r"[A-Za-z0-9._~/\-+%]*", parts.path):
            return f"path {parts.path!r} holds a character apt would not take as written"
        return None


# deb-version(7): [epoch:]upstream_version[-debian_revision]; upstream starts with a digit.
_DEBIAN_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~]*(?:-[A-Za-z0-9.+~]+)*")


@dataclass(frozen=True)
class DebianVersion(Kind):
    """An exact Debian package version, as ``apt-cache policy`` lists it (deb-version(7)); dpkg's own
    ``--validate-version`` agrees with it on every accepted value (tests/settings/test_setting_types.py)."""

    fix: str = "write the version exactly as `apt-cache policy PACKAGE` lists it, e.g. 5:27.5.1-1~debian.12~bookworm"

    def problem(self, value: Any) -> Optional[str]:
        if not _DEBIAN_VERSION.fullmatch(value):
            return (
                "is not a Debian version ([epoch:]upstream[-revision]: starts with a digit; letters, digits "
                "and . + ~ -)"
            )
        return None


@dataclass(frozen=True)
class Release(Kind):
    """A pinned release number: 0.1.17 (two to four dot-separated numbers)."""

    fix: str = "write an exact release such as 0.1.17"

    def problem(self, value: Any) -> Optional[str]:
        if not re.fullmatch(r"[0-9]+(\.[0-9]+){1,3}", value):
            return "is not a release number (digits and dots, e.g. 0.1.17)"
        return None


@dataclass(frozen=True)
class FstabSource(Kind):
    """The first field of an /etc/fstab line naming what is mounted (an NFS export, a device): getmntent
    splits on blanks, takes '#' at a line's start as a comment and a NUL ends the C string, and two spellings
    of one export would make two stores, so the field is kept plain."""

    fix: str = "write the export as SERVER:/EXPORT with no blanks, e.g. nas:/export/rigkit-kv"

    def problem(self, value: Any) -> Optional[str]:
        bad = _control_character(value)
        if bad:
            return bad
        if any(char.isspace() for char in value):
            return "contains whitespace: fstab splits its fields on blanks"
        if value.startswith("#"):
            return "starts with '#': fstab would read the whole line as a comment"
        if "\\" in value:
            return "contains a backslash, which getmntent reads as the start of an octal escape"
        if "$" in value:
            return "contains '$', which systemd's mount units and shells expand"
        if not value.isascii():
            return "contains a non-ASCII character, which NFS servers name no export with"
        return None


# Longest label, in bytes, each filesystem's mkfs keeps (mkfs.ext4 -L cuts past 16, mkfs.xfs -L refuses past 12).
LABEL_LIMITS = {"ext4": 16, "xfs": 12}


def label_problem(label: str, fstype: str) -> Optional[str]:
    """Why ``label`` cannot label an ``fstype`` filesystem as written (it would be cut or refused), or None."""
    limit = LABEL_LIMITS[fstype]
    if not re.fullmatch(r"[A-Za-z0-9._-]+", label):
        return "holds a character other than letters, digits, '.', '_' or '-' (udev mangles it in /dev/disk/by-label)"
    if len(label.encode()) > limit:
        return f"is {len(label.encode())} bytes: {fstype} keeps at most {limit}, so mkfs would cut it"
    return None


@dataclass(frozen=True)
class FsLabel(Kind):
    """A filesystem label; its length limit depends on the filesystem (checked with it: label_problem)."""

    fix: str = f"write letters, digits, '.', '_' or '-', at most {min(LABEL_LIMITS.values())} characters (xfs)"

    def problem(self, value: Any) -> Optional[str]:
        return label_problem(value, max(LABEL_LIMITS, key=LABEL_LIMITS.get))


def address_problem(text: str) -> Optional[str]:
    """Why ``text`` is not one IP address as a listener, a URL and nft on the target all see it, or None."""
    if "%" in text:
        return (
            "has a zone id ('%...'): nft matches addresses without one, and a URL cannot carry it unescaped; "
            "write the address alone"
        )
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return "is not an IP address"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return (
            f"is an IPv4-mapped IPv6 address: packets from that host arrive as IPv4, so an nft rule on it never "
            f"matches; write {address.ipv4_mapped}"
        )
    return None  # ipaddress reads IPv4 only as four plain decimal parts (no leading zero): nothing to rewrite


@dataclass(frozen=True)
class IpAddress(Kind):
    fix: str = "write one IP address such as 10.0.0.5, 127.0.0.1 or fd00::5 (0.0.0.0 or :: for every interface)"

    def problem(self, value: Any) -> Optional[str]:
        return address_problem(value)


def network_problem(text: str) -> Optional[str]:
    """Why ``text`` is not an address or CIDR network that an nft set on the target matches, or None."""
    address = text.split("/", 1)[0]
    problem = address_problem(address)
    if problem and "not an IP address" not in problem:
        return problem
    return None


# A DNS host name (RFC 1123 labels), as a URL's host.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")


@dataclass(frozen=True)
class HostAddress(Kind):
    """An address or DNS name that goes into a URL (http://HOST:PORT/): nothing a URL would read as more."""

    fix: str = "write an IP address (10.0.0.5, fd00::5) or a host name (rig-a.lan), nothing else"

    def problem(self, value: Any) -> Optional[str]:
        if _HOST_NAME.fullmatch(value) and not re.fullmatch(r"[0-9.]+", value):
            return None
        return address_problem(value)


@dataclass(frozen=True)
class UrlOrDirectory(Kind):
    """A URL of ``schemes`` or an absolute directory (pip's --find-links takes either)."""

    schemes: tuple = SECURE_SCHEMES
    fix: str = "write an https:// URL or an absolute directory such as /srv/wheels"

    def problem(self, value: Any) -> Optional[str]:
        if value.startswith("/"):
            bad = _control_character(value)
            if bad:
                return bad
            if any(char.isspace() for char in value) or "$" in value:
                return "contains whitespace or '$'"
            return None
        return Url(schemes=self.schemes).problem(value)


# --- JSON objects with a schema ---------------------------------------------------------------------------


def credential_keys(value: Any, path: str = "") -> list[str]:
    """Paths (a.b.c) of keys in a parsed JSON value whose names say they hold a credential."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if _CREDENTIAL_KEY.search(str(key)) and item not in (None, "", False):
                found.append(where)
            found += credential_keys(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += credential_keys(item, f"{path}[{index}]")
    return found


def refuse_credentials(value: Any, where: str, instead: str = "") -> None:
    """CredentialInValue (the refusal then shows the value redacted) when a parsed JSON value holds a credential."""
    found = credential_keys(value)
    if found:
        raise CredentialInValue(f"holds a credential at {found[0]}: it would be readable in {where}{instead}")


@dataclass(frozen=True)
class JsonSchema(Kind):
    """A JSON object with known keys: ``keys`` maps each to its JSON type (a Python type or a tuple of them);
    ``owned`` maps keys another setting of rigkit's owns to that setting (a value here would undo it)."""

    keys: Mapping[str, Any] = field(default_factory=dict)
    owned: Mapping[str, str] = field(default_factory=dict)
    fix: str = ""

    def problem(self, value: Any) -> Optional[str]:
        for key, item in value.items():
            if key in self.owned:
                return f"sets {key!r}, which {self.owned[key]} manages: set that instead"
            if key not in self.keys:
                near = closest_name(key, self.keys)
                return f"has the unknown key {key!r}" + (f" (did you mean {near!r}?)" if near else "")
            expected = self.keys[key]
            # a JSON true is a Python int too: only a boolean key takes one
            if not isinstance(item, expected) or (isinstance(item, bool) and expected is not bool):
                return f"{key!r} must be {_json_type_name(expected)}, got {type(item).__name__} {item!r}"
        return None

    def __call__(self, value: Any) -> None:
        refuse_credentials(value, "a world-readable file")
        super().__call__(value)


def _json_type_name(expected: Any) -> str:
    names = {
        str: "a string",
        int: "an integer",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
        float: "a number",
    }
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(names.get(kind, kind.__name__) for kind in kinds)


# Docker 27/28 daemon.json keys users set (dockerd(8) "Daemon configuration file"), with their JSON types.
DOCKER_DAEMON_KEYS: dict[str, Any] = {
    "log-driver": str,
    "log-opts": dict,
    "log-level": str,
    "data-root": str,
    "storage-driver": str,
    "storage-opts": list,
    "exec-opts": list,
    "dns": list,
    "dns-opts": list,
    "dns-search": list,
    "registry-mirrors": list,
    "insecure-registries": list,
    "max-concurrent-downloads": int,
    "max-concurrent-uploads": int,
    "max-download-attempts": int,
    "live-restore": bool,
    "bridge": str,
    "bip": str,
    "default-address-pools": list,
    "ipv6": bool,
    "fixed-cidr-v6": str,
    "iptables": bool,
    "ip6tables": bool,
    "ip-forward": bool,
    "ip-masq": bool,
    "mtu": int,
    "default-ulimits": dict,
    "default-shm-size": str,
    "shutdown-timeout": int,
    "features": dict,
    "builder": dict,
    "experimental": bool,
    "metrics-addr": str,
    "userland-proxy": bool,
    "default-cgroupns-mode": str,
    "cgroup-parent": str,
    "labels": list,
    "debug": bool,
    "containerd": str,
    "oom-score-adjust": int,
    "icc": bool,
    "no-new-privileges": bool,
    "init": bool,
    "userns-remap": str,
    "seccomp-profile": str,
    "selinux-enabled": bool,
}
DOCKER_DAEMON_OWNED = {
    "runtimes": "the nvidia_container_toolkit role (nvidia-ctk runtime configure)",
    "default-runtime": "nvidia_ctk_default_runtime",
    "hosts": "the engine's systemd unit (-H fd://: dockerd refuses to start with both)",
}
DOCKER_DAEMON_OPTIONS = JsonSchema(
    keys=DOCKER_DAEMON_KEYS,
    owned=DOCKER_DAEMON_OWNED,
    fix='use daemon.json keys with their JSON types, e.g. {"log-driver": "json-file", "log-opts": '
    '{"max-size": "100m"}}; leave runtimes and default-runtime to the NVIDIA toolkit settings',
)


@dataclass(frozen=True)
class ControllerPath(Kind):
    """A path on the controller (a results directory): any file name, but one line of text."""

    fix: str = "write the directory's path, e.g. results/20260101-120000"

    def problem(self, value: Any) -> Optional[str]:
        return _control_character(value)


@dataclass(frozen=True)
class SecretText(Kind):
    """A credential sent as one token (a header, a file's one line): no whitespace or control character."""

    fix: str = "export it on the controller (RIGKIT_<NAME>) as one token without blanks or control characters"

    def problem(self, value: Any) -> Optional[str]:
        if _control_character(value) or any(char.isspace() for char in value):
            return "holds a blank, a newline or another control character"
        return None


def plain_http_problem(url: str) -> Optional[str]:
    """Why a package repository URL needs package_repos_allow_http (plain http to another host), or None."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return None
    host = parts.hostname or ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        if host == "localhost":
            return None
    return (
        "is plain http to another host: apt and pip check what they get, not that it is current, so anyone "
        "on the path can hold the rig on old packages"
    )


# --- host paths (rigkit.paths says what one may be) and the L2 disk's fstab fields (rigkit.disk writes them) ---

check_host_path = check_of(host_path_problem, "write an absolute, normalised directory of its own, e.g. /mnt/rigkit-l2")

check_bind_source = check_of(
    bind_source_problem, "write an absolute, normalised directory of its own without ':', e.g. /mnt/rigkit-l2"
)

check_relative_path = check_of(relative_path_problem, "write a relative directory name such as lmcache")

check_device_path = check_of(device_path_problem, "write the device as a /dev/disk/by-id/ path")

# A mount option: a flag (noatime) or key=value (commit=60, context="system_u:object_r:x:s0").
_MOUNT_OPTION = re.compile(r"[A-Za-z0-9_.:+\-=/\"@]+")
# A user or group chown takes: the shadow-utils name rule (NAME_REGEX) or a numeric id.
_ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}|[0-9]+")


def mount_options_problem(options: str) -> Optional[str]:
    """Why ``options`` cannot be an fstab options field, or None."""
    if any(char in options for char in "\n\r"):
        return "contains a newline, which would start another fstab line"
    items = options.split(",")
    if not options or "" in items:
        return "must be options separated by single commas, e.g. noatime,nofail"
    for item in items:
        if not _MOUNT_OPTION.fullmatch(item):
            return f"option {item!r} has a blank, control or shell character (an option is a flag or key=value)"
    return None


check_mount_options = check_of(mount_options_problem, "write options separated by single commas, e.g. noatime,nofail")


def check_account_name(name: str) -> None:
    """Variable check for a user or group that owns the L2 directories (ValueError with the reason)."""
    if not _ACCOUNT_NAME.fullmatch(name):
        raise ValueError(
            "must be a user or group name (lowercase letters, digits, '_', '-'; at most 32) or a numeric id"
        )


check_account_name.fix = "write a user or group name such as root or rigkit, or a numeric id"
