"""Export a trained model to ONNX: `python -m common.export RUN_DIR --format onnx --out model.onnx [--check]`.

The model is rebuilt from the run's config.yaml as training builds it (float32: a mixed-precision run keeps float32
variables) and given the weights of the run's newest checkpoint (`--checkpoint` picks another), which must check
out against its meta.json (common/runtime/checkpoint.py). The ONNX file is the inference graph (dropout off,
batch norm with its moving statistics) with a dynamic batch dimension, written under a temporary name and renamed
when complete. `--check` reads `--samples` validation samples with the benchmark's own input pipeline, runs them
through Keras and onnxruntime and compares: the largest absolute difference relative to the largest absolute Keras
output must be at most `--tolerance`. Exit codes: 0 exported (and matched), 1 the outputs differ, 2 bad input.
docs/export.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from common.base import exits
from common.base.cli import exit_now, guarded
from common.base.files import check_target
from common.base.errors import BenchError
from common.runtime.checkpoint import MODEL_FILE, check_checkpoint, checkpoint_dir, list_checkpoints
from common.runtime.config import CheckpointConfig, load_config

FORMATS = ("onnx",)
TOLERANCE = 1e-4  # of the largest absolute Keras output
CONFIG_FILE = "config.yaml"
HOW_TO_CHECKPOINT = ("a run that reaches its target keeps the weights that met it (checkpoint.keep_trained, the "
                     "default); for others, train with checkpoint.every_epochs=1 (a checkpoint at every epoch's end)")


@dataclasses.dataclass(frozen=True)
class App:
    """What export needs of a benchmark: its config schema, its model as training builds it, its validation
    inputs (config, samples) -> (N, ...) float32."""

    config_schema: Callable[[], type]
    build_model: Callable[[Any], Any]
    inputs: Callable[[Any, int], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How far onnxruntime's outputs lie from Keras': `max_abs` over all elements, `relative` to `scale`, the
    largest absolute Keras output."""

    max_abs: float
    scale: float
    relative: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(self.relative <= self.tolerance)  # NaN fails

    def describe(self) -> str:
        verdict = "match" if self.ok else "DIFFER"
        return (f"max abs difference {self.max_abs:.3g}, relative {self.relative:.3g} (to the largest |Keras output| "
                f"{self.scale:.3g}; tolerance {self.tolerance:g}): {verdict}")


def compare(reference: np.ndarray, candidate: np.ndarray, tolerance: float = TOLERANCE) -> Comparison:
    """Compare `candidate` (onnxruntime) with `reference` (Keras) outputs of the same shape."""
    reference, candidate = np.asarray(reference, np.float64), np.asarray(candidate, np.float64)
    if reference.shape != candidate.shape:
        raise BenchError(f"onnxruntime gave outputs of shape {list(candidate.shape)}, Keras "
                         f"{list(reference.shape)}; expected the same")
    max_abs = float(np.max(np.abs(reference - candidate))) if reference.size else 0.0
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    relative = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return Comparison(max_abs, scale, float(relative), tolerance)


# ---------------------------------------------------------------------------- the benchmarks
BENCHMARKS = ("cosmoflow", "deepcam")


