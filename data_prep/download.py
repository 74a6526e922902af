"""Fetch an official dataset, unpack it and index it: cosmoflow (1.7 TB over HTTPS), cosmoflow-small, deepcam (Globus).

    python -m data_prep download NAME --out DIR [--mirror BASE_URL | --local PATH] [--sha256 HEX] [--parts N]
                                               [--retries N] [--keep-archive] [--workers K] [--verify full|quick]

NAME is one of the registry below (REGISTRY; sources: the reference's cosmoflow/README.md and deepcam/README.md,
github.com/mlcommons/hpc):

  cosmoflow         cosmoUniverse_2019_05_4parE_tf_v2.tar, the MLPerf HPC v1.0+ release (1.7 TB), over HTTPS from
                    https://portal.nersc.gov/project/dasrepo/cosmoflow-benchmark/
  cosmoflow-small   cosmoUniverse_2019_05_4parE_tf_small.tgz (179 MB, 32 + 32 samples of the v0.7 layout:
                    uncompressed records, which index reads too), from the same folder
  deepcam           the All-Hist folder (8.8 TB), published through Globus only: the command prints the endpoint
                    and the steps; with --local PATH it takes the copy Globus wrote

DIR ends as

  DIR/<release folder>/            the release, extracted (cosmoUniverse_2019_05_4parE_tf_v2/train, val, test)
  DIR/index/manifest.json          what training reads (data.dir=DIR/index): `data_prep index` of the release
                                   (deepcam: `data_prep deepcam-convert` of All-Hist into TFRecords)
  DIR/<archive>.fetch.json         what was fetched: URL, size, sha256 and xxh3-128 of the archive
  DIR/<archive>                    the archive itself, only with --keep-archive

The archive is fetched into DIR/<archive>.part, in --parts HTTP Range requests in parallel (files of at least
MIN_PART_BYTES per part), each retried --retries times with exponential back-off; DIR/<archive>.part.json holds
how far each part got, so a rerun of the same command resumes where the last one stopped (a server that refuses
Range is read whole, from the start on every try). Every response's Content-Range and Content-Length are checked
against the file's size. Free space for the rest of the download and the extraction is checked first. The
archive is then read once: its sha256 and xxh3-128 are computed (and compared with --sha256, or the registry's,
when one is known: the NERSC portal publishes none) while it is extracted into DIR/.<folder>.tmp-PID, renamed to
DIR/<folder> only when complete; every byte after the tar's last member must be zero (a damaged header would end
a tar early). Then index checks every record (GZIP and record CRCs with --verify full) and writes DIR/index; it
is ready when DIR/index/manifest.json exists. Content refused there (a file that fails its CRC, a sha256 that
differs) removes the extracted folder, DIR/index, the record and the fetched archive, so that nothing refused
looks complete, and the message names the file; a rerun fetches it again. Progress goes to stderr with rate and
time left. --mirror BASE_URL fetches the same file names from a site's own copy. docs/datasets.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import os
import random
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Literal

from common.base import documents
from common.base.documents import Count, check
from common.base.errors import BenchError
from common.base.files import remove_path, temp_path
from common.io.manifest import MANIFEST_NAME
from data_prep import tfrecords

INDEX_DIR = "index"  # DIR/index: the manifest training reads
PART_SUFFIX, STATE_SUFFIX, RECORD_SUFFIX = ".part", ".part.json", ".fetch.json"
MIN_PART_BYTES = 64 << 20  # a file is cut into parts of at least this size
DEFAULT_PARTS, DEFAULT_RETRIES = 4, 10
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 60.0  # the wait before retry k: BACKOFF_SECONDS * 2^(k-1), capped
TIMEOUT_SECONDS = 60.0  # a connection that sends nothing for this long is dropped and retried
RETRY_STATUS = (408, 425, 429, 500, 502, 503, 504)  # HTTP answers worth another try
SAVE_SECONDS = 2.0  # the part state is synced this often
CHUNK_BYTES = 1 << 20
SPACE_MARGIN = 1.01  # the free-space check asks for 1% more than the estimate
USER_AGENT = "hpc-sciml-bench data_prep download"
INDEX_ADVICE = " No manifest was written"  # how index's refusal goes on, after the files it names
PREPARE_MODULES = {"index": "data_prep.index", "deepcam-convert": "data_prep.deepcam_convert"}


# ---------------------------------------------------------------------------- the registry
@dataclasses.dataclass(frozen=True)
class Archive:
    """A release's file on an HTTP server."""

    name: str
    bytes: int  # as published (the portal says 1.7 TB); the server's Content-Length is what is checked
    extracted_bytes: int  # its size extracted: with `bytes`, the ratio the free-space check uses
    sha256: str | None = None  # None: the publisher gives none


