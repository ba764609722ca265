"""Regenerate the committed protobuf/gRPC stubs from proto/.

`make proto` runs this with no arguments. With `--check` it generates into a
temporary directory and exits non-zero if the committed files differ, which
`make test` uses so that stubs never drift from the protos.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE_DIR = Path("corral") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: Path) -> None:
    protos = sorted(
        str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / PACKAGE_DIR).glob("*.proto")
    )
    well_known = str(resources.files("grpc_tools") / "_proto")
    bin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def generated_files(base: Path) -> dict[str, Path]:
    pkg = base / PACKAGE_DIR
    if not pkg.exists():
        return {}
    return {p.name: p for p in pkg.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_files(out)
        committed = generated_files(ROOT)
        if args.check:
            stale = sorted(
                name
                for name in set(fresh) | set(committed)
                if name not in fresh
                or name not in committed
                or not filecmp.cmp(fresh[name], committed[name], shallow=False)
            )
            if stale:
                print("generated stubs are stale, run `make proto`:", ", ".join(stale))
                return 1
            print(f"generated stubs up to date ({len(fresh)} files)")
            return 0
        for name, path in committed.items():
            if name not in fresh:
                path.unlink()
        target = ROOT / PACKAGE_DIR
        target.mkdir(parents=True, exist_ok=True)
        for name, path in fresh.items():
            shutil.copyfile(path, target / name)
        print(f"wrote {len(fresh)} files to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
