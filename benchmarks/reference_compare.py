"""Time the MLCommons reference models beside the suite's, on this machine, in one invocation.

    python benchmarks/reference_compare.py --reference /path/to/mlcommons-hpc [--apps cosmoflow deepcam]
        [--precisions float32 mixed_bfloat16] [--rounds 2]
    make bench-reference REFERENCE=/path/to/mlcommons-hpc [ROUNDS=2]

--reference is a checkout of https://github.com/mlcommons/hpc (or a copy of its cosmoflow/ and deepcam/
folders). Each reference runs in a virtual environment of its own under .venv-reference/<app>, built from
benchmarks/reference/requirements-<app>.txt the first time (and again when that file changes); nothing
of the suite is installed there. For each benchmark one process trains the suite's model (the workers of
cosmoflow_throughput.py and deepcam_throughput.py, one rank using every core) and one process trains the
reference's own model file (benchmarks/reference/<app>_step.py), on the same in-memory data shapes, batch
and step count, at each of --precisions (both sides in the same precision), in --rounds rounds that alternate the
two sides (suite, reference; reference, suite; ...: harness.measure_rounds, numpy's sgemm rate before each
measurement), each side's steps of all rounds pooled; the ratio of each round's back-to-back pair is kept
beside the pooled one. With both precisions, a row per benchmark also sets each side's faster precision against
the other's: the side-by-side at each side's best precision. The sgemm rate is also measured before and after
the whole run. The references have no bfloat16 mode of their own
(CosmoFlow's --amp is mixed_float16; DeepCAM has no CPU autocast): for mixed_bfloat16 the harness sets the
Keras 2 `mixed_bfloat16` global policy before the reference CosmoFlow model is built, and runs the reference
DeepCAM's forward and loss under `torch.autocast("cpu", dtype=torch.bfloat16)`; the suite trains as
train.precision=mixed_bfloat16 does. It writes benchmarks/results/reference_compare_<host kind>.json (host kind:
the CPU's maker and family and its widest matrix unit's flag, e.g. intel-xeon-avx512f: hosts of this VM kind
differ from
day to day) and rewrites the table between its markers in docs/performance.md from every host kind's
latest file, one block of rows per kind. Only ratios of figures from one such run should be quoted.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
from pathlib import Path

from harness import (DOC, REPO, RESULTS_DIR, VenvError, check_marked_section, measure_rounds, measured_on,
                     pinned_venv, read_pins, replace_marked_section, run_header, sgemm_gflops, step_figures,
                     take_worker_json, write_json_atomic)

RESULTS_GLOB = "reference_compare_*.json"
BEGIN, END = "<!-- reference-compare:begin -->", "<!-- reference-compare:end -->"
HERE = REPO / "benchmarks/reference"
VENVS = REPO / ".venv-reference"
UPSTREAM = "https://github.com/mlcommons/hpc"
PRECISIONS = ("float32", "mixed_bfloat16")
BF16_NOTE = ("bfloat16 is not a mode of the references: the harness sets the Keras 2 `mixed_bfloat16` policy before "
             "the reference CosmoFlow model is built (where its train.py sets --amp's mixed_float16) and wraps the "
             "reference DeepCAM's forward and loss in `torch.autocast(\"cpu\", dtype=torch.bfloat16)`; the suite "
             "trains as train.precision=mixed_bfloat16.")


@dataclasses.dataclass(frozen=True)
class RefApp:
    files: tuple[str, ...]  # what the reference side reads from the checkout
    sample: str  # the shape both sides train on, for the table
    local_batch: int
    warmup: int
    steps: int


APPS = {
    "cosmoflow": RefApp(("cosmoflow/models/cosmoflow.py", "cosmoflow/models/layers.py",
                         "cosmoflow/configs/cosmo.yaml"), "128^3 x 4", local_batch=4, warmup=2, steps=4),
    "deepcam": RefApp(("deepcam/src/deepCam/architecture/deeplab_xception.py",), "768 x 1152 x 16",
                      local_batch=1, warmup=1, steps=3),
}


def check_checkout(checkout: Path, apps) -> None:
    """Exit with the missing paths when `checkout` lacks a file the reference side of `apps` reads."""
    if not checkout.is_dir():
        raise SystemExit(f"--reference {checkout}: not a directory; expected a checkout of {UPSTREAM}")
    missing = [f for app in apps for f in APPS[app].files if not (checkout / f).is_file()]
    if missing:
        raise SystemExit(f"--reference {checkout}: missing {', '.join(missing)}; expected a checkout of "
                         f"{UPSTREAM} (its cosmoflow/ and deepcam/ folders)")


def checkout_commit(checkout: Path) -> str | None:
    """The checkout's HEAD commit, or None when it is not a git work tree."""
    proc = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def requirements(app: str) -> list[str]:
    """The pinned packages of `app`'s reference environment (TF_PACKAGE swaps the TensorFlow build)."""
    tf_package = os.environ.get("TF_PACKAGE")
    return [f"{tf_package}=={p.split('==')[1]}" if tf_package and p.startswith("tensorflow-cpu==") else p
            for p in read_pins(HERE / f"requirements-{app}.txt")]


