"""data_prep download against a loopback HTTP server serving a tiny release in the official layout (a tar of
cosmo-released files): parallel Range parts, a connection dropped mid-file (resumed with Range, in the same run
and in the next), a server that refuses Range, a flipped byte (refused with the file's name), an expected sha256,
the free-space check, the Globus-only release and local copies. The real hosts are not reachable from here."""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import shutil
import socket
import tarfile
import threading
import types
from pathlib import Path

import pytest

from common.io.manifest import load_manifest
from data_prep import download
from data_prep.__main__ import main as data_prep_main
from tests.unit.test_cosmo_convert import make_universes
from tests.unit.test_deepcam_convert import make_dataset

FOLDER = "cosmoUniverse_2019_05_4parE_tf_v2"
ARCHIVE = f"{FOLDER}.tar"
PATH = f"/cosmo/{ARCHIVE}"
FILES_PER_SPLIT = 8  # one 8^3 universe per split, cut into 4^3 samples


# ---------------------------------------------------------------------------- the release and the server
@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> bytes:
    """The release's layout (train/ and validation/ of one-sample GZIP TFRecords) as an uncompressed tar."""
    universes = make_universes(tmp_path_factory.mktemp("universes"), 2, size=8)
    release = tmp_path_factory.mktemp("release") / FOLDER
    assert data_prep_main(["cosmo-released", "--input", str(universes), "--out", str(release), "--sample-size", "4",
                           "--val-universes", "1", "--workers", "1"]) == 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(release, arcname=FOLDER)
    return buffer.getvalue()


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


class Handler(http.server.BaseHTTPRequestHandler):
    """GET of the server's files, with Range unless refused, and the faults the server is set to."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        state, asked = self.server.state, self.headers.get("Range")
        data = state.files.get(self.path)
        if data is None:
            state.record(self.path, asked, 0, 0)  # before the answer, which the client may act on at once
            return self.send_error(404)
        if state.flip_at is not None:
            data = data[:state.flip_at] + bytes([data[state.flip_at] ^ 0xFF]) + data[state.flip_at + 1:]
        honoured = asked and not (state.refuse_range == "always"
                                  or (state.refuse_range == "after-probe" and asked != "bytes=0-0"))
        first, last = (int(v or len(data) - 1) for v in asked[6:].split("-")) if honoured else (0, len(data) - 1)
        body = data[first:last + 1]
        self.send_response(206 if honoured else 200)
        if honoured:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        self._send(state, body, first, asked)

    def _send(self, state, body: bytes, first: int, asked: str | None) -> None:
        cut = state.take_drop(first, len(body), asked)
        state.record(self.path, asked, first, cut)  # before the bytes, which the client may act on at once
        try:
            self.wfile.write(body[:cut])
        except (BrokenPipeError, ConnectionResetError):  # the probe of a server without Range hangs up
            return
        if cut != len(body):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)


class Server:
    """A loopback ThreadingHTTPServer of `files` (URL path -> bytes) that logs every GET: (path, Range header,
    first byte, body bytes sent)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.log, self.lock = files, [], threading.Lock()
        self.drop_at: int | None = None  # the next answer that holds this offset stops there, once
        self.refuse_range: str | None = None  # "always", or "after-probe" (honours only bytes=0-0)
        self.flip_at: int | None = None  # this byte of every file is served inverted
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.state = self
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/cosmo/"

    def take_drop(self, first: int, size: int, asked: str | None) -> int:
        with self.lock:
            if self.drop_at is not None and asked != "bytes=0-0" and first <= self.drop_at < first + size:
                cut, self.drop_at = self.drop_at - first, None
                return cut
        return size

    def record(self, path: str, asked: str | None, first: int, sent: int) -> None:
        with self.lock:
            self.log.append({"path": path, "range": asked, "first": first, "sent": sent})

    def gets(self) -> list[dict]:
        """The file's GETs after the probe's (bytes=0-0)."""
        return [e for e in self.log if e["range"] != "bytes=0-0"]


@pytest.fixture
def server(tarball):
    srv = Server({PATH: tarball})
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """Parts of 4 kB, back-off of milliseconds, no proxy between this process and the loopback server."""
    monkeypatch.setattr(download, "MIN_PART_BYTES", 4096)
    monkeypatch.setattr(download, "BACKOFF_SECONDS", 0.001)
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def fetch(out: Path, *extra: str, base: str | None = None, name: str = "cosmoflow") -> int:
    mirror = ["--mirror", base] if base else []
    return data_prep_main(["download", name, "--out", str(out), *mirror, "--workers", "1", *extra])


