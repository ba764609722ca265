"""What a task's `template` block means, apart from its text: Nomad's
defaults (api.Template.Canonicalize), its checks (structs.Template.Validate),
where the rendered file may go, and how an `env = true` template's output
becomes environment variables (go-envparse, which Nomad reads it with).

The text itself is checked here too, by parsing it with the library
(`NomadTemplate`): a template that cannot run on any client is refused when
the job is submitted rather than when its task starts (Nomad finds out on
the client)."""

from __future__ import annotations

import posixpath
import signal
from collections.abc import Mapping

from corral.domain.template.errors import TemplateError
from corral.domain.template.render import NomadTemplate
from corral.v1 import structs_pb2 as pb

SECOND = 1_000_000_000

CHANGE_NOOP = "noop"
CHANGE_RESTART = "restart"
CHANGE_SIGNAL = "signal"
CHANGE_SCRIPT = "script"
CHANGE_MODES = (CHANGE_NOOP, CHANGE_RESTART, CHANGE_SIGNAL, CHANGE_SCRIPT)

DEFAULT_CHANGE_MODE = CHANGE_RESTART
DEFAULT_SIGNAL = "SIGHUP"
DEFAULT_SPLAY = 5 * SECOND
DEFAULT_PERMS = "0644"
DEFAULT_SCRIPT_TIMEOUT = 5 * SECOND
LEFT_DELIM = "{{"
RIGHT_DELIM = "}}"

#: templates one task may have, and the text one may hold (the library's
#: own bound on a template's text)
MAX_TEMPLATES = 100
MAX_TEXT = 4 * 1024 * 1024


def canonicalize(
    task: pb.Task, explicit: Mapping[str, set[str]] | None = None, task_path: str = ""
) -> None:
    """Nomad's defaults for every template of `task`: change_mode restart,
    SIGHUP for a signal template without a signal, perms 0644, the `{{ }}`
    delimiters; signals upper-cased. With `explicit` (a job file's reader:
    `<task_path>.templates[i]` and `...change_script` to the fields the
    file set) also splay 5s and a script's 5s timeout where the file left
    them out; without it (the state, on a job already parsed) a zero splay
    is kept, as it may have been written."""
    for i, t in enumerate(task.templates):
        path = f"{task_path}.templates[{i}]"
        t.change_mode = t.change_mode or DEFAULT_CHANGE_MODE
        if t.change_signal:
            t.change_signal = t.change_signal.upper()
        elif t.change_mode == CHANGE_SIGNAL:
            t.change_signal = DEFAULT_SIGNAL
        t.perms = t.perms or DEFAULT_PERMS
        t.left_delim = t.left_delim or LEFT_DELIM
        t.right_delim = t.right_delim or RIGHT_DELIM
        if explicit is None:
            continue
        if t.splay == 0 and "splay" not in explicit.get(path, set()):
            t.splay = DEFAULT_SPLAY
        script_written = explicit.get(f"{path}.change_script", set())
        script = t.change_script if t.HasField("change_script") else None
        if script is not None and not script.timeout and "timeout" not in script_written:
            script.timeout = DEFAULT_SCRIPT_TIMEOUT


def signal_number(name: str) -> int | None:
    """The number of a signal named as Nomad's signals.Parse takes it
    ("SIGHUP", "HUP", "sighup"), None when there is no such signal."""
    upper = name.strip().upper()
    if not upper:
        return None
    if not upper.startswith("SIG"):
        upper = "SIG" + upper
    member = getattr(signal.Signals, upper, None) if upper.isidentifier() else None
    return int(member) if isinstance(member, signal.Signals) else None


def escapes_alloc_dir(path: str) -> bool:
    """Nomad's PathEscapesAllocViaRelative("task", path): `path`, taken
    from a task directory, climbs out of the alloc directory. An absolute
    path does not: the client puts it under the task directory. (A
    template's `source` is checked on the client only, as in Nomad: there
    `${NOMAD_TASK_DIR}/...` is known.)"""
    joined = posixpath.normpath("/alloc-dir/alloc-id/task/" + path)
    return not (joined == "/alloc-dir/alloc-id" or joined.startswith("/alloc-dir/alloc-id/"))


def perms_mode(perms: str) -> int:
    """`perms` as a file mode (ValueError unless it is octal within 0o7777,
    Go's strconv.ParseUint(perms, 8, 12))."""
    if not perms or not all(c in "01234567" for c in perms):
        raise ValueError(f'Failed to parse "{perms}" as octal')
    mode = int(perms, 8)
    if mode > 0o7777:
        raise ValueError(f'Failed to parse "{perms}" as octal: value out of range')
    return mode


def parse_text(t: pb.Template, name: str = "") -> NomadTemplate:
    """The template's `data` parsed with its delimiters and missing-key rule
    (TemplateError when it does not parse, or uses a function Corral does
    not have)."""
    return NomadTemplate(
        t.embedded_tmpl,
        name=name,
        left_delimiter=t.left_delim or LEFT_DELIM,
        right_delimiter=t.right_delim or RIGHT_DELIM,
        error_on_missing_key=t.err_missing_key,
    )


