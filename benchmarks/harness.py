"""What the training-throughput benchmarks share.

Each benchmark script is both driver and worker. The driver measures this machine's sgemm rate,
then for each case calls `run_worker`, which starts the same script with `--worker ...` (under
`horovodrun -np N -H localhost:N` for N > 1 ranks) and returns the JSON that the worker's rank 0
wrote with `write_worker_result`. The driver saves all figures with `write_json_atomic` and
rewrites its table in docs/performance.md with `replace_marked_section`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import threadcpu

from common.base.files import write_text_atomic
from common.base.host import cpu_flags, cpu_model
# The step timer the reference-side drivers use too (standard library only: they run in other venvs).
from reference.steptime import time_calls as time_steps  # noqa: F401  (re-exported to the benchmarks)

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks/results"
DOC = REPO / "docs/performance.md"
SGEMM_SIZE = 2048

# Widest first: the first of these the CPU's flags name is its vector instruction set.
VECTOR_ISAS = ("avx512f", "avx2", "avx", "sse4_2")


def vector_isa() -> str:
    """The widest SIMD instruction set /proc/cpuinfo's flags name (avx512f, avx2, avx, sse4_2), or "unknown".

    Convolution and GEMM rates follow it: the same VM type can land on hosts with and without AVX-512."""
    flags = cpu_flags()
    return next((isa for isa in VECTOR_ISAS if isa in flags), "unknown")


# The flags a benchmark's caption names: the vector widths and the bfloat16/AMX units that decide convolution and
# GEMM speed on the hosts this VM kind lands on.
CAPTION_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def caption_flags() -> str:
    """The flags of CAPTION_FLAGS that /proc/cpuinfo names, space-separated; "none" where it names none of them."""
    flags = cpu_flags()
    return " ".join(flag for flag in CAPTION_FLAGS if flag in flags) or "none"


def sgemm_gflops(n: int = SGEMM_SIZE, repeats: int = 5) -> float:
    """Best-of-N numpy float32 matrix multiply rate (all cores)."""
    a, b = (np.random.default_rng(0).random((n, n), dtype=np.float32) for _ in range(2))
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of `fn`."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t




def time_steps_with_threads(step: Callable[[], object], warmup: int, steps: int, runtime_threads: set[int],
                            dist) -> tuple[list[float], list[dict]]:
    """`steps` timed calls of `step` after `warmup` untimed ones, and every rank's CPU per step by thread role
    over the timed calls (threadcpu.account; `runtime_threads`: those init_distributed started)."""
    time_steps(step, warmup, 0)
    before = threadcpu.snapshot()
    seconds = time_steps(step, 0, steps)
    cpu = threadcpu.account(before, threadcpu.snapshot(), runtime_threads, steps)
    return seconds, dist.gather_object(cpu)


def write_worker_result(out: str | Path, step_seconds: Sequence[float], dist, **extra) -> None:
    """On rank 0 only: the step times, threads per rank, ranks and `extra` figures as JSON at `out`."""
    if dist.is_root:
        Path(out).write_text(json.dumps({"step_seconds": list(step_seconds), "threads_per_rank": dist.threads,
                                         "ranks": dist.size, **extra}))


def run_worker(script: str | Path, args: Sequence[str], ranks: int, out: Path, label: str,
               launcher: Sequence[str] = (), env: dict | None = None) -> dict:
    """Run `script --worker ARGS --out OUT` on `ranks` local ranks and return the JSON it wrote.

    Prints `label` first; exits with the worker's output tail when it fails or writes nothing. `launcher`:
    further horovodrun options (e.g. "--gloo"); `env`: variables to set for the run.
    """
    cmd = worker_command(script, args, out)
    if ranks > 1:
        horovodrun = Path(sys.executable).parent / "horovodrun"
        cmd = [str(horovodrun), *launcher, "-np", str(ranks), "-H", f"localhost:{ranks}"] + cmd
    print(f"  {label} ...", flush=True)
    proc = subprocess.run(cmd, env=worker_env(env), capture_output=True, text=True)
    return take_worker_json(out, proc.returncode, cmd, proc.stdout[-3000:] + "\n" + proc.stderr[-3000:])


def worker_command(script: str | Path, args: Sequence[str], out: Path) -> list[str]:
    """`python SCRIPT --worker ARGS --out OUT`, with any stale OUT removed first (it must not pass for this run's
    figures)."""
    out.unlink(missing_ok=True)
    return [sys.executable, str(script), "--worker", *args, "--out", str(out)]


def worker_env(extra: dict | None = None) -> dict:
    """A worker's environment: ours, TensorFlow's C++ log quiet, and `extra`."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(extra or {})}