def message(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def assert_nothing_looks_complete(out: Path) -> None:
    """No final name: no release folder, no manifest, no archive, no record; no temporary folder left."""
    names = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert FOLDER not in names and ARCHIVE not in names and f"{ARCHIVE}.fetch.json" not in names, names
    assert not (out / "index" / "manifest.json").exists()
    assert not [n for n in names if ".tmp-" in n], names


# ---------------------------------------------------------------------------- fetching
def test_the_release_is_fetched_in_parallel_parts_extracted_and_indexed(server, tarball, tmp_path, capsys):
    out = tmp_path / "data"
    assert fetch(out, "--parts", "3", base=server.base) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([FOLDER, "index", f"{ARCHIVE}.fetch.json"])
    assert sorted(p.name for p in (out / FOLDER).iterdir()) == ["train", "validation"]
    manifest = load_manifest(out / "index")
    assert manifest.splits["train"].samples == manifest.splits["validation"].samples == FILES_PER_SPLIT
    assert (out / "index" / "train").resolve() == (out / FOLDER / "train").resolve()
    record = json.loads((out / f"{ARCHIVE}.fetch.json").read_text())
    assert record["sha256"] == hashlib.sha256(tarball).hexdigest() and record["bytes"] == len(tarball)
    assert record["url"] == server.base + ARCHIVE and record["expected_sha256"] is None
    gets = server.gets()  # three parts, each one Range request, together the file once
    assert len(gets) == 3 and all(g["range"].startswith("bytes=") for g in gets)
    assert sorted(g["first"] for g in gets)[0] == 0 and sum(g["sent"] for g in gets) == len(tarball)
    err = capsys.readouterr().err
    assert "download " in err and "B/s" in err  # the progress bar: rate and time left
    requests = len(server.log)
    assert fetch(out, base=server.base) == 0  # a rerun finds it complete and asks nothing
    assert len(server.log) == requests


def test_a_dropped_connection_is_resumed_with_range(server, tarball, tmp_path, capsys):
    server.drop_at = len(tarball) // 2
    out = tmp_path / "data"
    assert fetch(out, "--parts", "1", "--keep-archive", base=server.base) == 0
    first, second = server.gets()
    assert first["range"] == f"bytes=0-{len(tarball) - 1}" and first["sent"] == len(tarball) // 2
    assert second["range"] == f"bytes={len(tarball) // 2}-{len(tarball) - 1}"  # only the rest was asked for
    assert first["sent"] + second["sent"] == len(tarball)
    assert "retry 1 of 10" in message(capsys)
    assert (out / ARCHIVE).read_bytes() == tarball and (out / "index" / "manifest.json").is_file()
    shutil.rmtree(out / FOLDER)
    requests = len(server.log)
    assert fetch(out, base=server.base) == 0  # the kept archive is extracted and indexed again, nothing fetched
    assert len(server.log) == requests and (out / "index" / "manifest.json").is_file()


def test_an_interrupted_download_resumes_in_the_next_run(server, tarball, tmp_path, capsys):
    server.drop_at = len(tarball) // 3
    out = tmp_path / "data"
    assert fetch(out, "--parts", "1", "--retries", "0", base=server.base) == 2
    said = message(capsys)
    assert "connection closed after" in said and "rerun the command to resume" in said
    assert sorted(p.name for p in out.iterdir()) == [f"{ARCHIVE}.part", f"{ARCHIVE}.part.json"]
    assert_nothing_looks_complete(out)
    state = json.loads((out / f"{ARCHIVE}.part.json").read_text())
    assert state["segments"][0]["done"] == len(tarball) // 3
    assert fetch(out, "--parts", "1", base=server.base) == 0
    assert server.gets()[-1]["range"] == f"bytes={len(tarball) // 3}-{len(tarball) - 1}"
    assert "resuming" in message(capsys) and (out / "index" / "manifest.json").is_file()
    assert not (out / f"{ARCHIVE}.part").exists() and not (out / f"{ARCHIVE}.part.json").exists()


def test_a_server_that_refuses_range_is_read_whole_from_the_start(server, tarball, tmp_path, capsys):
    server.refuse_range, server.drop_at = "always", len(tarball) // 2
    out = tmp_path / "data"
    assert fetch(out, "--parts", "3", base=server.base) == 0
    assert [(g["range"], g["first"], g["sent"]) for g in server.gets()] == [
        (None, 0, len(tarball) // 2), (None, 0, len(tarball))]  # one stream, dropped, then again from byte 0
    assert json.loads((out / f"{ARCHIVE}.fetch.json").read_text())["sha256"] == hashlib.sha256(tarball).hexdigest()
    assert "retry 1 of 10" in message(capsys)


def test_a_server_that_refuses_range_after_the_probe_is_read_whole(server, tarball, tmp_path, capsys):
    server.refuse_range = "after-probe"
    out = tmp_path / "data"
    assert fetch(out, "--parts", "3", base=server.base) == 0
    last = server.gets()[-1]
    assert last["range"] is None and last["sent"] == len(tarball)
    assert "fetching it whole" in message(capsys) and (out / "index" / "manifest.json").is_file()


# ---------------------------------------------------------------------------- refusing
def test_a_corrupt_record_is_refused_naming_its_file_and_nothing_is_left(server, tarball, tmp_path, capsys):
    record = [m for m in members(tarball) if m.name.endswith(".tfrecord") and "/train/" in m.name][2]
    server.flip_at = record.offset_data + record.size // 2
    out = tmp_path / "data"
    assert fetch(out, base=server.base) == 2
    said = message(capsys)
    assert Path(record.name).name in said and ARCHIVE in said and "a rerun fetches it again" in said
    assert "No manifest was written" not in said  # index's advice to replace the file: here it is fetched again
    assert_nothing_looks_complete(out)
    assert sorted(p.name for p in out.iterdir()) == []  # the fetched archive and its state too


def test_a_damaged_tar_header_is_refused_naming_the_archive(server, tarball, tmp_path, capsys):
    server.flip_at = members(tarball)[3].offset + 10  # in a member's name: its header checksum fails
    out = tmp_path / "data"
    assert fetch(out, base=server.base) == 2
    said = message(capsys)
    assert f"{ARCHIVE}.part" in said and "damaged header" in said
    assert_nothing_looks_complete(out)
    assert list(out.iterdir()) == []


def test_a_sha256_that_differs_is_refused(server, tarball, tmp_path, capsys, monkeypatch):
    known = hashlib.sha256(tarball).hexdigest()
    record = next(m for m in members(tarball) if m.name.endswith(".tfrecord"))
    server.flip_at = record.offset_data + 1  # the digest sees it before index would
    out = tmp_path / "data"
    assert fetch(out, "--sha256", known, base=server.base) == 2
    said = message(capsys)
    assert f"expected {known}" in said and ARCHIVE in said
    assert_nothing_looks_complete(out)
    server.flip_at = None  # a registry entry that knows the digest checks it too
    entry = download.REGISTRY["cosmoflow"]
    archive = dataclasses.replace(entry.archive, sha256=known)
    monkeypatch.setitem(download.REGISTRY, "cosmoflow", dataclasses.replace(entry, archive=archive))
    assert fetch(out, base=server.base) == 0
    assert json.loads((out / f"{ARCHIVE}.fetch.json").read_text())["expected_sha256"] == known


def test_too_little_free_space_is_refused_before_fetching(server, tarball, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(total=10**9, used=10**9, free=500))
    out = tmp_path / "data"
    assert fetch(out, base=server.base) == 2
    said = message(capsys)
    assert "500 bytes free" in said and "still to fetch" in said and "to extract" in said
    assert server.gets() == [] and list(out.iterdir()) == []


def test_an_http_error_names_the_url_and_is_not_retried(server, tmp_path, capsys):
    out = tmp_path / "data"
    assert fetch(out, base=server.base.replace("/cosmo/", "/elsewhere/")) == 2
    said = message(capsys)
    assert "/elsewhere/" + ARCHIVE in said and "HTTP 404" in said and len(server.log) == 1


# ---------------------------------------------------------------------------- without HTTP
def test_a_local_archive_is_extracted_and_indexed_where_it_lies(tarball, tmp_path):
    archive = tmp_path / "got" / ARCHIVE
    archive.parent.mkdir()
    archive.write_bytes(tarball)
    out = tmp_path / "data"
    assert fetch(out, "--local", str(archive)) == 0
    assert (out / "index" / "manifest.json").is_file() and archive.read_bytes() == tarball
    assert json.loads((out / f"{ARCHIVE}.fetch.json").read_text())["url"] == archive.resolve().as_uri()


def test_deepcam_prints_the_globus_steps_and_takes_a_local_copy(tmp_path, capsys):
    out = tmp_path / "data"
    assert fetch(out, name="deepcam") == 2
    said = capsys.readouterr()
    assert "0b226e2c-4de0-11ea-971a-021304b0cca7" in said.out and "--local" in said.err
    assert not out.exists()
    local = make_dataset(tmp_path / "globus" / "All-Hist", train=3, validation=2)
    assert fetch(out, "--local", str(local), name="deepcam") == 0
    assert (out / "All-Hist").resolve() == local.resolve()
    assert load_manifest(out / "index").splits["train"].samples == 3