def app_for(benchmark: str) -> App:
    """The export hooks of `benchmark`, found by name in its package (`<benchmark>/export.py` defines APP): common/
    imports no application, as the campaign runs `<benchmark>/train.py` by path."""
    if benchmark not in BENCHMARKS:
        raise BenchError(f"benchmark {benchmark!r}: expected one of {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"{benchmark}.export").APP


def direct_reads(data_cfg) -> Any:
    """The data section, reading data.dir in place with tf.data (no staging, no DALI)."""
    return dataclasses.replace(data_cfg, loader="tfdata", stage_dir="", shuffle=False)


def first_batch(dataset) -> np.ndarray:
    """The inputs of the first batch of `dataset`, float32."""
    x, _ = next(iter(dataset))
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------- the run and its checkpoint
@dataclasses.dataclass(frozen=True)
class Trained:
    """A run's config and the checkpoint to export, checked."""

    benchmark: str
    cfg: Any
    checkpoint: Path
    meta: dict


def open_run(run_dir: Path, checkpoint: Path | None = None) -> Trained:
    """The run in `run_dir` with its newest checkpoint (or `checkpoint`), checked; raises BenchError."""
    if not run_dir.is_dir():
        raise BenchError(f"{run_dir}: no such run directory (expected a training run's run.output_dir)")
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise BenchError(f"{config_path}: missing; {run_dir} is not a training run's output directory")
    if checkpoint is not None and not checkpoint.is_dir():
        raise BenchError(f"--checkpoint {checkpoint}: no such checkpoint directory")
    path = checkpoint or _newest_checkpoint(config_path, run_dir)
    try:
        meta = check_checkpoint(path)
    except BenchError as err:
        raise BenchError(f"{err}{_older_hint(path)}") from None
    benchmark = meta["benchmark"]
    if benchmark not in BENCHMARKS:
        raise BenchError(f"{path}/meta.json: benchmark {benchmark!r}, expected one of {', '.join(BENCHMARKS)}")
    cfg = load_config(config_path, (), app_for(benchmark).config_schema())
    return Trained(benchmark, cfg, path, meta)


def _newest_checkpoint(config_path: Path, run_dir: Path) -> Path:
    """The newest checkpoint directory of the run, from its config's checkpoint section."""
    try:
        section = (yaml.safe_load(config_path.read_text()) or {}).get("checkpoint") or {}
        directory = checkpoint_dir(CheckpointConfig(**section), run_dir)
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as err:
        raise BenchError(f"{config_path}: cannot read its checkpoint section ({err})") from None
    found = list_checkpoints(directory)
    if not found:
        raise BenchError(f"{directory}: no checkpoint, so this run has no trained weights to export; "
                         f"{HOW_TO_CHECKPOINT}")
    return found[0]


def _older_hint(path: Path) -> str:
    older = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    return f"; an older checkpoint can be exported with --checkpoint {older[0]}" if older else ""


def trained_model(run: Trained, app: App) -> Any:
    """The Keras model with the checkpoint's weights, called once (as export needs)."""
    import keras
    keras.mixed_precision.set_global_policy("float32")
    model = app.build_model(run.cfg)
    load_weights(run.checkpoint / MODEL_FILE, model.variables, run.meta["model_variables"])
    model(np.zeros((1, *model.input_shape[1:]), np.float32), training=False)
    return model


def load_weights(path: Path, variables: list, listed: list) -> None:
    """Assign the first len(variables) arrays of `path` (model variables, then the optimizer's) to `variables`,
    whose shapes must be those meta.json lists."""
    if len(listed) < len(variables):
        raise BenchError(f"{path}: {len(listed)} variables listed in meta.json, the model has {len(variables)}; "
                         f"the checkpoint was written by a different model or config")
    for i, (var, (name, shape, _)) in enumerate(zip(variables, listed)):
        if list(var.shape) != list(shape):
            raise BenchError(f"{path}: variable {i} ({name}) has shape {shape}, the model's {var.path} "
                             f"{list(var.shape)}; the checkpoint was written by a different model or config")
    try:
        with np.load(path) as arrays:
            for i, var in enumerate(variables):
                var.assign(arrays[f"v{i:05d}"])
    except (OSError, ValueError, KeyError, EOFError) as err:
        raise BenchError(f"{path}: not a readable checkpoint archive ({err})") from None


# ---------------------------------------------------------------------------- export and check
def export_onnx(model, out: Path) -> float:
    """Write `model` to `out` as ONNX through a temporary file; returns the seconds it took."""
    if not out.parent.is_dir():
        raise BenchError(f"--out {out}: directory {out.parent} does not exist")
    if check_target(out).is_dir():
        raise BenchError(f"--out {out}: a directory; expected the ONNX file's name")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.onnx")
    t0 = time.perf_counter()
    try:
        model.export(str(tmp), format="onnx", verbose=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return time.perf_counter() - t0


def onnx_session(path: Path):
    """An onnxruntime CPU session of the ONNX file `path`."""
    import onnxruntime
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def per_sample_seconds(run: Callable[[], Any], samples: int, repeats: int) -> float:
    """Median seconds per sample of `run` (a batch of `samples`) over `repeats` calls after one warm-up."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / samples


def check(model, session, x: np.ndarray, tolerance: float, repeats: int) -> Comparison:
    """Run `x` through Keras and onnxruntime, print the difference and the per-sample times."""
    name = session.get_inputs()[0].name
    keras_out = np.asarray(model.predict_on_batch(x))
    onnx_out = session.run(None, {name: x})[0]
    result = compare(keras_out, onnx_out, tolerance)
    print(f"check on {len(x)} validation samples {list(x.shape)}: {result.describe()}", flush=True)
    keras_s = per_sample_seconds(lambda: model.predict_on_batch(x), len(x), repeats)
    onnx_s = per_sample_seconds(lambda: session.run(None, {name: x}), len(x), repeats)
    print(f"inference per sample (batch {len(x)}, median of {repeats}): onnxruntime {onnx_s * 1e3:.2f} ms, Keras "
          f"{keras_s * 1e3:.2f} ms", flush=True)
    return result


# ---------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m common.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a training run's output directory (run.output_dir)")
    parser.add_argument("--format", default="onnx", help=f"export format: {', '.join(FORMATS)}")
    parser.add_argument("--out", type=Path, required=True, help="the file to write, e.g. model.onnx")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint directory (default: the run's newest)")
    parser.add_argument("--check", action="store_true", help="compare onnxruntime with Keras on validation samples")
    parser.add_argument("--samples", type=int, default=4, help="validation samples for --check (default 4)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help=f"largest allowed difference relative to the largest |Keras output| ({TOLERANCE:g})")
    parser.add_argument("--repeats", type=int, default=3, help="timed inference calls for --check (default 3)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.format not in FORMATS:
        raise BenchError(f"--format {args.format!r}: expected one of {', '.join(FORMATS)}")
    if args.samples < 1 or args.repeats < 1:
        raise BenchError(f"--samples {args.samples}, --repeats {args.repeats}: expected both >= 1")
    if not args.tolerance > 0:
        raise BenchError(f"--tolerance {args.tolerance}: expected a number > 0")


def export_run(args: argparse.Namespace) -> int:
    """Export (and with --check compare) the run of `args`; the exit code."""
    check_args(args)
    run = open_run(args.run_dir, args.checkpoint)
    app = app_for(run.benchmark)
    progress = run.meta["progress"]
    print(f"{run.benchmark}: checkpoint {run.checkpoint} (global step {run.meta['global_step']}, epoch "
          f"{progress['epoch']} step {progress['step']} next)", flush=True)
    model = trained_model(run, app)
    seconds = export_onnx(model, args.out)
    session = onnx_session(args.out)
    shape = session.get_inputs()[0].shape
    print(f"wrote {args.out}: {args.out.stat().st_size / 2 ** 20:.2f} MiB, {model.count_params():,} parameters, "
          f"input {shape}, exported in {seconds:.1f} s", flush=True)
    if not args.check:
        return 0
    x = app.inputs(run.cfg, args.samples)
    return exits.SUCCESS if check(model, session, x, args.tolerance, args.repeats).ok else exits.CHECKER_FAILED


def main(argv=None) -> int:
    args = parse_args(argv)
    return guarded(lambda: export_run(args))


if __name__ == "__main__":
    exit_now(main())
