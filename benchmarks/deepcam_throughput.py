"""Measure DeepCAM training throughput and this machine's sgemm rate, in one run.

    python benchmarks/deepcam_throughput.py [--cases reference mini] [--ranks 1 2] [--steps N] [--warmup N]
                                            [--rounds 2]

For each case and rank count it launches a worker (under `horovodrun -np N` for N > 1) that
times real training steps (forward, backward, grouped gradient allreduce, LAMB update) of the
DeepLabv3+ network on in-memory random data, float32. Model, optimizer, loss and Horovod settings
come from the case's config:

    reference  deepcam/configs/deepcam.yaml       768 x 1152 x 16, width 1, local batch 1
    mini       deepcam/configs/deepcam_mini.yaml  96 x 144 x 16, width 0.125, local batch 4

It writes benchmarks/results/deepcam_throughput.json and rewrites the table between the markers
in docs/performance.md, both with the cases of this run only. Each case's rank counts are measured in
--rounds rounds, every second one in reverse order, with numpy's sgemm rate before each measurement
(harness.measure_rounds); each row pools its rounds' steps. Input I/O is not part of this figure.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from common.runtime.monitor import training_gflop_per_sample
# Run as a script, so benchmarks/ is on sys.path.
from harness import (DOC, REPO, RESULTS_DIR, check_marked_section, measure_groups, measured_note, ratios_line,
                     replace_marked_section, run_worker, step_figures, time_steps_with_threads,
                     write_json_atomic, write_worker_result)
from threadcpu import started_threads

RESULTS = RESULTS_DIR / "deepcam_throughput.json"
BEGIN, END = "<!-- deepcam-throughput:begin -->", "<!-- deepcam-throughput:end -->"
# Label classes (background, cyclone, river) drawn independently per pixel with about the pixel
# frequencies of the synthetic snapshots (docs/climate_data.md: 98.5%, 0.07%, 1.4%).
LABEL_FREQUENCIES = (0.985, 0.0007, 0.0143)


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked network size: where its settings come from and how many steps to time."""

    config: str  # YAML under the repository whose model, optimizer, loss and dist sections are used
    local_batch: int | None  # None: the config's train.local_batch_size
    warmup: int  # default untimed steps (the first traces the step function)
    steps: int  # default timed steps


# The reference config trains at local batch 2; 1 halves a step's time and memory on a small machine.
CASES = {"reference": Case("deepcam/configs/deepcam.yaml", local_batch=1, warmup=1, steps=3),
         "mini": Case("deepcam/configs/deepcam_mini.yaml", local_batch=None, warmup=3, steps=20)}


def load_case(name: str):
    """The case's config and its local batch size."""
    from common.runtime.config import load_config
    from deepcam.config import DeepCamConfig
    cfg = load_config(REPO / CASES[name].config, schema=DeepCamConfig)
    return cfg, CASES[name].local_batch or cfg.train.local_batch_size


# ----------------------------------------------------------------------------- worker

def random_batch(batch: int, input_shape, num_classes: int, seed: int):
    """(B, H, W, C) float32 fields in [0, 1) (min-max normalised data's range), (B, H, W) int32 labels."""
    if num_classes != len(LABEL_FREQUENCIES):
        raise ValueError(f"model.num_classes {num_classes}: the random labels have {len(LABEL_FREQUENCIES)} "
                         f"classes with frequencies {LABEL_FREQUENCIES}")
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *input_shape), dtype=np.float32)
    y = rng.choice(num_classes, size=(batch, *input_shape[:2]), p=LABEL_FREQUENCIES).astype(np.int32)
    return x, y


def build_train_step(cfg, dist):
    """The model and the training loop's step function, with the config's LAMB and loss."""
    import keras

    from common.runtime.strategy import make_train_step
    from deepcam.model import WeightedCrossEntropy, build_model, class_weights
    from deepcam.optim import StepSchedule, build_optimizer
    keras.utils.set_random_seed(cfg.run.seed + dist.rank)
    model = build_model(**dataclasses.asdict(cfg.model))
    # The rate does not change a step's work; the peak keeps updates non-zero (warm-up starts at 0).
    optimizer = build_optimizer(cfg.optimizer, StepSchedule.from_config(cfg.optimizer, cfg.schedule).peak_lr)
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables(model.variables + optimizer.variables)
    loss = WeightedCrossEntropy(class_weights(cfg.loss.class_frequencies, cfg.loss.weight_power))
    return model, make_train_step(model, optimizer, loss, dist)


