"""Measure how fast the suite stages a dataset to node-local storage, against cp -r and tar -x, in one run.

    python benchmarks/staging_throughput.py [--datasets cosmoflow deepcam] [--dests /dev/shm /tmp]
        [--sources plain zstd gzip none] [--modes node rank] [--repeats 3] [--data-dir DIR] [--work-dir DIR]

Data: the CosmoFlow and DeepCAM mini datasets of `make demo` (demo/data/*/tfrecords when their
manifest exists, else made with the same data_prep commands under --data-dir), and copies of each
packed with `python -m data_prep pack --compression zstd|gzip|none` under --work-dir (reused when
their pack.json exists; the packing time is recorded when this run packs, or was recorded when an
earlier run did).

For each dataset, destination and source (the plain directory or one packed copy) it times:

    node   one process calls common.io.staging.stage for the whole dataset, threads = cores
    rank   RANKS processes at once, rank r staging its own shard (Layout(rank=r, size=RANKS,
           local_size=RANKS), the files the application's files_read gives for its mini config's
           local batch), one thread each; timed until the last one finishes
    cp -r / tar -x   the baseline a site would type for the same source, one command after the
           other ("sequential") and RANKS at a time ("parallel": xargs -P RANKS)

Staging workers import everything, report ready and wait; the clock starts when they are told to
go, so interpreter start-up is not timed (in a training run staging happens in a running process),
while opening the source, planning, the free-space check, verifying every file (sha256 from the
manifest for plain sources, the digest pack.json records for packed ones) and the manifest are.
`node_share` on a single node stages exactly what `node` does, so it is not measured twice. The
destination is deleted (and `sync` run) before every run, and as much memory as the run writes is
written and freed just before it starts (see warm_free_memory); each measurement is repeated
--repeats times, the rounds interleaved (every case once per round), and the median is
reported with all values. Sources are read into the page cache before their cases are measured, so
staging and the baselines read from memory, not disk. CPU time (user + system, all processes and
threads) is recorded for every run, and after each source's runs the single-thread cost of each step
of staging (read and decompress, checksum, write) is measured. GB/s is 1e9 bytes per second: written
(uncompressed) and read (archive bytes for packed sources). The goal of the project's issue: staging
reaches at least GOAL of the faster baseline of the same source kind (cp -r for plain, tar -x of
the same archives for packed). Writes benchmarks/results/staging_throughput.json and the tables
between the markers in docs/staging.md, both with the cases of this run only.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np

from common.base.version import code_version
from common.io.staging import filesystem_type

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section,
                     run_header, sgemm_gflops, write_json_atomic)

DOC = REPO / "docs/staging.md"  # its tables live beside what they measure
RESULTS = RESULTS_DIR / "staging_throughput.json"
BEGIN, END = "<!-- staging-throughput:begin -->", "<!-- staging-throughput:end -->"
DEFAULT_DATA_DIR = Path("/tmp/hpc-sciml-bench-staging/data")
DEFAULT_WORK_DIR = Path("/tmp/hpc-sciml-bench-staging/packed")
SCRATCH_NAME = "hpc-sciml-bench-staging-scratch"  # made in each destination and deleted after every run
SOURCES = ("plain", "zstd", "gzip", "none")
MODES = ("node", "rank")
RANKS = 2
GOAL = 0.8  # staging GB/s over the faster baseline's GB/s
TAR_FLAGS = {"zstd": ["-I", "zstd"], "gzip": ["-z"], "none": []}
CODE_DIRS = ("common", "data_prep")  # the staging and packing code measured
PACKER_FILES = ("data_prep/pack.py", "common/io/packing.py")
JOB_MARKS = ("benchmarks/", "pytest", "train.py", "data_prep")  # command lines other_jobs() reports
STAGING_FILES = ("common/io/staging.py", "common/io/packing.py", "common/io/manifest.py", "data_prep/pack.py")


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A mini dataset of `make demo`: where the demo keeps it, how to make it, its app's sharding."""

    name: str
    demo_dir: Path
    config: str  # the mini config, for the local batch the rank shards are cut with
    synth: tuple[str, ...]  # data_prep command and arguments, as in scripts/demo.sh (without --out)
    convert: tuple[str, ...]  # data_prep command and arguments (without --input and --out)
    layout: str  # the pack layout whose archives follow the app's rank shards (file by file, or blocks)


