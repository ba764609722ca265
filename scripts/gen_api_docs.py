"""Write docs/api-reference.md from the protos (services, RPCs, messages,
fields and their comments), so the reference never drifts from the wire
contract. `make proto` regenerates it; `--check` fails when it is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc  # type: ignore[import-untyped]

from corral.security.access import RULES

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT = ROOT / "docs" / "api-reference.md"

# FieldDescriptorProto.Type -> proto type name
_SCALARS = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    8: "bool",
    9: "string",
    12: "bytes",
    13: "uint32",
}


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    protos = sorted(
        str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "corral" / "v1").glob("*.proto")
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{resources.files('grpc_tools') / '_proto'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
        return fds


def _comments(fd: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    out = {}
    for loc in fd.source_code_info.location:
        text = (loc.leading_comments or loc.trailing_comments).strip()
        if text:
            out[tuple(loc.path)] = " ".join(line.strip() for line in text.splitlines())
    return out


def _type_name(f: descriptor_pb2.FieldDescriptorProto, maps: dict[str, str]) -> str:
    if f.type_name:
        name = f.type_name.lstrip(".")
        if name in maps:
            return maps[name]
        base = name.rsplit(".", 1)[-1]
    else:
        base = _SCALARS.get(f.type, "?")
    if f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {base}"
    return base


_SERVICER = re.compile(r"^class \w+\(\w+_pb2_grpc\.(\w+)Servicer\)", re.M)


def handler_homes() -> dict[str, list[tuple[str, str]]]:
    """Proto service name -> [(role, handler module)], read from every role's
    `handlers` module, so the reference says who serves what from the code
    (`Periodic` has two: the broker leader, and the state relaying to it)."""
    out: dict[str, list[tuple[str, str]]] = {}
    services = ROOT / "services"
    paths = [*services.glob("*/handlers.py"), *services.glob("*/handlers/*.py")]
    for path in sorted(paths):
        role = path.relative_to(services).parts[0]
        for name in _SERVICER.findall(path.read_text()):
            out.setdefault(name, []).append((role, str(path.relative_to(ROOT))))
    return out


def render(fds: descriptor_pb2.FileDescriptorSet) -> str:
    lines = [
        "# API reference",
        "",
        "Generated from `proto/corral/v1/*.proto` by `scripts/gen_api_docs.py`"
        " (`make proto`); do not edit by hand. Shared structs are in package"
        " `corral.v1.types`, services and their messages in `corral.v1`."
        " Times are Unix nanoseconds, durations nanoseconds.",
        "",
    ]
    files = [fd for fd in fds.file if fd.name.startswith("corral/")]
    homes = handler_homes()
    lines.append("## Services")
    lines.append("")
    for fd in files:
        com = _comments(fd)
        for si, svc in enumerate(fd.service):
            lines.append(f"### `{fd.package}.{svc.name}` ({fd.name})")
            lines.append("")
            if com.get((6, si)):
                lines += [com[(6, si)], ""]
            if svc.name in homes:
                served = "; the ".join(
                    f"**{role}** role: `{module}`" for role, module in homes[svc.name]
                )
                lines += [f"Served by the {served}.", ""]
            lines.append("| RPC | request | response | who may call (docs/security.md) | notes |")
            lines.append("|---|---|---|---|---|")
            for mi, m in enumerate(svc.method):
                req = m.input_type.rsplit(".", 1)[-1]
                resp = m.output_type.rsplit(".", 1)[-1]
                if m.server_streaming:
                    resp = f"stream {resp}"
                note = com.get((6, si, 2, mi), "").replace("|", "\\|")
                rule = RULES.get(f"/{fd.package}.{svc.name}/{m.name}")
                who = rule.describe() if rule is not None else "nobody (no access rule)"
                lines.append(f"| `{m.name}` | `{req}` | `{resp}` | {who} | {note} |")
            lines.append("")
    lines.append("## Messages")
    lines.append("")
    for fd in files:
        com = _comments(fd)
        for mi, msg in enumerate(fd.message_type):
            maps = {
                f"{fd.package}.{msg.name}.{n.name}": "map<{}, {}>".format(
                    *(_type_name(f, {}).replace("repeated ", "") for f in n.field)
                )
                for n in msg.nested_type
                if n.options.map_entry
            }
            lines.append(f"### `{fd.package}.{msg.name}`")
            lines.append("")
            if com.get((4, mi)):
                lines += [com[(4, mi)], ""]
            if not msg.field:
                lines += ["(no fields)", ""]
                continue
            lines.append("| field | type | notes |")
            lines.append("|---|---|---|")
            for fi, f in enumerate(msg.field):
                note = com.get((4, mi, 2, fi), "").replace("|", "\\|")
                lines.append(f"| `{f.name}` | `{_type_name(f, maps)}` | {note} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render(descriptor_set())
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/api-reference.md is stale, run `make proto`")
            return 1
        print("docs/api-reference.md up to date")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