@dataclasses.dataclass(frozen=True)
class Release:
    """An official dataset: where it is published and what the suite makes of it."""

    name: str
    title: str
    folder: str  # the folder it ends in: DIR/<folder>
    base_url: str | None  # the folder that holds `archive`; None: not published over HTTP
    archive: Archive | None
    globus: str  # the Globus endpoint the reference's README names
    prepare: Literal["index", "deepcam-convert"]  # the data_prep command that makes DIR/index of DIR/<folder>


NERSC_COSMOFLOW = "https://portal.nersc.gov/project/dasrepo/cosmoflow-benchmark/"  # cosmoflow/README.md
REGISTRY = {r.name: r for r in (
    Release("cosmoflow", "CosmoFlow, the MLPerf HPC v1.0+ release: 524,288 + 65,536 samples, GZIP TFRecords",
            "cosmoUniverse_2019_05_4parE_tf_v2", NERSC_COSMOFLOW,
            Archive("cosmoUniverse_2019_05_4parE_tf_v2.tar", 1_700_000_000_000, 1_700_000_000_000),
            "https://app.globus.org/file-manager?origin_id=31647fba-a006-4322-ad3e-9a4f124db422", "index"),
    Release("cosmoflow-small", "CosmoFlow's getting-started tarball, v0.7 layout: 32 + 32 uncompressed samples",
            "cosmoUniverse_2019_05_4parE_tf_small", NERSC_COSMOFLOW,
            Archive("cosmoUniverse_2019_05_4parE_tf_small.tgz", 179_000_000, 64 * 16_800_000),  # 64 x 16 MiB
            "https://app.globus.org/file-manager?origin_id=31647fba-a006-4322-ad3e-9a4f124db422", "index"),
    Release("deepcam", "DeepCAM, the CAM5 + TECA All-Hist data: 121,266 + 15,158 HDF5 snapshots, 8.8 TB",
            "All-Hist", None, None,
            "https://app.globus.org/file-manager?origin_id=0b226e2c-4de0-11ea-971a-021304b0cca7&origin_path=%2F",
            "deepcam-convert"),
)}


# ---------------------------------------------------------------------------- the documents it writes
@dataclasses.dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of the file, of which the first `done` are written and synced."""

    start: Count
    end: Count
    done: Count

    def __post_init__(self):
        check(self.start <= self.end, "end", self.end, f"an offset >= start {self.start}")
        check(self.done <= self.end - self.start, "done", self.done, f"at most {self.end - self.start} bytes")


@dataclasses.dataclass(frozen=True)
class PartState:
    """DIR/<archive>.part.json: the download in DIR/<archive>.part, for resuming it."""

    url: str
    bytes: Count  # the whole file's, as the server said
    validator: str  # the server's ETag or Last-Modified ("" when it sent neither)
    ranges: bool  # the server honours Range
    segments: tuple[Segment, ...]

    @property
    def fetched(self) -> int:
        return sum(s.done for s in self.segments)


@dataclasses.dataclass(frozen=True)
class FetchRecord:
    """DIR/<archive>.fetch.json: what was fetched, written once the archive is extracted and its digests known."""

    release: str
    file: str
    url: str  # or the file:// URI of a --local archive
    bytes: Count
    sha256: str
    xxh3_128: str
    expected_sha256: str | None  # what sha256 was compared with; None: nothing published
    folder: str
    written: str  # UTC, ISO 8601


@dataclasses.dataclass(frozen=True)
class Remote:
    """The file as the server describes it."""

    url: str
    bytes: int
    ranges: bool
    validator: str


@dataclasses.dataclass(frozen=True)
class Placed:
    """DIR/<folder> as this run found or made it."""

    folder: Path
    origin: str  # the URL or path it came from, for messages
    owned: bool  # extracted by this command (removed when its content is refused), not a link to a local folder
    fetched: bool  # its archive is DIR/<archive>.part (removed with it)


class _Corrupt(BenchError):
    """Content that cannot be the release's: what was fetched is discarded."""


class _Transient(Exception):
    """A failure worth another try (a dropped connection, a timeout, HTTP 5xx)."""


