"""Artifacts fetched the way the agent does before a task starts, from a
real HTTP server (http.server in a thread) into a real task directory:
downloads and their checksums, go-getter's modes, archives unpacked (and
the ones that try to leave their destination refused), the agent's
limits, headers and options, file:: sources."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import zstandard

from corral.domain.artifacts import split_subdir
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir, TaskDir
from services.agent.artifacts import ArtifactError, Getter, GetterSettings
from services.agent.taskenv import TaskEnv
from tests.integration.agent.test_task_runner import Run, job, sh
from tests.wait import until

ALLOC = "a7c0d1a5-7f7e-4f8e-9d2a-1b1c0e6a0002"


class Files:
    """What the test server serves, and the requests it saw."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Files]]:
    files = Files()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            files.requests.append((self.path, dict(self.headers)))
            body = files.files.get(self.path.split("?")[0])
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", files
    finally:
        httpd.shutdown()
        httpd.server_close()


def task_dir(tmp_path: Path) -> TaskDir:
    alloc = AllocDir.of(tmp_path, ALLOC)
    alloc.build()
    td = alloc.task("web")
    td.build()
    return td


ENV = TaskEnv(env={}, variables={"NOMAD_ALLOC_ID": ALLOC, "NOMAD_TASK_NAME": "web"})


async def fetch(tmp_path: Path, artifact: pb.TaskArtifact, **settings: object) -> TaskDir:
    td = task_dir(tmp_path)
    getter = Getter(GetterSettings(**settings))  # type: ignore[arg-type]
    await getter.fetch_all([artifact], ENV, td, user="", staging=tmp_path / "staging", done=set())
    return td