def problems(task: pb.Task) -> tuple[str, str] | None:
    """The first thing wrong with the task's templates, as (field below the
    task, problem), or None; a missing field is reported on its template.
    Nomad's checks, in its words where it has them, and the text of `data`
    parsed."""
    if len(task.templates) > MAX_TEMPLATES:
        return "templates", f"has {len(task.templates)} templates, more than {MAX_TEMPLATES}"
    destinations: dict[str, int] = {}
    for i, t in enumerate(task.templates):
        found = _problem(t)
        if found is not None:
            field = f".{found[0]}" if found[0] else ""
            return f"templates[{i}]{field}", found[1]
        dest = posixpath.normpath(t.dest_path)
        if dest in destinations:
            return f"templates[{i}].dest_path", (
                f"template {destinations[dest]} already renders to {t.dest_path!r}"
            )
        destinations[dest] = i
    return None


def _problem(t: pb.Template) -> tuple[str, str] | None:
    if not t.source_path and not t.embedded_tmpl:
        return "", "Must specify a source path or have an embedded template"
    if t.source_path and t.embedded_tmpl:
        return "source_path", "cannot specify both source and data"
    if not t.dest_path:
        return "", "Must specify a destination for the template"
    if "\x00" in t.dest_path or "\x00" in t.source_path:
        return "dest_path", "a path must not contain NUL"
    if escapes_alloc_dir(t.dest_path):
        return "dest_path", "destination escapes allocation directory"
    if t.change_mode not in CHANGE_MODES:
        return "change_mode", (
            f"unknown change_mode {t.change_mode!r} (expected one of: {', '.join(CHANGE_MODES)})"
        )
    if t.change_signal and signal_number(t.change_signal) is None:
        return "change_signal", f'Failed to parse signal "{t.change_signal}"'
    if t.change_mode == CHANGE_SIGNAL:
        if not t.change_signal:
            return "change_signal", "Must specify signal value when change mode is signal"
        if t.envvars:
            return "envvars", "cannot use signals with env var templates"
    if t.change_mode == CHANGE_SCRIPT:
        if not t.HasField("change_script"):
            return "", ("must specify change script configuration value when change mode is script")
        if not t.change_script.command:
            return "change_script.command", (
                "must specify script path value when change mode is script"
            )
        if t.change_script.timeout < 0:
            return "change_script.timeout", "must not be negative"
    if t.splay < 0:
        return "splay", "Must specify positive splay value"
    try:
        perms_mode(t.perms or DEFAULT_PERMS)
    except ValueError as exc:
        return "perms", str(exc)
    for field in ("uid", "gid"):
        if t.HasField(field) and getattr(t, field) < -1:
            return field, "must be a user or group id (or -1 for the agent's)"
    if t.HasField("wait"):
        w = t.wait
        if w.HasField("min") and w.min < 0:
            return "wait.min", "must not be negative"
        if w.HasField("max") and w.max < 0:
            return "wait.max", "must not be negative"
        if w.HasField("min") and w.HasField("max") and w.min > w.max:
            return "wait", f"wait min {_seconds(w.min)} is greater than max {_seconds(w.max)}"
    if len(t.embedded_tmpl) > MAX_TEXT:
        return "embedded_tmpl", f"is longer than {MAX_TEXT} characters"
    if t.embedded_tmpl:
        try:
            parse_text(t)
        except TemplateError as exc:
            return "embedded_tmpl", str(exc)
    return None


def _seconds(ns: int) -> str:
    return f"{ns / SECOND:g}s"


# --------------------------------------------------------------------------- env templates


class EnvParseError(ValueError):
    """An env template's output is not KEY=VALUE lines (go-envparse's
    messages, with the line number)."""


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines as go-envparse reads them: blank lines and lines
    starting with `#` are skipped, an `export ` prefix and the spaces
    around key and value are dropped, a value may be "double quoted" (with
    \\\\, \\", \\n and \\t escapes) or 'single quoted', and an unquoted `#`
    starts a comment."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            key, value = _env_line(line)
        except EnvParseError as exc:
            raise EnvParseError(f"error on line {number}: {exc}") from None
        out[key] = value
    return out


def _env_line(line: str) -> tuple[str, str]:
    name, sep, raw = line.partition("=")
    if not sep:
        raise EnvParseError('missing "="')
    key = name.strip().removeprefix("export ").strip()
    if not key:
        raise EnvParseError("empty key")
    if not (key[0] == "_" or key[0].isascii() and key[0].isalpha()):
        raise EnvParseError(f"key must start with [A-Za-z_] but found {key[0]!r}")
    value = raw.strip()
    out: list[str] = []
    significant = 0  # length of `out` up to its last character that is not unquoted space
    mode = "normal"
    for ch in value:
        if ord(ch) < 32:
            raise EnvParseError(f"0x{ord(ch):02x} is an invalid value character")
        if mode == "normal":
            if ch == '"':
                mode = "double"
            elif ch == "'":
                mode = "single"
            elif ch == "#":
                return key, "".join(out[:significant])
            else:
                out.append(ch)
                if ch not in " \t":
                    significant = len(out)
        elif mode == "double":
            if ch == '"':
                mode = "normal"
            elif ch == "\\":
                mode = "escape"
            else:
                out.append(ch)
                significant = len(out)
        elif mode == "escape":
            escapes = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
            if ch not in escapes:
                raise EnvParseError(f"invalid escape sequence: {ch}")
            out.append(escapes[ch])
            significant = len(out)
            mode = "double"
        else:  # single
            if ch == "'":
                mode = "normal"
            else:
                out.append(ch)
                significant = len(out)
    if mode == "double":
        raise EnvParseError('unmatched "')
    if mode == "single":
        raise EnvParseError("unmatched '")
    if mode == "escape":
        raise EnvParseError("incomplete escape sequence")
    return key, "".join(out)