DATASETS = {
    "cosmoflow": Dataset("cosmoflow", REPO / "demo/data/cosmo_mini", "cosmoflow/configs/cosmo_mini.yaml",
                         ("cosmo-synth", "--universes", "1088", "--size", "64", "--prior", "mini", "--seed", "2026"),
                         ("cosmo-convert", "--sample-size", "32", "--val-universes", "64", "--seed", "2026"),
                         "interleaved"),
    "deepcam": Dataset("deepcam", REPO / "demo/data/deepcam_mini", "deepcam/configs/deepcam_mini.yaml",
                       ("deepcam-synth", "--train", "1024", "--validation", "128", "--height", "96", "--width",
                        "144", "--seed", "2026"),
                       ("deepcam-convert",), "contiguous"),
}


# ----------------------------------------------------------------------------- data

def prepare_dataset(spec: Dataset, data_dir: Path) -> dict:
    """The demo's converted dataset, or one made like it under `data_dir`; its path and size."""
    records = spec.demo_dir / "tfrecords"
    made_seconds = None
    if not (records / "manifest.json").is_file():
        root = data_dir / spec.name
        records = root / "tfrecords"
        if not (records / "manifest.json").is_file():
            print(f"  {spec.name}: making the mini dataset in {root}", flush=True)
            t0 = time.perf_counter()
            _run([sys.executable, "-m", "data_prep", *spec.synth, "--out", str(root / "raw")])
            _run([sys.executable, "-m", "data_prep", *spec.convert, "--input", str(root / "raw"), "--out",
                  str(records)])
            made_seconds = time.perf_counter() - t0
    files = [p for p in records.rglob("*") if p.is_file()]
    return {"dir": str(records), "made_seconds": made_seconds, "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


def copy_to_source_root(records: Path, target: Path) -> str:
    """`records` copied (untimed, once) to `target`, which --source-root puts on another file system than
    the destinations, as a parallel file system is on a cluster node."""
    if not (target / "manifest.json").is_file():
        print(f"  copying {records} to {target} (the measured source)", flush=True)
        shutil.rmtree(target, ignore_errors=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(records, tmp)
        tmp.rename(target)
    return str(target)


def prepare_pack(spec: Dataset, records: Path, compression: str, work_dir: Path) -> dict:
    """`records` packed with `compression` under `work_dir`; sizes and packing time.

    The archives follow the app's rank shards (`--layout` of the dataset, `--align-ranks RANKS`), so a
    rank of the rank mode unpacks only archives of its own files. A finished pack is reused when the
    packing code (PACKER_FILES) and the arguments are the ones that made it; else it is deleted and
    packed again, so that a pack in an older format is never what staging is timed on.
    """
    out = work_dir / f"{spec.name}-{compression}"
    timing = work_dir / f"{spec.name}-{compression}.timing.json"
    earlier = json.loads(timing.read_text()) if timing.is_file() else {}
    settings = ["--compression", compression, "--layout", spec.layout, "--align-ranks", str(RANKS)]
    reused = ((out / "pack.json").is_file() and earlier.get("packer") == packer_digest()
              and earlier.get("settings") == settings)
    if not reused:
        shutil.rmtree(out, ignore_errors=True)
        print(f"  {spec.name}: packing with {compression} into {out}", flush=True)
        t0 = time.perf_counter()
        _run([sys.executable, "-m", "data_prep", "pack", "--input", str(records), "--out", str(out), *settings])
        earlier = {"pack_seconds": time.perf_counter() - t0, "date": time.strftime("%Y-%m-%d %H:%M"),
                   "loadavg": os.getloadavg(), "packer": packer_digest(), "settings": settings}
        write_json_atomic(timing, earlier)
    pack = json.loads((out / "pack.json").read_text())
    archive_bytes = sum(a["bytes"] for a in pack["archives"])
    member_bytes = sum(m["bytes"] for a in pack["archives"] for m in a["members"])
    return {"dir": str(out), "compression": compression, "level": pack["source"].get("level"),
            "layout": pack["source"].get("layout"), "align_ranks": pack["source"].get("align_ranks"),
            "archives": len(pack["archives"]), "archive_bytes": archive_bytes, "member_bytes": member_bytes,
            "compression_ratio": member_bytes / archive_bytes, "reused": reused,
            "pack_seconds": earlier.get("pack_seconds"), "packed_on": earlier.get("date"),
            "pack_loadavg": earlier.get("loadavg")}


def packer_digest() -> str:
    """sha256 of the packing code, which decides a pack's format."""
    return _files_digest(PACKER_FILES)


def _files_digest(names) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}")


def source_files(source: Path) -> list[Path]:
    return sorted(p for p in source.rglob("*") if p.is_file())


def read_into_page_cache(files: list[Path]) -> None:
    """Read every file once, so that the timed reads come from the page cache."""
    for path in files:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def cached_fraction(files: list[Path]) -> float | None:
    """The fraction of the files' bytes in the page cache (util-linux fincore), None without fincore."""
    if not shutil.which("fincore"):
        return None
    proc = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE",
                           *map(str, files)], capture_output=True, text=True)
    if proc.returncode:
        return None
    pairs = [tuple(map(int, line.split())) for line in proc.stdout.splitlines() if line.strip()]
    return sum(min(r, s) for r, s in pairs) / max(1, sum(s for _, s in pairs))