def tar_gz(entries: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o4755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def tarfile_bytes(entries: dict[str, bytes]) -> bytes:
    """An uncompressed tar (compressed with zstd by the tests)."""
    return gzip.decompress(tar_gz(entries))


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------ plain files


async def test_a_file_lands_in_local_with_its_name_and_checksum(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/bin/tool"] = b"#!/bin/sh\necho hi\n"
    a = pb.TaskArtifact(
        getter_source=f"{url}/bin/tool",
        getter_options={"checksum": sha256(files.files["/bin/tool"])},
        relative_dest="local/",
    )
    td = await fetch(tmp_path, a)
    assert (td.local / "tool").read_bytes() == files.files["/bin/tool"]
    assert not list((tmp_path / "staging").iterdir())  # the staging copy is gone


async def test_a_bad_checksum_is_refused_and_nothing_is_written(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/app.bin"] = b"the real thing"
    a = pb.TaskArtifact(
        getter_source=f"{url}/app.bin",
        getter_options={"checksum": sha256(b"something else")},
        relative_dest="local/",
    )
    with pytest.raises(ArtifactError, match="checksums did not match"):
        await fetch(tmp_path, a)
    assert not (AllocDir.of(tmp_path, ALLOC).task("web").local / "app.bin").exists()


@pytest.mark.parametrize("kind", ["md5", "sha1", "sha512"])
async def test_every_checksum_type(tmp_path: Path, server: tuple[str, Files], kind: str) -> None:
    url, files = server
    files.files["/sum.txt"] = b"sums"
    digest = hashlib.new(kind, b"sums").hexdigest()
    a = pb.TaskArtifact(
        getter_source=f"{url}/sum.txt",
        getter_options={"checksum": f"{kind}:{digest}"},
        relative_dest="local/",
    )
    td = await fetch(tmp_path, a)
    assert (td.local / "sum.txt").read_bytes() == b"sums"


async def test_mode_file_makes_the_destination_the_file(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/config"] = b"key=value\n"
    a = pb.TaskArtifact(
        getter_source=f"{url}/config", getter_mode="file", relative_dest="local/app.conf"
    )
    td = await fetch(tmp_path, a)
    assert (td.local / "app.conf").read_bytes() == b"key=value\n"


async def test_headers_options_and_runtime_variables_are_sent(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/auth.txt"] = b"ok"
    a = pb.TaskArtifact(
        getter_source=f"{url}/auth.txt",
        getter_options={"token": "${NOMAD_ALLOC_ID}"},
        getter_headers={"X-Task": "${NOMAD_TASK_NAME}"},
        relative_dest="local/",
    )
    await fetch(tmp_path, a)
    path, headers = files.requests[-1]
    assert path == f"/auth.txt?token={ALLOC}"
    assert headers["X-Task"] == "web"


async def test_a_missing_file_and_a_download_over_the_limit_fail(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    with pytest.raises(ArtifactError, match="bad response code: 404"):
        await fetch(tmp_path, pb.TaskArtifact(getter_source=f"{url}/nope", relative_dest="local/"))
    files.files["/big"] = b"x" * 4096
    with pytest.raises(ArtifactError, match="larger than the agent's limit"):
        await fetch(
            tmp_path,
            pb.TaskArtifact(getter_source=f"{url}/big", relative_dest="local/"),
            http_max_bytes=1000,
        )


# ------------------------------------------------------------ archives


async def test_archives_unpack_into_the_destination(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/site.tar.gz"] = tar_gz({"site/index.html": b"<p>hi", "run.sh": b"echo"})
    files.files["/data.zip"] = zip_bytes({"data/a.txt": b"a", "b.txt": b"b"})
    td = await fetch(
        tmp_path, pb.TaskArtifact(getter_source=f"{url}/site.tar.gz", relative_dest="local/")
    )
    assert (td.local / "site" / "index.html").read_bytes() == b"<p>hi"
    mode = (td.local / "run.sh").stat().st_mode
    assert mode & 0o777 == 0o755 and not mode & 0o4000  # no setuid from an archive
    td = await fetch(
        tmp_path, pb.TaskArtifact(getter_source=f"{url}/data.zip", relative_dest="local/out")
    )
    assert (td.local / "out" / "data" / "a.txt").read_bytes() == b"a"
    assert (td.local / "out" / "b.txt").read_bytes() == b"b"


async def test_archive_false_keeps_it_packed_and_archive_names_the_format(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    packed = tar_gz({"x.txt": b"x"})
    files.files["/keep.tar.gz"] = packed
    files.files["/download"] = packed
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(
            getter_source=f"{url}/keep.tar.gz",
            getter_options={"archive": "false"},
            relative_dest="local/",
        ),
    )
    assert (td.local / "keep.tar.gz").read_bytes() == packed
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(
            getter_source=f"{url}/download",
            getter_options={"archive": "tgz"},
            relative_dest="local/",
        ),
    )
    assert (td.local / "x.txt").read_bytes() == b"x"


async def test_a_gzipped_file_unpacks_to_a_file_only(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/notes.txt.gz"] = gzip.compress(b"notes")
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(
            getter_source=f"{url}/notes.txt.gz", getter_mode="file", relative_dest="local/notes"
        ),
    )
    assert (td.local / "notes").read_bytes() == b"notes"
    with pytest.raises(ArtifactError, match="only unarchive to a single file"):
        await fetch(
            tmp_path, pb.TaskArtifact(getter_source=f"{url}/notes.txt.gz", relative_dest="local/")
        )


async def test_mode_file_takes_the_one_file_of_an_archive(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    """mode "file" with an archive: its single file at the destination (read
    after every member was listed and checked), else refused."""
    url, files = server
    files.files["/one.tar.gz"] = tar_gz({"only.txt": b"one"})
    files.files["/one.zip"] = zip_bytes({"only.txt": b"zipped"})
    files.files["/two.tar.gz"] = tar_gz({"a": b"a", "b": b"b"})
    for name, expected in (("one.tar.gz", b"one"), ("one.zip", b"zipped")):
        td = await fetch(
            tmp_path,
            pb.TaskArtifact(
                getter_source=f"{url}/{name}", getter_mode="file", relative_dest="local/it"
            ),
        )
        assert (td.local / "it").read_bytes() == expected, name
    with pytest.raises(ArtifactError, match="expected a single file"):
        await fetch(
            tmp_path,
            pb.TaskArtifact(
                getter_source=f"{url}/two.tar.gz", getter_mode="file", relative_dest="local/two"
            ),
        )
    assert not (td.local / "two").exists()


@pytest.mark.parametrize(
    ("source", "split"),
    [
        ("https://h/app.tar.gz", ("https://h/app.tar.gz", "")),
        ("https://h/app.tar.gz//bin", ("https://h/app.tar.gz", "bin")),
        ("https://h/app.zip//a/b?x=1", ("https://h/app.zip?x=1", "a/b")),
        ("file::/srv/app.tgz//conf", ("file::/srv/app.tgz", "conf")),
    ],
)
def test_split_subdir_as_go_getter(source: str, split: tuple[str, str]) -> None:
    assert split_subdir(source) == split


async def test_a_subdir_keeps_only_that_part_of_the_archive(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    files.files["/rel.tar.gz"] = tar_gz(
        {
            "app-1.2/bin/run.sh": b"echo",
            "app-1.2/bin/sub/x": b"x",
            "app-1.2/README": b"r",
            "docs/one": b"1",
        }
    )
    for subdir in ("app-1.2/bin", "app-*/bin"):
        td = await fetch(
            tmp_path,
            pb.TaskArtifact(getter_source=f"{url}/rel.tar.gz//{subdir}", relative_dest="local/b"),
        )
        assert (td.local / "b" / "run.sh").read_bytes() == b"echo", subdir
        assert (td.local / "b" / "sub" / "x").read_bytes() == b"x", subdir
        assert not (td.local / "b" / "README").exists() and not (td.local / "b" / "docs").exists()
    for subdir, problem in (
        ("nope", "subdir 'nope' not found in the archive"),
        ("*", "subdir '\\*' matches multiple paths"),
        ("app-1.2/README", "not found in the archive"),  # a file, not a directory
    ):
        with pytest.raises(ArtifactError, match=problem):
            await fetch(
                tmp_path,
                pb.TaskArtifact(getter_source=f"{url}/rel.tar.gz//{subdir}"),
            )
    files.files["/plain.txt"] = b"p"
    with pytest.raises(ArtifactError, match="the source is not an archive"):
        await fetch(tmp_path, pb.TaskArtifact(getter_source=f"{url}/plain.txt//x"))
    assert files.requests[-1][0] == "/plain.txt"  # the subdir is not sent


async def test_zstd_archives_and_files_unpack(tmp_path: Path, server: tuple[str, Files]) -> None:
    """go-getter's zstd formats: tar.zst (and tzst) into a directory, or its
    one file with mode "file"; a zst file to a file; corrupt or oversized
    data refused (the tar is spooled, so its size is bounded too)."""
    url, files = server
    zstd = zstandard.ZstdCompressor()
    plain_tar = tarfile_bytes({"site/index.html": b"<p>zstd", "run.sh": b"echo"})
    files.files["/site.tar.zst"] = zstd.compress(plain_tar)
    files.files["/one.tzst"] = zstd.compress(tarfile_bytes({"only.txt": b"one"}))
    files.files["/notes.zst"] = zstd.compress(b"notes")
    files.files["/broken.tar.zst"] = b"\x28\xb5\x2f\xfd not really zstd"
    files.files["/big.tar.zst"] = zstd.compress(tarfile_bytes({"big": b"\0" * 200_000}))
    td = await fetch(
        tmp_path, pb.TaskArtifact(getter_source=f"{url}/site.tar.zst", relative_dest="local/")
    )
    assert (td.local / "site" / "index.html").read_bytes() == b"<p>zstd"
    assert (td.local / "run.sh").stat().st_mode & 0o7777 == 0o755
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(
            getter_source=f"{url}/one.tzst", getter_mode="file", relative_dest="local/one"
        ),
    )
    assert (td.local / "one").read_bytes() == b"one"
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(
            getter_source=f"{url}/notes.zst", getter_mode="file", relative_dest="local/notes"
        ),
    )
    assert (td.local / "notes").read_bytes() == b"notes"
    with pytest.raises(ArtifactError, match="cannot unpack the zstd archive"):
        await fetch(
            tmp_path, pb.TaskArtifact(getter_source=f"{url}/broken.tar.zst", relative_dest="local/")
        )
    with pytest.raises(ArtifactError, match="unpacks to more than 10000 bytes"):
        await fetch(
            tmp_path,
            pb.TaskArtifact(getter_source=f"{url}/big.tar.zst", relative_dest="local/"),
            decompression_size_limit=10_000,
            decompression_file_count_limit=3,
        )
    assert not list((tmp_path / "staging").iterdir())  # nothing left spooled


@pytest.mark.parametrize(
    ("archive", "problem"),
    [
        (tar_gz({"../../evil": b"x"}), "escapes the destination"),
        (tar_gz({"/etc/evil": b"x"}), "absolute path"),
        (tar_gz({"ok": b"x"}, links={"link": "/etc/passwd"}), "is a link"),
        (zip_bytes({"../evil.txt": b"x"}), "escapes the destination"),
    ],
    ids=["tar-dotdot", "tar-absolute", "tar-symlink", "zip-dotdot"],
)
async def test_archives_that_leave_their_destination_are_refused(
    tmp_path: Path, server: tuple[str, Files], archive: bytes, problem: str
) -> None:
    url, files = server
    name = "/evil.zip" if archive.startswith(b"PK") else "/evil.tar.gz"
    files.files[name] = archive
    with pytest.raises(ArtifactError, match=problem):
        await fetch(tmp_path, pb.TaskArtifact(getter_source=f"{url}{name}", relative_dest="local/"))
    assert not (tmp_path / "evil").exists() and not list(tmp_path.rglob("evil*"))


async def test_a_symlink_the_task_left_is_not_written_through(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    url, files = server
    outside = tmp_path / "outside"
    outside.mkdir()
    td = task_dir(tmp_path)
    (td.local / "conf").symlink_to(outside)  # a task's trap from an earlier run
    files.files["/conf.tar.gz"] = tar_gz({"conf/app.ini": b"x"})
    with pytest.raises(ArtifactError, match="not a directory"):
        await fetch(
            tmp_path, pb.TaskArtifact(getter_source=f"{url}/conf.tar.gz", relative_dest="local/")
        )
    assert not list(outside.iterdir())
    (td.local / "plain").symlink_to(outside / "written")
    files.files["/plain"] = b"data"
    await fetch(tmp_path, pb.TaskArtifact(getter_source=f"{url}/plain", relative_dest="local/"))
    assert not (outside / "written").exists()
    assert (td.local / "plain").read_bytes() == b"data" and not (td.local / "plain").is_symlink()


async def test_the_decompression_limits_hold(tmp_path: Path, server: tuple[str, Files]) -> None:
    url, files = server
    files.files["/many.tar.gz"] = tar_gz({f"f{i}": b"x" for i in range(5)})
    files.files["/large.tar.gz"] = tar_gz({"big": b"\0" * 100_000})
    with pytest.raises(ArtifactError, match="more than 3 files"):
        await fetch(
            tmp_path,
            pb.TaskArtifact(getter_source=f"{url}/many.tar.gz", relative_dest="local/"),
            decompression_file_count_limit=3,
        )
    with pytest.raises(ArtifactError, match="unpacks to more than"):
        await fetch(
            tmp_path,
            pb.TaskArtifact(getter_source=f"{url}/large.tar.gz", relative_dest="local/"),
            decompression_size_limit=10_000,
        )


async def test_destinations_stay_in_the_alloc(tmp_path: Path, server: tuple[str, Files]) -> None:
    url, files = server
    files.files["/shared.txt"] = b"s"
    td = await fetch(
        tmp_path,
        pb.TaskArtifact(getter_source=f"{url}/shared.txt", relative_dest="../alloc/data"),
    )
    assert (td.alloc_dir / "data" / "shared.txt").read_bytes() == b"s"
    with pytest.raises(ArtifactError, match="escapes alloc directory"):
        await fetch(
            tmp_path, pb.TaskArtifact(getter_source=f"{url}/shared.txt", relative_dest="../../x")
        )


# ------------------------------------------------------------ file:: sources


async def test_file_sources_only_from_allowed_directories(tmp_path: Path) -> None:
    allowed = tmp_path / "artifacts"
    allowed.mkdir()
    (allowed / "tool").write_bytes(b"tool")
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    source = pb.TaskArtifact(getter_source=f"file::{allowed}/tool", relative_dest="local/")
    with pytest.raises(ArtifactError, match="file:: sources are refused"):
        await fetch(tmp_path, source)
    td = await fetch(tmp_path, source, file_dirs=(str(allowed),))
    assert (td.local / "tool").read_bytes() == b"tool"
    # a path that climbs out of the allowed directory is still refused
    climb = pb.TaskArtifact(getter_source=f"file::{allowed}/../secret", relative_dest="local/")
    with pytest.raises(ArtifactError, match="refused"):
        await fetch(tmp_path, climb, file_dirs=(str(allowed),))
    assert os.path.exists(secret)


# ------------------------------------------------------------ in the task runner


async def test_artifacts_are_fetched_once_even_across_an_agent_restart(
    tmp_path: Path, server: tuple[str, Files]
) -> None:
    """The runner's artifact hook: fetched before the first start (its
    event), not again when the task restarts, nor when it restarts after a
    restarted agent adopted it (the client state keeps what was fetched)."""
    url, files = server
    files.files["/once.txt"] = b"fetched"
    web = sh("web", "echo start; exec sleep 600")
    web.artifacts.add(getter_source=f"{url}/once.txt", relative_dest="local/")
    run = Run(tmp_path, job(web, kind="service"))
    run.runner.start()
    fetched = lambda: sum(1 for path, _ in files.requests if path == "/once.txt")  # noqa: E731
    try:
        await until(lambda: run.state("web").state == "running")
        local = AllocDir.of(tmp_path, run.alloc.id).task("web").local
        assert (local / "once.txt").read_bytes() == b"fetched"
        assert run.events("web").count("Downloading Artifacts") == 1 and fetched() == 1
        await asyncio.wait_for(run.runner.restart("web"), 20)
        await until(lambda: run.state("web").state == "running")
        await run.runner.detach()
        await run.reopen()
        await asyncio.wait_for(run.runner.restart("web"), 20)
        await until(lambda: run.state("web").state == "running" and run.state("web").restarts == 2)
        assert fetched() == 1
        assert run.events("web").count("Downloading Artifacts") <= 1  # the last ten events
    finally:
        await asyncio.wait_for(run.runner.stop(), 20)