class _RangeRefused(Exception):
    """The server answered a Range request with the whole file."""


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(f"{r.name} ({r.title})" for r in REGISTRY.values())
    parser.add_argument("name", choices=sorted(REGISTRY), metavar="NAME", help=f"the dataset: {names}")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="directory the release is fetched, extracted and indexed into (DIR/index)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mirror", metavar="BASE_URL",
                        help="a site's copy: the http(s) URL of the folder that holds the release's files under "
                             "the same names, in place of the registry's")
    source.add_argument("--local", type=Path, metavar="PATH",
                        help="a copy already here (from Globus): the archive, or the release's folder (deepcam: "
                             "All-Hist); it is read, never changed")
    parser.add_argument("--sha256", type=_sha256, metavar="HEX",
                        help="the archive's expected sha256, where the mirror publishes one (the portal does not)")
    parser.add_argument("--parts", type=tfrecords.positive_int, default=DEFAULT_PARTS, metavar="N",
                        help="parallel Range requests for a large file (default: %(default)s)")
    parser.add_argument("--retries", type=_non_negative, default=DEFAULT_RETRIES, metavar="N",
                        help="how often a failed request is tried again, with back-off, before the run stops; "
                             "counted anew after one that gained bytes (default: %(default)s)")
    parser.add_argument("--keep-archive", action="store_true",
                        help="keep the fetched archive as DIR/<archive> (default: removed once indexed)")
    parser.add_argument("--workers", type=tfrecords.positive_int, default=tfrecords.available_cpus(), metavar="K",
                        help="processes of the index (or deepcam-convert) step (default: CPUs available, %(default)s)")
    parser.add_argument("--verify", choices=("full", "quick"), default="full",
                        help="index's check of every file: full reads every record (default), quick hashes")


def run(args: argparse.Namespace) -> int:
    release = REGISTRY[args.name]
    check_options(release, args)
    out, started = args.out, time.perf_counter()
    if not ready(release, out):
        make_out(out)
        placed = place(release, args)
        prepare(release, args, placed)
    done = finish(release, args)
    print(f"download: {release.name}: {out / release.folder} and its {release.prepare} in {out / INDEX_DIR} "
          f"({done}) after {time.perf_counter() - started:.1f} s; train with data.dir={out / INDEX_DIR}", flush=True)
    return 0


def _sha256(text: str) -> str:
    value = text.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not 64 hexadecimal digits")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def check_options(release: Release, args: argparse.Namespace) -> None:
    """Refuse what the release cannot do; for a Globus-only release without --local, print the steps first."""
    if args.local is not None and not (args.local.is_file() or args.local.is_dir()):
        what = "no such file or directory" if not args.local.exists() else "neither a file nor a directory"
        raise BenchError(f"--local {args.local}: {what}; expected the release's archive or its folder "
                         f"({release.folder})")
    if release.archive is None and args.local is None:
        print(globus_steps(release), flush=True)
        raise BenchError(f"{release.name}: published through Globus only, so nothing was fetched; transfer "
                         f"{release.folder} as above, then rerun with --local PATH/{release.folder}")
    if release.archive is None and (not args.local.is_dir() or args.sha256):
        raise BenchError(f"--local {args.local}: {release.name} has no archive; expected its folder "
                         f"{release.folder} (train/, validation/, stats.h5)")
    if args.mirror is not None and not args.mirror.startswith(("http://", "https://")):
        raise BenchError(f"--mirror {args.mirror}: expected an http:// or https:// URL of the folder holding "
                         f"{release.archive.name}")
    if args.sha256 and args.local is not None and args.local.is_dir():
        raise BenchError(f"--sha256 checks an archive, but --local {args.local} is a folder")


def make_out(out: Path) -> None:
    """DIR, created when missing; BenchError when it cannot be."""
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {out}: exists and is not a directory; expected the directory to fetch into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BenchError(f"--out {out}: cannot be created ({err.strerror}); expected a directory path this user "
                         f"may write") from None