def reference_python(app: str) -> Path:
    """The reference environment's interpreter, built or rebuilt when its pins changed."""
    try:
        return pinned_venv(VENVS / app, requirements(app), f"the {app} reference environment")
    except VenvError as err:
        raise SystemExit(str(err)) from None


def reference_env() -> dict:
    """The environment a reference step runs in. oneDNN on, as in the reference's CPU build (intel-tensorflow)
    and as the suite runs: TensorFlow 2.15 leaves it off on CPUs without AVX-512, where Conv3D training is
    about 4x slower. float32 stays float32 on both sides. A value the user set wins."""
    return {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT", **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_reference(app: str, checkout: Path, python: Path, warmup: int, steps: int, precision: str) -> dict:
    """Time the checkout's `app` model in its own environment, in `precision`; the figures of one table row."""
    out = RESULTS_DIR / f".reference-{app}.json"
    out.unlink(missing_ok=True)
    cmd = [str(python), str(HERE / f"{app}_step.py"), "--checkout", str(checkout), "--batch",
           str(APPS[app].local_batch), "--warmup", str(warmup), "--steps", str(steps), "--precision", precision,
           "--out", str(out)]
    print(f"  reference {app} ({APPS[app].sample}, batch {APPS[app].local_batch}, {precision}): {warmup} warm-up + "
          f"{steps} timed steps ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=reference_env())
    res = take_worker_json(out, proc.returncode, cmd, proc.stdout[-3000:] + "\n" + proc.stderr[-3000:])
    return {**res, **step_figures(res["step_seconds"], APPS[app].local_batch, 1), "local_batch": APPS[app].local_batch,
            "ranks": 1}


def run_suite(app: str, warmup: int, steps: int, precision: str) -> dict:
    """Time the suite's `app` model on one rank with the throughput benchmark's worker, in `precision`."""
    if app == "cosmoflow":
        import cosmoflow_throughput
        res = cosmoflow_throughput.measure(128, 1, APPS[app].local_batch, steps, warmup, precision)
    else:
        import deepcam_throughput
        res = deepcam_throughput.measure("reference", 1, steps, warmup, precision)
    return {**{k: res[k] for k in ("step_seconds", "median_step_seconds", "samples_per_second", "threads_per_rank")},
            "local_batch": APPS[app].local_batch, "ranks": 1}


def compare(app: str, checkout: Path, warmup: int | None, steps: int | None, precision: str,
            rounds: int = 1) -> dict:
    """The suite's and the reference's figures for `app` in `precision`, measured in `rounds` alternating rounds,
    each side's steps pooled, and their ratio (pooled, and per round of two back-to-back measurements)."""
    warmup = APPS[app].warmup if warmup is None else warmup
    steps = APPS[app].steps if steps is None else steps
    python = reference_python(app)
    sides = {"suite": lambda: run_suite(app, warmup, steps, precision),
             "reference": lambda: run_reference(app, checkout, python, warmup, steps, precision)}
    pooled = measure_rounds(list(sides), rounds, lambda side: sides[side]())
    suite, reference = pooled["suite"], pooled["reference"]
    return {"app": app, "precision": precision, "sample": APPS[app].sample, "local_batch": APPS[app].local_batch,
            "suite": suite, "reference": reference, "rounds": rounds,
            "suite_over_reference": suite["samples_per_second"] / reference["samples_per_second"],
            "suite_over_reference_per_round": [s["samples_per_second"] / r["samples_per_second"]
                                               for s, r in zip(suite["rounds"], reference["rounds"])]}


def fastest(runs: list[dict], side: str) -> dict:
    """The run whose `side` ("suite" or "reference") trained fastest."""
    return max(runs, key=lambda r: r[side]["samples_per_second"])


def best_precisions(runs: list[dict]) -> list[dict]:
    """Per benchmark measured in more than one precision: each side at its own fastest precision, and the ratio."""
    best = []
    for app in dict.fromkeys(r["app"] for r in runs):
        mine = [r for r in runs if r["app"] == app]
        if len(mine) > 1:
            suite, reference = fastest(mine, "suite"), fastest(mine, "reference")
            best.append({"app": app, "sample": suite["sample"], "local_batch": suite["local_batch"],
                         "suite_precision": suite["precision"], "reference_precision": reference["precision"],
                         "suite": suite["suite"], "reference": reference["reference"],
                         "suite_over_reference": suite["suite"]["samples_per_second"]
                         / reference["reference"]["samples_per_second"]})
    return best


def host_kind(result: dict) -> tuple[str, str]:
    """(slug, words) of the host a results file was measured on: the CPU's maker and family and its widest matrix
    unit (AMX-BF16, AVX-512 with AVX512-BF16, AVX-512, AVX2), e.g. ("intel-xeon-avx512f", "Intel Xeon, AVX-512")."""
    cpu, flags = result.get("cpu", ""), set(result.get("isa_flags", "").split())
    maker = next((name for key, name in (("EPYC", "AMD EPYC"), ("AMD", "AMD"), ("Xeon", "Intel Xeon"),
                                         ("Intel", "Intel")) if key in cpu), cpu.split(",")[0] or "unknown CPU")
    flag, unit = next(((flag, words) for flag, words in (
        ("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX-512 with AVX512-BF16"), ("avx512f", "AVX-512"),
        ("avx2", "AVX2")) if flag in flags), ("sse", "no AVX2"))
    return f"{maker.lower().replace(' ', '-')}-{flag}", f"{maker}, {unit}"


def results_path(result: dict) -> Path:
    return RESULTS_DIR / f"reference_compare_{host_kind(result)[0]}.json"


def ratio_cell(run: dict) -> str:
    """The pooled ratio, and the range of the per-round ratios where there were several rounds."""
    per_round = run.get("suite_over_reference_per_round", [])
    spread = (f" (rounds {min(per_round):.2f}-{max(per_round):.2f})" if len(per_round) > 1 else "")
    return f"{run['suite_over_reference']:.2f}{spread}"


def table_row(kind: str, run: dict, precision: str) -> str:
    return (f"| {kind} | {run['app']} | {precision} | {run['sample']}, {run['local_batch']} "
            f"| {run['suite']['samples_per_second']:.3g} "
            f"| {run['reference']['samples_per_second']:.3g} ({run['reference']['framework']}) | {ratio_cell(run)} |")


def table(results: list[dict]) -> str:
    """One table, a block of rows per host kind (each its latest run: every precision, then each side at its
    fastest), and under it each run's sgemm, rounds, reference commit, date and ISA."""
    rows = ["| host | benchmark | precision | sample, batch | suite samples/s | reference samples/s (framework) "
            "| suite / reference |", "|---|---|---|---|---|---|---|"]
    notes = []
    for result in results:
        kind = host_kind(result)[1]
        rows += [table_row(kind, r, r.get("precision", "float32")) for r in result["runs"]]
        rows += [table_row(kind, b, f"each side's fastest: suite {b['suite_precision']}, reference "
                                    f"{b['reference_precision']}") for b in best_precisions(result["runs"])]
        commit = result["reference_commit"] or "not a git work tree"
        rounds = result["runs"][0].get("rounds", 1) if result["runs"] else 1
        notes.append(f"{kind}: sgemm (numpy, 2048^2, float32, all cores) {result['sgemm_gflops']:.1f} GFLOP/s "
                     f"before, {result['sgemm_gflops_after']:.1f} after; {rounds} round(s) per row. Reference "
                     f"checkout's HEAD: {commit}. {measured_on(result)}")
    rows += [f"\n{note}" for note in notes]
    if any(r.get("precision") == "mixed_bfloat16" for result in results for r in result["runs"]):
        rows.append(f"\n{BF16_NOTE}")
    return "\n".join(rows)


def recorded_results() -> list[dict]:
    """Every host kind's latest results file, by host kind."""
    return sorted((json.loads(path.read_text()) for path in RESULTS_DIR.glob(RESULTS_GLOB)),
                  key=lambda result: host_kind(result)[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", type=Path, default=os.environ.get("REFERENCE"),
                   help="a checkout of mlcommons/hpc (default: $REFERENCE)")
    p.add_argument("--apps", nargs="+", choices=sorted(APPS), default=sorted(APPS))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--steps", type=int, help="timed steps per side (default: cosmoflow 4, deepcam 3)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: cosmoflow 2, deepcam 1)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two sides per row (default 2)")
    p.add_argument("--setup-only", action="store_true", help="build the reference environments and exit")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    if args.setup_only:
        for app in args.apps:
            print(f"{app}: {reference_python(app)}")
        return
    if args.reference is None:
        raise SystemExit("no reference checkout: give --reference PATH (or REFERENCE=PATH), a checkout of "
                         f"{UPSTREAM}")
    checkout = args.reference.resolve()
    check_checkout(checkout, args.apps)
    check_marked_section(DOC, BEGIN, END)
    print("sgemm ...", flush=True)
    result = {**run_header(sgemm_gflops()), "reference_checkout": str(checkout),
              "reference_commit": checkout_commit(checkout)}
    result["runs"] = [compare(app, checkout, args.warmup, args.steps, precision, args.rounds) for app in args.apps
                      for precision in args.precisions]
    result["sgemm_gflops_after"] = sgemm_gflops()
    path = results_path(result)
    write_json_atomic(path, result)
    replace_marked_section(DOC, BEGIN, END, table(recorded_results()))
    for r in result["runs"]:
        print(f"  {r['app']} {r['precision']}: suite / reference = {ratio_cell(r)}")
    for b in best_precisions(result["runs"]):
        print(f"  {b['app']} at each side's fastest (suite {b['suite_precision']}, reference "
              f"{b['reference_precision']}): suite / reference = {b['suite_over_reference']:.2f}")
    print(f"wrote {path} and the table in {DOC} ({host_kind(result)[1]})")


if __name__ == "__main__":
    main()
