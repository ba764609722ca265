"""Write tests/apitypes/nomad_api_types.json: the JSON shape of every struct
of Nomad's Go `api` package (the client the nomad CLI, Terraform's provider
and nomad-pack decode our answers with), read from Nomad's source at
test-authoring time. The committed table is ours: struct name → field name
→ a type expression in our own small notation (below); no Nomad text is
copied. tests/apitypes/check.py checks the gateway's JSON against it.

Run it where Nomad's source is at hand (a bare git repository):

    .venv/bin/python scripts/gen_nomad_api_types.py \
        --git-dir /work/.mirror/hashicorp+nomad/repo [--rev HEAD]

Type expressions:

* `string`, `bool`, `int` (a whole number), `float`, `any`;
* `duration`: Go's time.Duration, whole nanoseconds;
* `time`: Go's time.Time, an RFC 3339 string (never null: its zero value is
  "0001-01-01T00:00:00Z");
* `bytes`: base64 text ([]byte), null for a nil slice;
* `durstring`: a duration field with its own JSON methods (ACLToken's
  ExpirationTTL, NodePool's NodeIdentityTTL): a Go duration string on the
  way out, "" for none; a string or a number of nanoseconds on the way in;
* `*T`, `[]T`, `map[T]`: a pointer, slice or map (string keys) of T — each
  may be null (Go's nil), the last two as Go's nil slice and map;
* any other name: a struct of the table.

`server_fields` lists, for each api struct, the JSON field names of the
struct of the same name in nomad/structs (what Nomad's servers encode): a
superset of the api's in places (`Index` beside `LastIndex`, ...).

A field the Go struct tags `omitempty` is marked so: it may be absent; so
are the fields of an embedded QueryMeta or WriteMeta (`headers`: the Go
client fills them from the answer's headers).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "apitypes" / "nomad_api_types.json"

_BASIC = {
    "string": "string",
    "bool": "bool",
    "int": "int",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "int",
    "uint": "int",
    "uint8": "int",
    "uint16": "int",
    "uint32": "int",
    "uint64": "int",
    "byte": "int",
    "rune": "int",
    "float32": "float",
    "float64": "float",
    "interface{}": "any",
    "any": "any",
    "time.Time": "time",
    "time.Duration": "duration",
    "json.RawMessage": "any",
}

#: fields whose struct has its own JSON methods (read in the Go source):
#: their JSON is not the Go type's
_CUSTOM = {
    ("ACLToken", "ExpirationTTL"): "durstring",
    ("NodePool", "NodeIdentityTTL"): "durstring",
}


#: api structs whose server struct has another name
_SERVER_NAMES = {"AllocationListStub": "AllocListStub", "AllocationMetric": "AllocMetric"}

#: structs of Nomad's servers (nomad/structs) the gateway answers with
#: that the api package has no type for: Nomad's UI and other clients
#: decode them themselves (`/v1/jobs/statuses`)
_SERVER_ONLY = (
    "JobStatusesJob",
    "JobStatusesAlloc",
    "JobStatusesDeployment",
    "JobStatusesLatestDeployment",
)

#: embedded structs whose fields the Go client fills from the answer's
#: headers (X-Nomad-Index, ...), never from its JSON
_HEADER_META = {"QueryMeta", "WriteMeta"}


@dataclass
class Field:
    name: str
    type: str
    omitempty: bool


@dataclass
class Struct:
    name: str
    fields: list[Field] = field(default_factory=list)
    #: embedded structs whose fields Go's JSON flattens into this one
    embedded: list[str] = field(default_factory=list)


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    out = []
    for line in src.splitlines():
        # a // that is not inside a struct tag or string
        in_tag = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch in '`"':
                in_tag = not in_tag
            elif ch == "/" and not in_tag and line[i : i + 2] == "//":
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def _blocks(src: str) -> list[tuple[str, str, str]]:
    """(name, kind, body) of each top-level `type X ...` declaration; kind is
    'struct' (body = the braces' content) or 'alias' (body = the type)."""
    out = []
    for m in re.finditer(r"^type\s+([A-Za-z_]\w*)(\[[^\]]*\])?\s+(.*)$", src, flags=re.M):
        name, rest = m.group(1), m.group(3).strip()
        if rest.startswith("struct"):
            start = src.index("{", m.start())
            depth, i = 0, start
            while True:
                if src[i] == "{":
                    depth += 1
                elif src[i] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            out.append((name, "struct", src[start + 1 : i]))
        elif not rest.startswith("interface"):
            out.append((name, "alias", rest.rstrip("{").strip()))
    return out


def _type_expr(go: str, aliases: dict[str, str]) -> str | None:
    go = go.strip()
    if go in _BASIC:
        return _BASIC[go]
    if go.startswith("*"):
        inner = _type_expr(go[1:], aliases)
        return None if inner is None else "*" + inner
    if go == "[]byte":
        return "bytes"
    if go.startswith("[]"):
        inner = _type_expr(go[2:], aliases)
        return None if inner is None else "[]" + inner
    m = re.match(r"map\[([^\]]+)\](.+)$", go)
    if m:
        inner = _type_expr(m.group(2), aliases)
        return None if inner is None else "map[" + inner + "]"
    if go == "error" or go.startswith(
        ("chan ", "func(", "func ", "<-chan", "sync.", "context.", "io.", "http.")
    ):
        return None
    if "." in go:
        return "any"  # another package's type (none in api's answers)
    if go in aliases:
        return _type_expr(aliases[go], aliases)
    return go


def _fields(body: str) -> list[tuple[list[str], str, str]]:
    """(names, go type, tag) of each line of a struct body; an embedded
    struct has no names."""
    out: list[tuple[list[str], str, str]] = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        tag = ""
        m = re.search(r"`([^`]*)`\s*$", line)
        if m:
            tag = m.group(1)
            line = line[: m.start()].strip()
        if re.match(r"^\*?[A-Za-z_][\w.]*$", line):
            out.append(([], line, tag))
            continue
        m = re.match(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+(.+)$", line)
        if m:
            names = [n.strip() for n in m.group(1).split(",")]
            out.append((names, m.group(2).strip(), tag))
    return out


def _json_name(name: str, tag: str) -> tuple[str | None, bool]:
    m = re.search(r'json:"([^"]*)"', tag)
    if not m:
        return name, False
    parts = m.group(1).split(",")
    if parts[0] == "-" and len(parts) == 1:
        return None, False
    return parts[0] or name, "omitempty" in parts[1:]


def read_api(git_dir: str, rev: str, folder: str = "api/") -> dict[str, Struct]:
    """The structs of one Go package folder of Nomad's source."""
    files = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", rev, folder],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    sources = []
    for path in files:
        if not path.endswith(".go") or path.endswith("_test.go"):
            continue
        src = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        sources.append(_strip_comments(src))
    aliases: dict[str, str] = {}
    bodies: dict[str, str] = {}
    for src in sources:
        for name, kind, body in _blocks(src):
            if kind == "alias":
                aliases[name] = body.lstrip("=").strip()
            else:
                bodies[name] = body
    structs: dict[str, Struct] = {}
    for name, body in bodies.items():
        s = Struct(name)
        for names, typ, tag in _fields(body):
            if not names:
                if "json:" in tag:
                    jname, omit = _json_name(typ.lstrip("*"), tag)
                    if jname is not None:
                        expr = _type_expr(typ, aliases)
                        if expr is not None:
                            s.fields.append(Field(jname, expr, omit))
                    continue
                s.embedded.append(typ.lstrip("*"))
                continue
            for fname in names:
                if not fname[0].isupper():
                    continue
                jname, omit = _json_name(fname, tag)
                if jname is None:
                    continue
                expr = _CUSTOM.get((name, fname)) or _type_expr(typ, aliases)
                if expr is None:
                    continue
                s.fields.append(Field(jname, expr, omit))
        structs[name] = s
    return structs


def flatten(structs: dict[str, Struct]) -> dict[str, dict[str, dict[str, object]]]:
    """Each struct's JSON fields, embedded structs flattened in (Go's rule:
    the outer struct's own field wins)."""

    def fields_of(name: str, seen: tuple[str, ...]) -> dict[str, dict[str, object]]:
        s = structs[name]
        out: dict[str, dict[str, object]] = {}
        for emb in s.embedded:
            if emb in structs and emb not in seen:
                for k, v in fields_of(emb, (*seen, emb)).items():
                    if emb in _HEADER_META:
                        v = {**v, "omitempty": True, "headers": True}
                    out.setdefault(k, v)
        for f in s.fields:
            out[f.name] = {"type": f.type, "omitempty": f.omitempty}
        return out

    return {name: fields_of(name, (name,)) for name in sorted(structs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default="/work/.mirror/hashicorp+nomad/repo")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    structs = read_api(args.git_dir, args.rev)
    server_structs = read_api(args.git_dir, args.rev, "nomad/structs/")
    for name in _SERVER_ONLY:
        structs.setdefault(name, server_structs[name])
    rev = subprocess.run(
        ["git", f"--git-dir={args.git_dir}", "rev-parse", args.rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    version = subprocess.run(
        ["git", f"--git-dir={args.git_dir}", "show", f"{rev}:version/version.go"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r'Version\s*=\s*"([^"]+)"', version)
    server: dict[str, dict[str, dict[str, object]]] = {}
    # what Nomad's servers encode, and its clients (the stats the gateway
    # relays from an agent)
    for folder in ("nomad/structs/", "client/structs/", "client/hoststats/"):
        for name, fields in flatten(read_api(args.git_dir, args.rev, folder)).items():
            server.setdefault(name, {}).update(fields)
    for api_name, server_name in _SERVER_NAMES.items():
        server[api_name] = {**server.get(server_name, {}), **server.get(api_name, {})}
    table = {
        "nomad_version": m.group(1) if m else "",
        "nomad_commit": rev,
        "structs": flatten(structs),
        # the field names of the same-named structs Nomad's servers encode
        # (nomad/structs): a field the api struct lacks but the server sends
        "server_fields": {name: sorted(server[name]) for name in sorted(structs) if name in server},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table['structs'])} structs → {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