def try_drop_caches() -> dict:
    """Try to drop the clean page cache (needs root); the answer goes into the results."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return {"worked": True, "detail": "wrote 1 to /proc/sys/vm/drop_caches"}
    except OSError as err:
        return {"worked": False, "detail": f"{type(err).__name__}: {err}"}


def other_jobs() -> list[str]:
    """Command lines of benchmarks, tests and training runs on this machine besides this one (they share its cores)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended
            continue
        text = " ".join(w for w in words if w)
        if any(k in text for k in JOB_MARKS) and Path(__file__).name not in text:
            found.add(text[:160])
    return sorted(found)


def drop_caches_writable() -> dict:
    """Whether /proc/sys/vm/drop_caches opens for writing, without writing (which would drop the caches)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w"):
            pass
        return {"worked": False, "detail": "not tried (--keep-caches); /proc/sys/vm/drop_caches opens for writing"}
    except OSError as err:
        return {"worked": False, "detail": f"not tried (--keep-caches); it does not open for writing ({err})"}


def code_state() -> dict:
    """The commit measured and the files of the measured packages that differ from it."""
    return {**code_version(CODE_DIRS), "staging_code_sha256": _files_digest(STAGING_FILES)}


# ----------------------------------------------------------------------------- staging worker

def worker(source: str, mode: str, dataset: str, rank: int, ranks: int, threads: int, stage_root: str) -> None:
    """Stage on the driver's signal: print `ready`, wait for a line on stdin, stage, print the figures."""
    from common.runtime.config import load_config
    from common.io.staging import Layout, open_source, plan, stage
    if dataset == "cosmoflow":
        from cosmoflow.config import CosmoConfig as schema
        from cosmoflow.data import files_read
    else:
        from deepcam.config import DeepCamConfig as schema
        from deepcam.data import files_read
    # What staging imports when it first needs it, imported before the clock starts, as in a running job.
    import gzip  # noqa: F401
    import xxhash  # noqa: F401
    import zstandard  # noqa: F401
    local_batch = load_config(REPO / DATASETS[dataset].config, schema=schema).train.local_batch_size
    layout = Layout(rank=rank, size=ranks, local_rank=rank, local_size=ranks)
    print("ready", flush=True)
    sys.stdin.readline()
    t0, cpu0 = time.perf_counter(), time.process_time()
    src = open_source(source)
    the_plan = plan(src, mode, layout, lambda manifest, r, n: files_read(manifest, r, n, local_batch))
    result = stage(src, the_plan, stage_root, threads=threads)
    print(json.dumps({**result.figures(), "worker_seconds": time.perf_counter() - t0,
                      "cpu_seconds": time.process_time() - cpu0}), flush=True)


