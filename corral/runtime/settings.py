"""Every role's settings as one typed model, read from flags and environment
variables of the same name (flags win over the environment, the environment
over the default).

A role's model extends `ProcessSettings` (or `ServerSettings`) with only its
own fields; each field carries its default, its description and its
validation as pydantic field constraints, so the model is the one definition
of a setting: the flag parser, the environment reader and the configuration
reference in docs/operations.md (scripts/gen_config_docs.py) are all derived
from it.

Names follow one convention, with `Option` for the historical exceptions:

* flag: `--` + the field name with dashes (`nack_timeout` → `--nack-timeout`);
* environment: the model's prefix (`CORRAL_<ROLE>_`) + the field name in
  capitals (`CORRAL_BROKER_NACK_TIMEOUT`).

A field whose type is a `SettingsGroup` (the broker's timings, the state's
heartbeat settings) is a group of settings the role hands to its internals
as one object; its fields are flattened into the role's flags and
environment (a group may declare its own prefixes).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NoReturn, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from corral.security.tls import CertificateFiles


@dataclass(frozen=True)
class Option:
    """How a field is named outside the model when the convention does not
    fit (names that predate the models keep working), and what the
    reference shows as the default of a field computed on the machine."""

    flag: str | None = None
    env: str | None = None
    shown_default: str | None = None
    #: the flag may be given several times (`--meta k=v --meta k2=v2`)
    repeatable: bool = False


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _key_values(value: Any) -> Any:
    """`k=v` items (a repeated flag, or one comma-separated variable)."""
    items = _split_commas(value) if isinstance(value, str) else value
    if not isinstance(items, list):
        return value
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"expects key=value, got {item!r}")
        key, _, val = item.partition("=")
        out[key] = val
    return out


#: a list given as `a,b,c` on the command line and in the environment
CommaList = Annotated[list[str], BeforeValidator(_split_commas)]
#: a map given as repeated `--flag k=v` or as `k=v,k2=v2` in the environment
KeyValues = Annotated[dict[str, str], BeforeValidator(_key_values), Option(repeatable=True)]


class SettingsGroup(BaseModel):
    """Settings a role hands to its internals as one object. Constructing
    one reads nothing from the environment (tests build them freely); the
    role's model reads the group's fields with its own."""

    model_config = ConfigDict(extra="forbid")

    #: prefixes for the group's fields; None = the enclosing model's
    ENV_PREFIX: ClassVar[str | None] = None
    FLAG_PREFIX: ClassVar[str | None] = None


@dataclass(frozen=True)
class Setting:
    """One flattened field of a role's model, with its outside names."""

    path: tuple[str, ...]
    flag: str
    env: str
    info: FieldInfo
    repeatable: bool
    shown_default: str | None

    @property
    def name(self) -> str:
        return self.path[-1]


def _option(info: FieldInfo) -> Option:
    return next((m for m in info.metadata if isinstance(m, Option)), Option())


def _group(info: FieldInfo) -> type[SettingsGroup] | None:
    ann = info.annotation
    return ann if isinstance(ann, type) and issubclass(ann, SettingsGroup) else None


def settings_of(
    model: type[BaseModel],
    env_prefix: str | None = None,
    flag_prefix: str = "--",
    path: tuple[str, ...] = (),
) -> Iterator[Setting]:
    """Every setting of `model`, groups flattened, in declaration order."""
    if env_prefix is None:
        env_prefix = model.role_env_prefix() if issubclass(model, Settings) else "CORRAL_"
    for name, info in model.model_fields.items():
        group = _group(info)
        if group is not None:
            yield from settings_of(
                group,
                group.ENV_PREFIX if group.ENV_PREFIX is not None else env_prefix,
                group.FLAG_PREFIX if group.FLAG_PREFIX is not None else flag_prefix,
                (*path, name),
            )
            continue
        opt = _option(info)
        yield Setting(
            path=(*path, name),
            flag=opt.flag or flag_prefix + name.replace("_", "-"),
            env=opt.env or env_prefix + name.upper(),
            info=info,
            repeatable=opt.repeatable,
            shown_default=opt.shown_default,
        )