def take_worker_json(out: Path, returncode: int, cmd: Sequence[str], log: str) -> dict:
    """The JSON a finished worker wrote at `out` (removed after reading); exits with the command and its
    output's tail when the worker failed or wrote nothing."""
    if returncode != 0 or not out.is_file():
        what = f"exit code {returncode}" if returncode else f"exit code 0 but no {out}"
        raise SystemExit(f"worker failed, {what} ({' '.join(map(str, cmd))}):\n{log}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def step_figures(step_seconds: Sequence[float], local_batch: int, ranks: int) -> dict:
    """Median step time and the samples per second over all ranks it gives."""
    median = float(np.median(step_seconds))
    return {"median_step_seconds": median, "samples_per_second": local_batch * ranks / median}


def interleaved(keys: Sequence, rounds: int) -> list:
    """`rounds` passes over `keys`, every second one backwards (A B, B A, A B, ...): a drift in the machine's
    speed during the run (a shared VM's can be 40% within an hour) then falls on every key alike, and each
    round's pair of neighbours is measured back to back."""
    if rounds < 1:
        raise ValueError(f"rounds {rounds}: expected at least 1")
    return [key for r in range(rounds) for key in (keys if r % 2 == 0 else list(reversed(keys)))]


def measure_rounds(keys: Sequence, rounds: int, measure: Callable[[object], dict]) -> dict:
    """`measure(key)` for every key in `interleaved` order, with the sgemm rate measured just before each call
    and printed after it; per key, its rounds pooled (`pool_rounds`)."""
    done: dict = {key: [] for key in keys}
    for key in interleaved(list(keys), rounds):
        sgemm = sgemm_gflops()
        done[key].append({**measure(key), "sgemm_gflops": sgemm})
        r = done[key][-1]
        print(f"    {r['samples_per_second']:.3g} samples/s, median step {r['median_step_seconds']:.3g} s "
              f"(sgemm just before: {sgemm:.1f} GFLOP/s)", flush=True)
    return {key: pool_rounds(results) for key, results in done.items()}


def measure_groups(name: str, groups: Sequence, ranks: Sequence[int], rounds: int,
                   measure: Callable[[object, int], dict]) -> dict:
    """`measure(group, ranks)` for every group (a sample size, a case) at every rank count, in `rounds`
    interleaved rounds (`measure_rounds`): the results file's header (its sgemm the mean of the run's), rows
    and, per group (keyed `name`), the most ranks' samples/s over the fewest's (`rank_ratio`)."""
    ranks = list(dict.fromkeys(ranks))
    runs, ratios = [], []
    for group in groups:
        started = time.perf_counter()
        rows = list(measure_rounds(ranks, rounds, lambda r: measure(group, r)).values())
        print(f"  {group}: {time.perf_counter() - started:.0f} s in all", flush=True)
        runs += rows
        if len(ranks) > 1:
            ratios.append({name: group, **rank_ratio(rows, max(ranks), min(ranks))})
    return {**run_header(float(np.mean([r["sgemm_gflops"] for r in runs]))), "rounds": rounds, "runs": runs,
            "rank_ratios": ratios}


def pool_rounds(results: Sequence[dict]) -> dict:
    """One case's rounds as one row: the first round's fields, the timed steps of all rounds pooled (median,
    samples/s and achieved GFLOP/s over them), the mean of the sgemm rates measured before each round, and per
    round its own median step, samples/s and sgemm rate."""
    first = results[0]
    steps = [s for r in results for s in r["step_seconds"]]
    pooled = {**first, **step_figures(steps, first["local_batch"], first["ranks"]), "step_seconds": steps,
              "sgemm_gflops": float(np.mean([r["sgemm_gflops"] for r in results])),
              "rounds": [{key: r[key] for key in ("median_step_seconds", "samples_per_second", "sgemm_gflops")}
                         for r in results]}
    if "gflop_per_sample" in first:
        pooled["achieved_gflops"] = pooled["samples_per_second"] * first["gflop_per_sample"]
    return pooled


def rank_ratio(runs: Sequence[dict], ranks: int, base: int) -> dict | None:
    """Samples/s of `ranks` ranks over `base` ranks among `runs` (one group: the same network and sample),
    pooled and per round (each round's two measurements were taken back to back); None when either is missing."""
    by = {r["ranks"]: r for r in runs}
    if ranks not in by or base not in by:
        return None
    top, bottom = by[ranks], by[base]
    per_round = [a["samples_per_second"] / b["samples_per_second"]
                 for a, b in zip(top.get("rounds", ()), bottom.get("rounds", ()))]
    return {"ranks": ranks, "base_ranks": base, "ratio": top["samples_per_second"] / bottom["samples_per_second"],
            "per_round": per_round}


def ratios_line(ratios: Sequence[dict], label: Callable[[dict], str]) -> str:
    """The line under a table giving each group's `rank_ratio` (named by `label(ratio)`) and its rounds'; ''
    when there is none."""
    if not ratios:
        return ""

    def text(x: dict) -> str:
        rounds = f" (rounds {', '.join(f'{v:.2f}' for v in x['per_round'])})" if len(x["per_round"]) > 1 else ""
        return f"{label(x)} {x['ratio']:.2f}{rounds}"
    first = ratios[0]
    return (f"\nsamples/s of {first['ranks']} ranks over {first['base_ranks']} rank(s), all rounds' steps pooled "
            f"(in each round the two were measured back to back): {'; '.join(map(text, ratios))}.")


@contextlib.contextmanager
def worktree(commit: str, tree: Path) -> Iterator[Path]:
    """A clean checkout of `commit` at `tree` (`git worktree add`), this checkout's .venv linked in, removed on
    leaving. Its scripts import this checkout's packages unless the tree is first on their path (the project is
    installed editable): callers put it on PYTHONPATH."""
    proc = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"--commits {commit}: git worktree add failed: {proc.stderr.strip()}")
    try:
        (tree / ".venv").symlink_to(REPO / ".venv")
        yield tree
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def run_header(sgemm: float) -> dict:
    """Date, machine, CPU, its ISA flags, the code's commit and the sgemm rate: the fields every results file starts
    with, and what the caption under its table says of the run."""
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {os.cpu_count()} cores",
            "cpu": f"{cpu_model()}, {vector_isa()}", "isa_flags": caption_flags(), "commit": code_commit(),
            "sgemm_gflops": sgemm}


