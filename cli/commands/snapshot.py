"""`corral operator snapshot save|restore|inspect FILE` (Nomad's operator
snapshot commands): the whole state to a file and back, and what a file
holds. The file holds every secret of the cluster (token secrets' hashes,
node secrets, the keyring that decrypts Variables): it is written 0600."""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cli.context import CliError, Context, common
from cli.output import fmt_bytes, kv, print_json, table
from corral.domain import snapshot_archive as archive
from corral.security.private_files import write_private_chunks
from corral.v1 import operator_pb2

#: a snapshot is read or written within this long
TIMEOUT_S = 3600.0
CHUNK = 1 << 20
#: what `inspect` unpacks at most (a local file: only a runaway is refused)
INSPECT_MAX_BYTES = 1 << 40


def register(op: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    snap = op.add_parser(
        "snapshot", help="Save the whole state to a file, restore it, inspect a file"
    ).add_subparsers(dest="snapshot_command", metavar="<subcommand>")
    p = snap.add_parser("save", help="Save a consistent snapshot of the state to FILE (0600)")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "-stale",
        "--stale",
        action="store_true",
        help="accepted for Nomad's sake: any state process answers consistently",
    )
    common(p)
    p.set_defaults(func=cmd_save)
    p = snap.add_parser("restore", help="Replace the whole state with the snapshot in FILE")
    p.add_argument("file", metavar="FILE")
    common(p)
    p.set_defaults(func=cmd_restore)
    p = snap.add_parser("inspect", help="The index, size and objects per table of FILE")
    p.add_argument("file", metavar="FILE")
    common(p, json=True)
    p.set_defaults(func=cmd_inspect)


def cmd_save(args: argparse.Namespace, ctx: Context) -> int:
    path = Path(args.file)
    stream = ctx.client.operator.SnapshotSave(
        operator_pb2.SnapshotSaveRequest(stale=args.stale), timeout=TIMEOUT_S
    )
    head: operator_pb2.SnapshotSaveResponse = next(stream)
    digest = hashlib.sha256()
    got = 0

    def chunks() -> Iterator[bytes]:
        nonlocal got
        for msg in stream:
            digest.update(msg.data)
            got += len(msg.data)
            yield msg.data
        if got != head.size or digest.hexdigest() != head.sha256:
            raise CliError(
                f"the snapshot arrived damaged ({got} of {head.size} bytes, checksum "
                f"{'matches' if digest.hexdigest() == head.sha256 else 'differs'}); "
                f"{path} was not written"
            )

    try:
        write_private_chunks(path, chunks())
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    ctx.out.write(f"State file written to {path} (index {head.index})\n")
    return 0


def cmd_restore(args: argparse.Namespace, ctx: Context) -> int:
    path = Path(args.file)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise CliError(f"{path} is empty: not a snapshot")

    def requests() -> Iterator[operator_pb2.SnapshotRestoreRequest]:
        for chunk in archive.chunks(path, CHUNK):
            yield operator_pb2.SnapshotRestoreRequest(data=chunk)

    answers = list(ctx.client.operator.SnapshotRestore(requests(), timeout=TIMEOUT_S))
    if not answers:
        raise CliError("the state answered nothing: the snapshot was not restored")
    done = answers[-1]
    ctx.out.write(
        f"Snapshot Restored (taken at index {done.snapshot_index}; the state is now at "
        f"index {done.index})\n"
    )
    return 0


def cmd_inspect(args: argparse.Namespace, ctx: Context) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"cannot read {path}: no such file")
    with tempfile.TemporaryDirectory(prefix="corral-inspect-") as tmp:
        try:
            ex = archive.extract(path, Path(tmp), INSPECT_MAX_BYTES)
        except archive.ArchiveError as exc:
            raise CliError(f"{path}: {exc}") from None
    summary = archive.summary(ex)
    if args.json:
        print_json(summary, ctx.out)
        return 0
    kv(
        [
            ("Created", ex.meta.created),
            ("Index", ex.meta.index),
            ("Region", ex.meta.region),
            ("Size", fmt_bytes(ex.size)),
            ("Schema", ex.meta.schema_revision),
            ("Version", ex.meta.format_version),
            ("Keyring", "included" if ex.has_keyring else "none"),
        ],
        ctx.out,
    )
    ctx.out.write("\n")
    parts = ex.meta.tables
    table(
        ("Type", "Count", "Size"),
        [
            *[(t.name, t.rows, fmt_bytes(t.size)) for t in parts],
            (
                "Total",
                sum(t.rows for t in parts),
                fmt_bytes(sum(t.size for t in parts)),
            ),
        ],
        ctx.out,
    )
    return 0