def worker(case: str, steps: int, warmup: int, out: str, precision: str = "float32") -> None:
    """Time `steps` training steps on this rank in `precision` (a Keras policy); rank 0 writes the result."""
    from common.runtime.dist import init_distributed
    cfg, batch = load_case(case)
    dist, runtime_threads = started_threads(lambda: init_distributed(cfg.dist))
    import keras
    import tensorflow as tf
    keras.mixed_precision.set_global_policy(precision)  # as the run sets train.precision, before the model

    from deepcam.model import count_parameters
    model, step = build_train_step(cfg, dist)
    x, y = (tf.convert_to_tensor(a) for a in random_batch(batch, cfg.model.input_shape, cfg.model.num_classes,
                                                          seed=dist.rank))
    times, thread_cpu = time_steps_with_threads(lambda: float(step(x, y)), warmup, steps, runtime_threads, dist)
    write_worker_result(out, times, dist, gflop_per_sample=training_gflop_per_sample(model),
                        parameters=count_parameters(model), thread_cpu=thread_cpu)


# ----------------------------------------------------------------------------- driver

def measure(case: str, ranks: int, steps: int | None, warmup: int | None, precision: str = "float32") -> dict:
    """Time one case on `ranks` ranks in a worker process, in `precision`; the figures of one table row."""
    cfg, batch = load_case(case)
    steps = CASES[case].steps if steps is None else steps
    warmup = CASES[case].warmup if warmup is None else warmup
    shape = " x ".join(map(str, cfg.model.input_shape))
    label = (f"{case} ({shape}, width {cfg.model.width:g}, local batch {batch}), {ranks} rank(s): "
             f"{precision}, {warmup} warm-up + {steps} timed steps")
    res = run_worker(__file__, ["--case", case, "--steps", str(steps), "--warmup", str(warmup), "--precision",
                                precision], ranks,
                     RESULTS_DIR / f".worker-deepcam-{case}-{ranks}.json", label)
    figures = step_figures(res["step_seconds"], batch, ranks)
    return {"case": case, "config": CASES[case].config, "input_shape": list(cfg.model.input_shape),
            "width": cfg.model.width, "optimizer": cfg.optimizer.name, "parameters": res["parameters"],
            "ranks": ranks, "local_batch": batch, "threads_per_rank": res["threads_per_rank"], **figures,
            "gflop_per_sample": res["gflop_per_sample"],
            "achieved_gflops": figures["samples_per_second"] * res["gflop_per_sample"],
            "step_seconds": res["step_seconds"]}


def table_rows(result: dict) -> list[str]:
    """The markdown table of docs/performance.md, one row per case and rank count, and its note."""
    rows = ["| case | sample | width | ranks x threads | local batch | median step (s) | samples/s "
            "| training GFLOP/sample | GFLOP/s achieved | fraction of sgemm |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        rows.append(f"| {r['case']} | {' x '.join(map(str, r['input_shape']))} | {r['width']:g} "
                    f"| {r['ranks']} x {r['threads_per_rank']} | {r['local_batch']} | {r['median_step_seconds']:.3g} "
                    f"| {r['samples_per_second']:.3g} | {r['gflop_per_sample']:.4g} | {r['achieved_gflops']:.1f} "
                    f"| {r['achieved_gflops'] / r['sgemm_gflops']:.2f} |")
    line = ratios_line(result.get("rank_ratios", ()), lambda x: x["case"])
    return rows + ([line] if line else []) + [measured_note(result)]


def write_outputs(result: dict) -> None:
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, "\n".join(table_rows(result)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="default: all")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2],
                   help="rank counts, one worker launch each (horovodrun for > 1; default: 1 2)")
    p.add_argument("--steps", type=int, help="timed steps of every case (default: reference 3, mini 20)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: reference 1, mini 3)")
    p.add_argument("--rounds", type=int, default=2,
                   help="measurements of each row, in alternating order of the rank counts (default: 2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    p.add_argument("--precision", default="float32", help=argparse.SUPPRESS)  # the worker's Keras policy
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps is not None and args.steps < 1 or args.warmup is not None and args.warmup < 0:
        p.error(f"--steps {args.steps}, --warmup {args.warmup}: expected at least 1 timed and 0 warm-up steps")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args.case, args.steps, args.warmup, args.out, args.precision)
    check_marked_section(DOC, BEGIN, END)
    write_outputs(measure_groups("case", args.cases, args.ranks, args.rounds,
                                 lambda case, ranks: measure(case, ranks, args.steps, args.warmup)))
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