def run_stagers(source: Path, mode: str, dataset: str, dest: Path, warm_bytes: int) -> dict:
    """Start the stagers of one run, release them together, and time them until the last one is done."""
    ranks, threads = (1, _cores()) if mode == "node" else (RANKS, 1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--source", str(source), "--mode", mode,
                               "--dataset", dataset, "--rank", str(r), "--ranks", str(ranks), "--threads",
                               str(threads), "--stage-root", str(dest)],
                              cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            _fail(p, procs)
    warmed = warm_free_memory(warm_bytes)
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    lines = [p.stdout.readline() for p in procs]  # the last one read marks the last stager's end
    seconds = time.perf_counter() - t0
    results = []
    for p, line in zip(procs, lines):
        if p.wait() != 0 or not line.strip():
            _fail(p, procs)
        results.append(json.loads(line))
    return {"seconds": seconds, "warm_seconds": warmed, "bytes_written": sum(r["bytes_written"] for r in results),
            "bytes_read": sum(r["bytes_read"] for r in results), "cpu_seconds": sum(r["cpu_seconds"] for r in results),
            "threads_per_process": threads,
            "checksum": "+".join(sorted({r.get("checksum") or "sha256" for r in results})),
            "copier": "+".join(sorted({r["copier"] for r in results})),
            "processes": [{k: r[k] for k in ("scope", "files", "archives", "bytes_written", "bytes_read", "seconds",
                                             "worker_seconds", "cpu_seconds")} for r in results]}