def _put(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        values = values.setdefault(key, {})
    values[path[-1]] = value


class _EnvironmentSource(PydanticBaseSettingsSource):
    """Reads each setting from its own variable name (see the module doc);
    an empty variable counts as unset."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every setting at once

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for setting in settings_of(self.settings_cls):
            raw = os.environ.get(setting.env)
            if raw:
                _put(values, setting.path, raw)
        return values


class Settings(BaseSettings):
    """A model read from keyword arguments (the flags), then the
    environment, then the defaults."""

    model_config = SettingsConfigDict(extra="forbid")

    #: the role, which names its variables (`CORRAL_<ROLE>_...`)
    ROLE: ClassVar[str] = ""

    @classmethod
    def role_env_prefix(cls) -> str:
        return f"CORRAL_{cls.ROLE.upper()}_" if cls.ROLE else "CORRAL_"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvironmentSource(settings_cls))


# -- fields several roles share: one definition each ------------------------

#: what a region's name may be (every role's `region`, `-region`, `?region=`)
_REGION_CHARS = r"[A-Za-z0-9_-]{1,64}"
REGION_PATTERN = rf"^{_REGION_CHARS}$"
#: a region's name, or none
OPTIONAL_REGION_PATTERN = rf"^({_REGION_CHARS})?$"
REGION_NAME = re.compile(REGION_PATTERN)
#: a host:port to dial (a name, an IPv4 address, or an IPv6 one in brackets)
ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]{1,253}):[0-9]{1,5}$")

Dsn = Annotated[
    str,
    Field(min_length=1, description="PostgreSQL DSN"),
    Option(env="CORRAL_DSN"),
]
StateAddr = Annotated[
    str,
    Field(min_length=1, description="state service host:port"),
    Option(env="CORRAL_STATE_ADDR"),
]


class SecuritySettings(SettingsGroup):
    """TLS material, the region certificates name, the server token and
    whether ACLs are enforced: the same names in every role."""

    ENV_PREFIX = "CORRAL_"

    ca_file: str = Field(
        "",
        description="CA bundle (PEM) that signs every Corral certificate; with cert and "
        "key files this turns mutual TLS on and plaintext off",
    )
    cert_file: str = Field("", description="this process's certificate chain (PEM)")
    key_file: str = Field("", description="this process's private key (PEM)")
    region: str = Field(
        "global",
        pattern=REGION_PATTERN,
        description="this process's region: a region is a whole Corral of its own, and "
        "regions federate (docs/operations.md); certificates name it (server.<region>.corral)",
    )
    server_token: SecretStr = Field(
        SecretStr(""),
        description="shared secret that identifies server roles to each other when TLS is "
        "off (corral dev makes one); ignored with TLS, where the certificate decides",
    )
    acl_enabled: bool = Field(False, description="enforce ACL tokens and policies")

    @model_validator(mode="after")
    def _all_or_no_tls_files(self) -> SecuritySettings:
        given = [bool(self.ca_file), bool(self.cert_file), bool(self.key_file)]
        if any(given) and not all(given):
            raise ValueError("TLS needs all of ca_file, cert_file and key_file, or none")
        return self

    @property
    def tls(self) -> bool:
        return bool(self.ca_file)

    @property
    def files(self) -> CertificateFiles:
        return CertificateFiles(self.ca_file, self.cert_file, self.key_file)


class ProcessSettings(Settings):
    """What every role process has: its ready file, metrics, logs, and who
    it is on the wire."""

    security: SecuritySettings = SecuritySettings()

    metrics_listen: str = Field("", description="Prometheus /metrics host:port (empty: none)")
    ready_file: str = Field(
        "", description="write {role, address, metrics, pid} here as JSON once ready"
    )
    log_level: Annotated[str, Option(env="CORRAL_LOG_LEVEL")] = Field(
        "INFO", pattern=r"(?i)^(debug|info|warning|error|critical)$", description="log level"
    )
    log_format: Annotated[Literal["json", "text"], Option(env="CORRAL_LOG_FORMAT")] = Field(
        "json", description="log lines as JSON or plain text"
    )
    event_loop: Annotated[Literal["uvloop", "asyncio"], Option(env="CORRAL_EVENT_LOOP")] = Field(
        "uvloop", description="the process's asyncio event loop: uvloop (less CPU) or asyncio's own"
    )


class ServerSettings(ProcessSettings):
    """A role that serves gRPC."""

    listen: str = Field("127.0.0.1:0", description="gRPC listen host:port (port 0: any free port)")
    advertise: Annotated[str, Option(env="CORRAL_ADVERTISE_ADDR")] = Field(
        "",
        description="the address others reach this process at, e.g. the pod IP "
        "(default: the bound one)",
    )


class HttpSettings(ProcessSettings):
    """A role that serves HTTP (corral/runtime/http_server.py): with the TLS
    files set it serves HTTPS with the same certificates, or its own."""

    listen: str = Field("127.0.0.1:0", description="HTTP listen host:port (port 0: any free port)")
    http_cert_file: str = Field(
        "",
        description="certificate (PEM) the HTTPS listener presents (default: the TLS "
        "cert_file); it must allow server auth, e.g. a `client` role certificate",
    )
    http_key_file: str = Field("", description="its private key (default: the TLS key_file)")
    http_verify_clients: bool = Field(
        False,
        description="with TLS, require HTTPS clients to present a certificate the CA signed "
        "(default: optional; the ACL token decides what a caller may do)",
    )


# -- flags ------------------------------------------------------------------

S = TypeVar("S", bound=Settings)


def shown_default(setting: Setting) -> str:
    """The default as a flag would spell it ('' for none or required)."""
    if setting.shown_default is not None:
        return setting.shown_default
    info = setting.info
    if info.is_required():
        return ""
    value = info.get_default(call_default_factory=True)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def parser_for(
    model: type[Settings], prog: str, description: str | None
) -> argparse.ArgumentParser:
    """An argparse parser with one flag per setting of `model`."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for setting in settings_of(model):
        required = " (required)" if setting.info.is_required() else ""
        default = shown_default(setting)
        shown = f"; default {default}" if default and not required else ""
        parser.add_argument(
            setting.flag,
            dest="/".join(setting.path),
            default=argparse.SUPPRESS,
            action="append" if setting.repeatable else "store",
            metavar=setting.name.upper(),
            help=f"{setting.info.description}{required} (env {setting.env}{shown})",
        )
    return parser


def _fail(parser: argparse.ArgumentParser, model: type[Settings], exc: ValidationError) -> NoReturn:
    by_path = {s.path: s for s in settings_of(model)}
    messages = []
    for err in exc.errors():
        setting = by_path.get(tuple(str(p) for p in err["loc"]))
        if setting is None:
            messages.append(err["msg"])
        elif err["type"] == "missing":
            messages.append(f"{setting.flag} (or {setting.env}) is required")
        else:
            got = f" (got {err['input']!r})" if isinstance(err.get("input"), str) else ""
            messages.append(f"{setting.flag} (or {setting.env}): {err['msg']}{got}")
    parser.error("; ".join(messages))


def load(
    model: type[S],
    argv: Sequence[str],
    *,
    prog: str,
    description: str | None = None,
    commands: Sequence[str] = (),
) -> tuple[S, str]:
    """Parse `argv` into `model` (flags over environment over defaults).

    Returns the settings and the command (the first of `commands` when none
    is given; '' without commands). Bad or missing settings end the process
    with argparse's exit status 2 and one line naming the flag."""
    parser = parser_for(model, prog, description)
    if commands:
        parser.add_argument("command", nargs="?", default=commands[0], choices=list(commands))
    namespace = vars(parser.parse_args(list(argv)))
    command = str(namespace.pop("command", ""))
    flags: dict[str, Any] = {}
    for dest, value in namespace.items():
        _put(flags, tuple(dest.split("/")), value)
    try:
        return model(**flags), command
    except ValidationError as exc:
        _fail(parser, model, exc)