def globus_steps(release: Release) -> str:
    """How to get a release through Globus, as the reference's README says, and how to hand it to this command."""
    endpoint = release.globus.split("origin_id=")[1].split("&")[0]
    return "\n".join([
        f"{release.name}: {release.title}.",
        f"The reference (github.com/mlcommons/hpc, {release.name}/README.md) publishes it through Globus:",
        f"  {release.globus}",
        "Steps:",
        "  1. Sign in at https://app.globus.org (with your institution's login) and open the endpoint above.",
        "  2. In the other panel, open your site's Globus collection, in a folder with room for the data.",
        f"  3. Select the {release.folder} folder (beside the dataset's README) and start the transfer; or, with "
        f"the Globus CLI:",
        f"     globus transfer --recursive {endpoint}:/<path to {release.folder}> <your collection>:/<path>/"
        f"{release.folder}",
        "  4. When it has finished:",
        f"     python -m data_prep download {release.name} --local /<path>/{release.folder} --out DIR",
    ])


def ready(release: Release, out: Path) -> bool:
    """The release is there from an earlier run: its folder and DIR/index/manifest.json (written last)."""
    return (out / release.folder).is_dir() and (out / INDEX_DIR / MANIFEST_NAME).is_file()


def paths(release: Release, out: Path) -> dict[str, Path]:
    """The names this command writes in DIR for the release's archive."""
    name = release.archive.name if release.archive else release.folder
    return {"part": out / (name + PART_SUFFIX), "state": out / (name + STATE_SUFFIX),
            "record": out / (name + RECORD_SUFFIX), "archive": out / name}


# ---------------------------------------------------------------------------- DIR/<folder>
def place(release: Release, args: argparse.Namespace) -> Placed:
    """DIR/<folder>: there from an earlier run, a link to a --local folder, or extracted from the archive (fetched
    unless --local names it, or an earlier run kept it)."""
    folder, where = args.out / release.folder, paths(release, args.out)
    if folder.is_symlink() or folder.is_dir():  # renamed into place only when complete
        fetched = where["part"].is_file()
        return Placed(folder, _origin(where["record"], folder), not folder.is_symlink(), fetched)
    if args.local is not None and args.local.is_dir():
        _link(args.local, folder)
        return Placed(folder, str(args.local), owned=False, fetched=False)
    fetched = args.local is None
    kept = fetched and where["archive"].is_file()  # an earlier run's --keep-archive
    archive = args.local if not fetched else where["archive"] if kept else fetch(release, args)
    origin = archive_url(release, args.mirror) if fetched else args.local.resolve().as_uri()
    try:
        unpack(release, args, archive, origin)
    except _Corrupt as err:
        removed = discard(release, args.out, Placed(folder, origin, owned=True, fetched=fetched))
        raise BenchError(f"{err}. {removed}") from None
    return Placed(folder, origin, owned=True, fetched=fetched)


def _origin(record: Path, folder: Path) -> str:
    if record.is_file():
        return documents.read(record, FetchRecord).url
    return str(folder.resolve())


def _link(local: Path, folder: Path) -> None:
    """DIR/<folder> -> the --local folder (absolute), unless it is that folder."""
    if local.resolve() == folder.resolve():
        return
    tmp = temp_path(folder)
    remove_path(tmp)
    os.symlink(local.resolve(), tmp, target_is_directory=True)
    os.replace(tmp, folder)


def archive_url(release: Release, mirror: str | None) -> str:
    base = mirror if mirror is not None else release.base_url
    return f"{base.rstrip('/')}/{release.archive.name}"


def extracted_estimate(release: Release, archive_bytes: int) -> int:
    """The bytes the archive takes extracted, by the published ratio (a tar of GZIP files: its own size)."""
    return int(archive_bytes * release.archive.extracted_bytes / release.archive.bytes)


def check_space(out: Path, fetch_bytes: int, extract_bytes: int) -> None:
    """Refuse, before writing, a DIR without room for the rest of the download and the extraction."""
    need = int((fetch_bytes + extract_bytes) * SPACE_MARGIN)
    free = shutil.disk_usage(out).free
    if free < need:
        raise BenchError(f"{out}: {_size(free)} free, {_size(need)} needed ({_size(fetch_bytes)} still to fetch and "
                         f"{_size(extract_bytes)} to extract, and 1% more); free space there or choose another --out")