def code_commit() -> str:
    """HEAD's short commit, "with local changes" added when tracked files differ from it; "unknown" outside a git
    work tree."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head.stdout.strip() + (" with local changes" if changed.stdout.strip() else "")


def measured_note(result: dict) -> str:
    """The line under a results table: the sgemm rate (the range over the run when it was measured before
    each row), then `measured_on`."""
    rates = [x["sgemm_gflops"] for r in result.get("runs", ()) for x in r.get("rounds", ())]
    sgemm = (f"{min(rates):.1f}-{max(rates):.1f} GFLOP/s, measured before each of the run's {len(rates)} measurements"
             if rates else f"{result['sgemm_gflops']:.1f} GFLOP/s")
    return f"\nsgemm (numpy, {SGEMM_SIZE}^2, float32, all cores): {sgemm}. {measured_on(result)}"


def measured_on(result: dict) -> str:
    """What a table's caption says of its run: "Measured DATE on MACHINE (CPU). ISA flags: ...; commit ...", naming
    what an older results file did not record."""
    cpu = f" ({result['cpu']})" if result.get("cpu") else ""
    facts = {"ISA flags": result.get("isa_flags"),
             "commit": result.get("commit") or (result.get("code") or {}).get("commit", "")[:7]}
    known = "; ".join(f"{name} {value}" if name == "commit" else f"{name}: {value}"
                      for name, value in facts.items() if value)
    missing = (["CPU model"] if not cpu else []) + [name for name, value in facts.items() if not value]
    known = f" {known[0].upper()}{known[1:]}." if known else ""
    return f"Measured {result['date']} on {result['machine']}{cpu}.{known}" + (
        f" Not recorded: {', '.join(missing)}." if missing else "")


class VenvError(RuntimeError):
    """A pinned environment could not be built; the message has the command and its output's tail."""


def read_pins(path: Path) -> list[str]:
    """A requirements file's lines without comments and blank lines."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pinned_venv(venv: Path, pins: Sequence[str], label: str, pip_options: Sequence[str] = (), env: dict | None = None,
                finish: Callable[[Path], None] | None = None) -> Path:
    """The interpreter of the virtual environment `venv` holding exactly `pins`: built the first time and again when
    the pins change (a sha256 of them is stamped in it); `finish(python)` completes a fresh build before the stamp.
    Raises VenvError when a step fails."""
    stamp, digest = venv / ".pins-sha256", hashlib.sha256("\n".join(pins).encode()).hexdigest()
    python = venv / "bin/python"
    if python.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return python
    print(f"building {label} {venv} ({len(pins)} pinned packages) ...", flush=True)
    for cmd in ([sys.executable, "-m", "venv", "--clear", str(venv)],
                [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *pip_options, *pins]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise VenvError(f"building {venv} failed (exit {proc.returncode}, {' '.join(cmd)}):\n"
                            f"{(proc.stdout + proc.stderr)[-3000:]}")
    if finish:
        finish(python)
    stamp.write_text(digest)
    return python


def write_json_atomic(path: Path, obj) -> None:
    """Write `obj` as indented JSON through a temporary file, so a half-written file never appears."""
    write_text_atomic(json.dumps(obj, indent=2) + "\n", path)


def check_marked_section(doc: Path, begin: str, end: str) -> None:
    """Fail now, not after a long run, when `doc` lacks the `begin` ... `end` markers."""
    _marked_span(doc.read_text(), doc, begin, end)


def replace_marked_section(doc: Path, begin: str, end: str, body: str) -> None:
    """Replace the text between the `begin` and `end` marker lines of `doc` with `body`."""
    text = doc.read_text()
    start, stop = _marked_span(text, doc, begin, end)
    write_text_atomic(text[:start] + "\n" + body + "\n" + text[stop:], doc)


def _marked_span(text: str, doc: Path, begin: str, end: str) -> tuple[int, int]:
    """Character offsets of the text between the markers."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start + len(begin):
        raise ValueError(f"{doc}: expected the marker {begin!r} and after it {end!r}; found them at "
                         f"character {start} and {stop} (-1: missing)")
    return start + len(begin), stop