def _fail(proc: subprocess.Popen, procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    raise SystemExit(f"staging worker failed (exit {proc.wait()}): {' '.join(proc.args)}\n{proc.stderr.read()[-3000:]}")


def _cores() -> int:
    return len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- baselines

def baseline_commands(source: Path, kind: str, target: Path) -> dict[str, str]:
    """The shell commands a site would type to copy `source` to `target`: one after the other, and RANKS at once."""
    q = shlex.quote
    if kind == "plain":
        files = [p.relative_to(source).as_posix() for p in source_files(source)]
        per_process = math.ceil(len(files) / RANKS)  # RANKS cp processes, each with its share of the files
        return {"cp -r": f"cp -r {q(str(source))} {q(str(target))}",
                f"cp -r, {RANKS} parallel": f"{_mkdirs(target, files)} && cd {q(str(source))} && find . -type f "
                                             f"-print0 | xargs -0 -P {RANKS} -n {per_process} cp --parents -t "
                                             f"{q(str(target))}"}
    pack = json.loads((source / "pack.json").read_text())
    archives = " ".join(q(str(source / a["path"])) for a in pack["archives"])
    members = [m["path"] for a in pack["archives"] for m in a["members"]]
    tar = " ".join(["tar", *TAR_FLAGS[kind], "-C", q(str(target)), "-xf"])
    return {"tar -x": f"mkdir -p {q(str(target))} && for a in {archives}; do {tar} \"$a\" || exit 1; done",
            f"tar -x, {RANKS} parallel": f"{_mkdirs(target, members)} && printf '%s\\0' {archives} | "
                                          f"xargs -0 -P {RANKS} -n 1 {tar}"}


def _mkdirs(target: Path, paths: list[str]) -> str:
    """`mkdir -p` of `target` and every directory of `paths` in it: two GNU tar 1.34 (or cp --parents)
    processes that create the same directory at once can fail ("Cannot open: No such file or directory")."""
    dirs = sorted({str(target / PurePosixPath(p).parent) for p in paths})
    return "mkdir -p " + " ".join(shlex.quote(d) for d in dirs)


def run_command(command: str, bytes_written: int, bytes_read: int) -> dict:
    """Time one baseline command; its CPU time is that of every process it started (user + system)."""
    warmed = warm_free_memory(bytes_written)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode:
        raise SystemExit(f"baseline failed (exit {proc.returncode}): {command}\n{proc.stderr[-3000:]}")
    return {"seconds": seconds, "warm_seconds": warmed, "bytes_written": bytes_written, "bytes_read": bytes_read,
            "cpu_seconds": cpu}


def warm_free_memory(nbytes: int) -> float:
    """Write and free `nbytes` (plus an eighth) of memory just before a run; returns the seconds it took.

    This VM hands free guest memory back to the host (virtio-balloon free page reporting) a second or
    two after it is freed, and the first write to such a page faults on the host: the same `cp -r`
    of 2.3 GB to /dev/shm took 0.95 s or 6.1 s depending on how long ago the last run's output had been
    deleted. Writing the pages just before every run, staging and baselines alike, hands each run
    pages the host has backed, as on a bare-metal node (for the first second or two of the run).
    """
    t0 = time.perf_counter()
    block = np.ones(nbytes + nbytes // 8, dtype=np.uint8)
    del block
    return time.perf_counter() - t0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ----------------------------------------------------------------------------- one dataset, destination and source

@dataclasses.dataclass(frozen=True)
class Trial:
    """One thing timed: a staging mode or a baseline command."""

    method: str  # "staging" or "baseline"
    mode: str  # node, rank, cp -r, tar -x, ...
    run: Callable[[], dict]  # the figures of one run


def measure_source(dataset: str, dest: Path, kind: str, source: Path, info: dict, modes: list[str],
                   repeats: int) -> tuple[list[dict], dict]:
    """Every trial of one source at one destination, `repeats` interleaved rounds: one entry per trial,
    and the single-thread cost of each step of staging (see component_costs)."""
    scratch = dest / SCRATCH_NAME
    written = info["member_bytes"] if kind != "plain" else info["bytes"]
    read = info["archive_bytes"] if kind != "plain" else info["bytes"]
    commands = baseline_commands(source, kind, scratch / "copy")
    trials = [Trial("staging", m, lambda m=m: run_stagers(source, m, dataset, scratch, written)) for m in modes]
    trials += [Trial("baseline", name, lambda c=cmd: run_command(c, written, read)) for name, cmd in commands.items()]
    files = source_files(source)
    read_into_page_cache(files)
    where = {"dataset": dataset, "dest": str(dest), "source": kind}
    runs: dict[str, list[dict]] = {t.mode: [] for t in trials}
    for round_ in range(repeats):
        for t in trials:
            _clear(scratch)
            runs[t.mode].append(t.run())
            print(f"    {dataset} -> {dest} {kind} {t.mode} [{round_ + 1}/{repeats}]: "
                  f"{runs[t.mode][-1]['bytes_written'] / runs[t.mode][-1]['seconds'] / 1e9:.2f} GB/s", flush=True)
    costs = {**where, **component_costs(source, kind, scratch)}
    _clear(scratch)
    scratch.rmdir()
    cached = cached_fraction(files)  # after the runs: did the source stay in memory throughout?
    cases = [{**where, "method": t.method, "mode": t.mode, **summarise(runs[t.mode]), "source_cached_after": cached,
              **({"command": commands[t.mode]} if t.method == "baseline" else {}), "runs": runs[t.mode]}
             for t in trials]
    return cases, costs


def component_costs(source: Path, kind: str, scratch: Path) -> dict:
    """CPU seconds (user + system) per GB written of each step staging does to a byte, one step at a time
    on one thread (CPU time, not wall time, so that other jobs on the machine do not inflate it).

    `read` reads (and for packed sources decompresses) every file or archive of the source into a
    buffer; `checksum` hashes that many bytes in memory with the digest staging verifies for this
    source (sha256, or xxh3-128 for packs that record it); `write` writes them as files of the source's
    mean member size into `scratch`. Their sum is the CPU cost of staging one byte, which the cases'
    threads or ranks share.
    """
    import gzip

    import zstandard

    from common.io.staging import CHUNK, checksum_of, open_source
    digest_kind = checksum_of(max(open_source(source).files.values(), key=lambda m: m.bytes))[0]
    if kind == "plain":
        streams, members = [p for p in source_files(source) if p.name != "manifest.json"], None
    else:
        pack = json.loads((source / "pack.json").read_text())
        streams = [source / a["path"] for a in pack["archives"]]
        members = [m["bytes"] for a in pack["archives"] for m in a["members"]]
    buffer = memoryview(bytearray(CHUNK))
    t0, total = time.process_time(), 0
    for path in streams:
        with open(path, "rb") as raw:
            stream = (zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK) if kind == "zstd" else
                      gzip.GzipFile(fileobj=raw, mode="rb") if kind == "gzip" else raw)
            while got := stream.readinto(buffer):
                total += got
    read = time.process_time() - t0
    digest, left, t0 = _hasher(digest_kind), total, time.process_time()
    while left > 0:
        digest.update(buffer[:min(left, CHUNK)])
        left -= CHUNK
    checksum = time.process_time() - t0
    _clear(scratch)
    member = total // len(members or streams)
    warm_free_memory(total)
    t0, left, i = time.process_time(), total, 0
    while left > 0:
        with open(scratch / f"{i}", "wb", buffering=0) as out:
            size = min(member, left)
            for offset in range(0, size, CHUNK):
                out.write(buffer[:min(CHUNK, size - offset)])
        left, i = left - size, i + 1
    write = time.process_time() - t0
    steps = (("read", read), ("checksum", checksum), ("write", write))
    per_gb = {name: seconds / (total / 1e9) for name, seconds in steps}
    return {**per_gb, "sum": sum(per_gb.values()), "checksum_kind": digest_kind, "bytes": total}


def _hasher(kind: str):
    if kind.startswith("xxh"):
        import xxhash
        return getattr(xxhash, kind)()
    return hashlib.new(kind)


def _clear(scratch: Path) -> None:
    """Delete the last run's output and let the file system settle before the next run."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    os.sync()


def summarise(runs: list[dict]) -> dict:
    """Median seconds of the runs and the GB/s written and read it gives."""
    seconds = statistics.median(r["seconds"] for r in runs)
    written, read = runs[0]["bytes_written"], runs[0]["bytes_read"]
    return {"median_seconds": seconds, "seconds_all": [r["seconds"] for r in runs], "bytes_written": written,
            "bytes_read": read, "write_gb_per_second": written / seconds / 1e9,
            "read_gb_per_second": read / seconds / 1e9,
            "write_gb_per_second_all": [r["bytes_written"] / r["seconds"] / 1e9 for r in runs],
            "cpu_seconds_per_gb": statistics.median(r["cpu_seconds"] for r in runs) / (written / 1e9),
            "checksum": runs[0].get("checksum", "none"),  # what staging verified; the baselines verify nothing
            "copier": runs[0].get("copier", "")}  # staging's: native or python


def compare(cases: list[dict]) -> list[dict]:
    """Each staging case against the faster baseline of the same dataset, destination and source."""
    out = []
    for c in (c for c in cases if c["method"] == "staging"):
        same = [b for b in cases if b["method"] == "baseline" and
                (b["dataset"], b["dest"], b["source"]) == (c["dataset"], c["dest"], c["source"])]
        best = max(same, key=lambda b: b["write_gb_per_second"])
        ratio = c["write_gb_per_second"] / best["write_gb_per_second"]
        out.append({"dataset": c["dataset"], "dest": c["dest"], "source": c["source"], "mode": c["mode"],
                    "staging_gb_per_second": c["write_gb_per_second"], "best_baseline": best["mode"],
                    "best_baseline_gb_per_second": best["write_gb_per_second"], "ratio": ratio,
                    "goal_met": ratio >= GOAL})
    return out


# ----------------------------------------------------------------------------- outputs

def table_rows(result: dict) -> list[str]:
    """The tables of docs/staging.md: staging against the best baseline, and packing. Each baseline's runs
    and the CPU cost of each part of staging (read, checksum, write) stay in the JSON."""
    return [*_comparison_rows(result), "", *_packing_rows(result), "", _footnote(result),
            "Every baseline's runs and each part's CPU s/GB (read and decompress, checksum, write): `cases` and "
            "`component_core_seconds_per_gb` in the JSON.", measured_note(result)]


def _comparison_rows(result: dict) -> list[str]:
    rows = ["| dataset | dest | source | mode | verified with (copier) | staging GB/s written (read) | CPU s/GB | "
            f"best baseline GB/s | ratio | >= {GOAL} |", "|---|---|---|---|---|---|---|---|---|---|"]
    staging = {(c["dataset"], c["dest"], c["source"], c["mode"]): c for c in result["cases"]}
    for c in result["comparisons"]:
        s = staging[c["dataset"], c["dest"], c["source"], c["mode"]]
        rows.append(f"| {c['dataset']} | {c['dest']} | {_source_label(c['source'])} | {c['mode']} | "
                    f"{s['checksum']} ({s.get('copier') or '?'}) | {c['staging_gb_per_second']:.2f} ({s['read_gb_per_second']:.2f}) | "
                    f"{s['cpu_seconds_per_gb']:.2f} | {c['best_baseline_gb_per_second']:.2f} ({c['best_baseline']}) | "
                    f"{c['ratio']:.2f} | {'met' if c['goal_met'] else 'not met'} |")
    return rows


def _packing_rows(result: dict) -> list[str]:
    rows = ["| dataset | plain GB | packed | archives (layout) | archive GB | compression ratio | packing time (s) |",
            "|---|---|---|---|---|---|---|"]
    for name, d in result["datasets"].items():
        for comp, p in d["packed"].items():
            seconds = f"{p['pack_seconds']:.0f}" if p["pack_seconds"] is not None else "not recorded"
            layout = f"{p.get('layout')}, aligned to {p.get('align_ranks')} ranks" if p.get("align_ranks") else "?"
            rows.append(f"| {name} | {d['bytes'] / 1e9:.3f} | {comp} | {p['archives']} ({layout}) | "
                        f"{p['archive_bytes'] / 1e9:.3f} | {p['compression_ratio']:.2f} | {seconds} |")
    return rows


def _footnote(result: dict) -> str:
    load = f"{result['loadavg_start'][0]:.2f} at start, {result['loadavg_end'][0]:.2f} at end (1 min)"
    drop = result["drop_caches"]
    drop = "worked" if drop["worked"] else drop["detail"] if drop["detail"].startswith("not tried") else \
        f"failed ({drop['detail']})"
    root = result.get("source_root")
    where = "" if not root else (f"Sources on their own file system: the datasets copied to {root['path']} "
                                 f"({root['fs']}), the packs made in one on {root['work_dir_fs']}. ")
    return (f"{where}Median of {result['repeats']} runs each; sources read from the page cache (fraction of the source "
            f"bytes cached after the runs: {_cached_range(result['cases'])}); dropping the caches at the start: "
            f"{drop}. Load average {load}.{_other_jobs_note(result)}{_code_note(result)} Benchmark time "
            f"{result['total_seconds'] / 60:.1f} min.")


def _code_note(result: dict) -> str:
    start, end = result["code"], result["code_at_end"]
    if start == end:
        return ""
    if start["staging_code_sha256"] != end["staging_code_sha256"]:
        return " The staging or packing code changed during this run (code and code_at_end in the JSON)."
    return (" Other files of the repository changed or were committed during this run; the staging and packing "
            "code's digest is the same at start and end (code and code_at_end in the JSON).")


def _other_jobs_note(result: dict) -> str:
    start, end = result["other_jobs_at_start"], result["other_jobs_at_end"]
    if not start and not end:
        return ""
    return (f" Other benchmark, test or training processes were running ({len(start)} at start, {len(end)} at end, "
            f"listed in the JSON) and shared the {result['cores']} cores.")


def _source_label(kind: str) -> str:
    return "plain" if kind == "plain" else f"packed {kind}"


def _cached_range(cases: list[dict]) -> str:
    values = [c["source_cached_after"] for c in cases if c["source_cached_after"] is not None]
    return f"{min(values):.2f} to {max(values):.2f}" if values else "not measured (no fincore)"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    p.add_argument("--dests", nargs="+", type=Path, default=[Path("/dev/shm"), Path("/tmp")],
                   help="node-local directories to stage into (default: /dev/shm /tmp)")
    p.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES),
                   help="plain: the converted directory; zstd, gzip, none: packed copies")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                   help="where to make the mini datasets when demo/data lacks them (default: %(default)s)")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                   help="where the packed copies are made and kept (default: %(default)s)")
    p.add_argument("--source-root", type=Path, default=None,
                   help="copy each dataset here first and stage from the copy (put it and --work-dir on a file "
                        "system other than the destinations', e.g. a tmpfs mounted for the purpose: within one "
                        "local file system cp copies in the kernel, which no parallel file system allows)")
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="the JSON to write (default: %(default)s, whose run the tables in docs/staging.md "
                        "show; any other path leaves those tables alone and only prints this run's)")
    p.add_argument("--keep-caches", action="store_true",
                   help="do not try to drop the page cache at the start (it slows other jobs on the machine)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--source", "--mode", "--dataset", "--stage-root"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    for hidden in ("--rank", "--ranks", "--threads"):
        p.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args.source, args.mode, args.dataset, args.rank, args.ranks, args.threads, args.stage_root)
    check_marked_section(DOC, BEGIN, END)
    started, loadavg_start, jobs_start, code = time.perf_counter(), os.getloadavg(), other_jobs(), code_state()
    print(f"load average {loadavg_start[0]:.2f}; sgemm ...", flush=True)
    header = run_header(sgemm_gflops())
    drop = drop_caches_writable() if args.keep_caches else try_drop_caches()
    datasets, cases, costs = {}, [], []
    for name in args.datasets:
        spec = DATASETS[name]
        data = prepare_dataset(spec, args.data_dir)
        if args.source_root:
            data["dir"] = copy_to_source_root(Path(data["dir"]), args.source_root / spec.name)
        data["packed"] = {c: prepare_pack(spec, Path(data["dir"]), c, args.work_dir) for c in args.sources
                          if c != "plain"}
        datasets[name] = data
        for dest in args.dests:
            for kind in args.sources:
                info = ({"bytes": data["bytes"]} if kind == "plain" else data["packed"][kind])
                source = Path(data["dir"] if kind == "plain" else info["dir"])
                print(f"  {name} -> {dest}, {_source_label(kind)} (load {os.getloadavg()[0]:.2f})", flush=True)
                measured, cost = measure_source(name, dest, kind, source, info, args.modes, args.repeats)
                cases, costs = cases + measured, costs + [cost]
    result = {**header, "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
              "other_jobs_at_start": jobs_start, "other_jobs_at_end": other_jobs(),
              "total_seconds": time.perf_counter() - started, "repeats": args.repeats, "goal": GOAL,
              "ranks": RANKS, "cores": _cores(), "drop_caches": drop, "code": code, "code_at_end": code_state(),
              "page_cache": "sources are read into the page cache before their cases; every run reads them from "
                            "memory (source_cached_after: the fraction of their bytes still cached after the runs, "
                            "from fincore)",
              "node_share": "not measured: on one node, node_share stages the whole dataset into one directory, "
                            "exactly what node does",
              "source_root": None if args.source_root is None else {
                  "path": str(args.source_root), "fs": filesystem_type(args.source_root),
                  "work_dir_fs": filesystem_type(args.work_dir)},
              "datasets": datasets, "comparisons": compare(cases), "component_core_seconds_per_gb": costs,
              "cases": cases}
    write_json_atomic(args.results, result)
    tables = "\n".join(table_rows(result))
    print(tables)
    if args.results.resolve() != RESULTS.resolve():
        print(f"wrote {args.results} (the tables in {DOC} are left as they are)")
        return
    replace_marked_section(DOC, BEGIN, END, tables)
    print(f"wrote {RESULTS} and the tables in {DOC}")


if __name__ == "__main__":
    main()