def _size(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1000
    return ""


# ---------------------------------------------------------------------------- fetching
def fetch(release: Release, args: argparse.Namespace) -> Path:
    """DIR/<archive>.part, complete and size-checked: resumed from its state, in parallel Range requests."""
    where, url = paths(release, args.out), archive_url(release, args.mirror)
    state = load_state(where["state"], where["part"])
    if state is not None and state.url == url and state.fetched == state.bytes:
        return where["part"]
    remote = probe(url, args.retries)
    state = plan_state(state, remote, where, args.parts)
    check_space(args.out, remote.bytes - state.fetched, extracted_estimate(release, remote.bytes))
    while True:
        try:
            _Download(where, state, args.retries).run()
            return where["part"]
        except _RangeRefused:
            _say(f"download: {url}: the server answered a Range request with the whole file; fetching it whole")
            state = _restart(where, dataclasses.replace(remote, ranges=False), 1)


def load_state(state_path: Path, part: Path) -> PartState | None:
    """The saved state of a partial download, or None (none there, or no longer readable: start again)."""
    if not state_path.is_file() or not part.is_file():
        return None
    try:
        return documents.read(state_path, PartState)
    except BenchError as err:
        _say(f"download: {err}; starting the download again")
        return None


def plan_state(state: PartState | None, remote: Remote, where: dict[str, Path], parts: int) -> PartState:
    """The saved state when it is of the same file on the same server, which honours Range; else a fresh one in
    `parts` parts."""
    if state is not None and state.ranges and (state.url, state.bytes, state.validator, state.ranges) == (
            remote.url, remote.bytes, remote.validator, remote.ranges):  # without Range, a download cannot resume
        if state.fetched:
            _say(f"download: resuming {where['part'].name} at {_size(state.fetched)} of {_size(state.bytes)}")
        return state
    if state is not None:
        _say(f"download: {remote.url} now has {remote.bytes} bytes, validator {remote.validator!r}; the partial "
             f"download was of {state.bytes} bytes, {state.validator!r}: starting again")
    return _restart(where, remote, parts if remote.ranges else 1)


def _restart(where: dict[str, Path], remote: Remote, parts: int) -> PartState:
    """A new state in up to `parts` parts of at least MIN_PART_BYTES, the partial file and its state removed."""
    count = max(1, min(parts, remote.bytes // MIN_PART_BYTES))
    bounds = [remote.bytes * i // count for i in range(count + 1)]
    segments = tuple(Segment(bounds[i], bounds[i + 1], 0) for i in range(count))
    where["part"].unlink(missing_ok=True)
    where["state"].unlink(missing_ok=True)
    return PartState(remote.url, remote.bytes, remote.validator, remote.ranges, segments)  # saved as it is fetched


def probe(url: str, retries: int) -> Remote:
    """The file's size and whether the server honours Range, from a request for its first byte."""
    for attempt in range(retries + 1):
        try:
            with _open(url, {"Range": "bytes=0-0"}) as response:
                return _remote_of(url, response)
        except _Transient as err:
            if attempt == retries:
                raise BenchError(f"{url}: {err}, {retries + 1} times; expected the release file (this host must "
                                 f"reach the server; --mirror names a site's copy)") from None
            _retry_wait(f"download: {url}: {err}", attempt + 1, retries)
    raise AssertionError("unreachable")


def _remote_of(url: str, response) -> Remote:
    validator = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
    if response.status == 206:
        total = _content_range(url, response)[2]
        return Remote(url, total, True, validator)
    length = response.headers.get("Content-Length")
    if response.status != 200 or length is None or not length.isdigit():
        raise BenchError(f"{url}: HTTP {response.status} with Content-Length {length!r}; expected 206 or 200 and the "
                         f"file's size")
    return Remote(url, int(length), False, validator)


def _content_range(url: str, response) -> tuple[int, int, int]:
    """(first, last, total) of a 206 answer's Content-Range."""
    text = response.headers.get("Content-Range", "")
    try:
        unit, _, rest = text.partition(" ")
        span, _, total = rest.partition("/")
        first, _, last = span.partition("-")
        if unit != "bytes":
            raise ValueError(unit)
        return int(first), int(last), int(total)
    except ValueError:
        raise BenchError(f"{url}: HTTP 206 with Content-Range {text!r}; expected 'bytes FIRST-LAST/SIZE'") from None


def _open(url: str, headers: dict):
    """The server's answer to a GET; _Transient for what is worth another try, BenchError for the rest."""
    import http.client
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, headers={**headers, "User-Agent": USER_AGENT})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as err:
        if err.code in RETRY_STATUS:
            raise _Transient(f"HTTP {err.code} {err.reason}") from None
        raise BenchError(f"{url}: HTTP {err.code} {err.reason}; expected the release file (a --mirror must hold "
                         f"the release's files under the same names)") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_NONAME:  # not a temporary failure
            raise BenchError(f"{url}: host {request.host} not found ({reason.strerror}); expected a host this machine "
                             f"reaches (--mirror names a site's copy, --local a copy already here)") from None
        raise _Transient(f"{type(err).__name__}: {reason}") from None


def _retry_wait(what: str, failures: int, retries: int) -> None:
    seconds = min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** (failures - 1)) * random.uniform(0.75, 1.25)
    _say(f"{what}; retry {failures} of {retries} in {seconds:.1f} s")
    time.sleep(seconds)


def _say(text: str) -> None:
    from tqdm import tqdm
    tqdm.write(text, file=sys.stderr)


def _bar(total: int, desc: str, initial: int = 0):
    """A progress bar on stderr in bytes, with rate and time left."""
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                file=sys.stderr, mininterval=1.0, dynamic_ncols=True)


class _Download:
    """One download into DIR/<archive>.part: a thread per unfinished segment, the state saved every SAVE_SECONDS
    (after the file is synced, so that it never claims bytes not on disk)."""

    def __init__(self, where: dict[str, Path], state: PartState, retries: int):
        self.where, self.state, self.retries = where, state, retries
        self.done = [s.done for s in state.segments]
        self.stop, self.lock, self.responses = threading.Event(), threading.Lock(), set()
        self.bar = None

    def run(self) -> None:
        import concurrent.futures
        todo = [i for i, s in enumerate(self.state.segments) if self.done[i] < s.end - s.start]
        fd = os.open(self.where["part"], os.O_RDWR | os.O_CREAT, 0o644)
        pool = concurrent.futures.ThreadPoolExecutor(max(1, len(todo)), thread_name_prefix="download")
        try:
            if os.fstat(fd).st_size != self.state.bytes:
                os.ftruncate(fd, self.state.bytes)
            with _bar(self.state.bytes, f"download {self.where['part'].name[:-len(PART_SUFFIX)]}",
                      self.state.fetched) as self.bar:
                self._wait([pool.submit(self._segment, i, fd) for i in todo], fd)
        finally:
            self.stop.set()
            with self.lock:
                for response in list(self.responses):
                    response.close()  # its thread stops at its next read (a stalled one at TIMEOUT_SECONDS)
            pool.shutdown(wait=True, cancel_futures=True)
            self._save(fd)
            os.close(fd)

    def _wait(self, futures: list, fd: int) -> None:
        import concurrent.futures
        while futures:
            finished, pending = concurrent.futures.wait(futures, SAVE_SECONDS,
                                                        concurrent.futures.FIRST_EXCEPTION)
            self._save(fd)
            for future in finished:
                future.result()  # the first failure ends the download
            futures = list(pending)

    def _save(self, fd: int) -> None:
        done = list(self.done)  # before the sync: what it claims is on disk
        os.fsync(fd)
        segments = tuple(dataclasses.replace(s, done=d) for s, d in zip(self.state.segments, done))
        documents.write(self.where["state"], dataclasses.replace(self.state, segments=segments))

    def _segment(self, i: int, fd: int) -> None:
        """Fetch segment i to its end, retrying a failure after back-off; `retries` failures in a row without a
        byte gained (with Range; without it, every failure counts) end the download."""
        segment, failures = self.state.segments[i], 0
        while self.done[i] < segment.end - segment.start and not self.stop.is_set():
            before = self.done[i]
            try:
                self._get(i, fd)
            except _Transient as err:
                if self.stop.is_set():
                    return
                gained = self.done[i] > before
                if not self.state.ranges:  # a server without Range is read from the start again
                    self.bar.update(-self.done[i])
                    self.done[i], gained = 0, False
                failures = 1 if gained else failures + 1
                where = f"download: {self.state.url}: bytes {segment.start + self.done[i]}-{segment.end - 1}"
                if failures > self.retries:
                    raise BenchError(f"{where}: {err}, {failures} time(s) in a row; expected the rest of the file. "
                                     f"{_size(sum(self.done))} are kept in {self.where['part']}: rerun the "
                                     f"command to resume") from None
                _retry_wait(f"{where}: {err}", failures, self.retries)

    def _get(self, i: int, fd: int) -> None:
        """One request for the rest of segment i, written into the file as it comes."""
        segment = self.state.segments[i]
        start = segment.start + self.done[i]
        headers = {"Range": f"bytes={start}-{segment.end - 1}"} if self.state.ranges else {}
        with _open(self.state.url, headers) as response:
            with self.lock:
                self.responses.add(response)
            try:
                expected = self._expected(response, start, segment.end)
                self._copy(response, fd, i, start, expected)
            finally:
                with self.lock:
                    self.responses.discard(response)

    def _expected(self, response, start: int, end: int) -> int:
        """The bytes the answer must hold, from its Content-Range and Content-Length, checked against the
        request."""
        url, total = self.state.url, self.state.bytes
        if response.status == 206:
            first, last, size = _content_range(url, response)
            if (first, last, size) != (start, end - 1, total):
                raise BenchError(f"{url}: answered bytes {first}-{last}/{size} to a request for {start}-{end - 1} of "
                                 f"{total}; expected those bytes of a file of {total} bytes (rerun: a changed file "
                                 f"is fetched again)")
        elif self.state.ranges and (start, end) != (0, total):
            raise _RangeRefused()
        length = response.headers.get("Content-Length")
        if length is not None and length.strip() != str(end - start):
            raise BenchError(f"{url}: Content-Length {length} for bytes {start}-{end - 1}; expected {end - start}")
        return end - start

    def _copy(self, response, fd: int, i: int, start: int, expected: int) -> None:
        """Read the answer's `expected` bytes into the file at `start`; _Transient when it ends short."""
        import http.client
        buffer, got = memoryview(bytearray(CHUNK_BYTES)), 0
        while got < expected and not self.stop.is_set():
            try:
                n = response.readinto(buffer[:min(CHUNK_BYTES, expected - got)])
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as err:
                # ValueError, AttributeError: the answer was closed by another thread's stop
                raise _Transient(f"{type(err).__name__} after {got} of {expected} bytes ({err})") from None
            if not n:
                raise _Transient(f"connection closed after {got} of {expected} bytes")
            _write_at(fd, buffer[:n], start + got, self.where["part"])
            got += n
            self.done[i] += n
            self.bar.update(n)


def _write_at(fd: int, data, offset: int, path: Path) -> None:
    from common.io import pycopy
    try:
        os.pwrite(fd, data, offset)
    except OSError as err:
        raise BenchError(pycopy.write_error(path, err.errno or errno.EIO, "download")) from None


# ---------------------------------------------------------------------------- extracting
def unpack(release: Release, args: argparse.Namespace, archive: Path, origin: str) -> None:
    """Extract the archive into DIR/.<folder>.tmp-PID, digesting it as it is read; check its sha256 when one is
    known and its layout; record what was fetched; rename the folder to DIR/<folder>. _Corrupt for an archive
    that cannot be the release."""
    folder, where = args.out / release.folder, paths(release, args.out)
    name = release.archive.name if archive.name.endswith(PART_SUFFIX) else archive.name
    size = archive.stat().st_size
    check_space(args.out, 0, extracted_estimate(release, size))
    for stale in [args.out / INDEX_DIR, *args.out.glob(f".{release.folder}.tmp-*")]:
        remove_path(stale)  # an index of an earlier extraction (its journal would trust equal mtimes); a killed run's
    staging = temp_path(folder)
    try:
        staging.mkdir()
        sha256, xxh3 = extract(archive, staging, name)
        expected = args.sha256 or release.archive.sha256
        if expected is not None and sha256 != expected:
            raise _Corrupt(f"{archive} (from {origin}): sha256 {sha256}, expected {expected}; refused")
        root = release_root(staging)
        _check_layout(release, root, archive)
        documents.write(where["record"], FetchRecord(
            release.name, name, origin, size, sha256, xxh3, expected, release.folder,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
        os.replace(root, folder)
    finally:
        remove_path(staging)


def extract(archive: Path, staging: Path, name: str) -> tuple[str, str]:
    """Extract a tar (.tar, or GZIP-compressed) into `staging`, reading it once; its (sha256, xxh3-128)."""
    import gzip
    import hashlib
    import tarfile
    import zlib

    import xxhash

    from common.io.decompress import DigestingReader
    size = archive.stat().st_size
    with open(archive, "rb") as raw, _bar(size, f"extract {name}") as bar:
        reader = DigestingReader(raw, hashlib.sha256(), xxhash.xxh3_128())
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=reader, mode="rb") if gzipped else reader
        try:
            _extract_members(stream, staging, archive, bar, reader)
            while stream.read(CHUNK_BYTES):  # the GZIP trailer: its CRC and size are checked here
                pass
            reader.drain()
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise _Corrupt(f"{archive}: cannot be extracted after {reader.count} of {size} bytes ({err}); expected "
                           f"a tar of the release") from None
        except OSError as err:
            raise BenchError(f"{archive}: extracting into {staging} failed after {reader.count} of {size} bytes: "
                             f"{err}") from None
        bar.update(reader.count - bar.n)
    return tuple(d.hexdigest() for d in reader.digests)


def _extract_members(stream, staging: Path, archive: Path, bar, reader) -> None:
    """Every member into `staging` (the 'data' filter: no absolute paths, links out or devices), then the rest of
    the tar, which must be zeros: a tar whose header is damaged would otherwise end early, silently."""
    import tarfile
    last = None
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            tar.extract(member, staging, filter="data")
            last = member
            bar.update(reader.count - bar.n)
        while chunk := tar.fileobj.read(CHUNK_BYTES):
            if chunk.strip(b"\0"):
                after = f"after its member {last.name}" if last is not None else "at its start"
                raise _Corrupt(f"{archive}: bytes that are not zero {after}, where the tar ends (a damaged header); "
                               f"expected the zero blocks that end a tar")


def release_root(staging: Path) -> Path:
    """The release's folder in what was extracted: its one top-level folder, or the staging folder itself when
    the archive holds the release's directories at its top."""
    entries = list(staging.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return staging


def _check_layout(release: Release, root: Path, archive: Path) -> None:
    """The extracted folder holds what the release's prepare command reads (index: train/ and validation/ of
    *.tfrecord files). The archive is kept: its bytes are as served, only not what the registry says."""
    if release.prepare != "index":
        return
    from data_prep import index
    try:
        index.find_layout(root)
    except BenchError as err:
        raise BenchError(f"{archive}: extracted, but not the release's layout: {err}. The archive is kept; "
                         f"nothing was renamed into place") from None


# ---------------------------------------------------------------------------- DIR/index
def prepare(release: Release, args: argparse.Namespace, placed: Placed) -> None:
    """DIR/index from DIR/<folder> by the release's prepare command (resumable: it keeps a journal). A refusal of
    extracted content removes it, and what was fetched, naming the file."""
    argv = ["--input", str(placed.folder), "--out", str(args.out / INDEX_DIR), "--workers", str(args.workers)]
    if release.prepare == "index":
        argv += ["--verify", args.verify]
    module = importlib.import_module(PREPARE_MODULES[release.prepare])
    parser = argparse.ArgumentParser(prog=f"python -m data_prep {release.prepare}")
    module.add_arguments(parser)
    try:
        module.run(parser.parse_args(argv))
    except BenchError as err:
        if not placed.owned:
            if placed.folder.is_symlink():
                placed.folder.unlink()  # the link to a --local folder, made again by the next run
            raise
        removed = discard(release, args.out, placed)
        found = str(err).split(INDEX_ADVICE)[0].rstrip(". ")  # index's advice to replace files: here, refetched
        raise BenchError(f"{release.name} from {placed.origin}: refused by {release.prepare}: {found}. "
                         f"{removed}") from None


def discard(release: Release, out: Path, placed: Placed) -> str:
    """Remove what refused content left: DIR/index, the extracted folder, the fetch record, and the fetched
    archive with its state (never a --local one). Each is renamed to a temporary name first, so that a kill
    while deleting leaves nothing under a final name. Returns a sentence for the message."""
    where = paths(release, out)
    gone = [out / INDEX_DIR, placed.folder, where["record"]]
    if placed.fetched:
        gone += [where["part"], where["state"], where["archive"]]
    removed = []
    for path in gone:
        if path.exists() or path.is_symlink():
            tmp = temp_path(path)
            os.replace(path, tmp)
            remove_path(tmp)
            removed.append(path.name)
    again = "a rerun fetches it again" if placed.fetched else "replace the archive and rerun"
    return f"Removed {', '.join(removed) or 'nothing'} from {out}: {again}."


def finish(release: Release, args: argparse.Namespace) -> str:
    """The fetched archive renamed to DIR/<archive> (--keep-archive) or removed; what became of it."""
    where = paths(release, args.out)
    where["state"].unlink(missing_ok=True)
    if not where["part"].is_file():
        return "archive kept" if where["archive"].is_file() else "no archive kept"
    if args.keep_archive:
        os.replace(where["part"], where["archive"])
        return f"archive kept: {where['archive']}"
    where["part"].unlink()
    return "archive removed"
