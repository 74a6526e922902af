"""Hybrid (data x spatial, Mesh-TF) CosmoFlow against pure data parallelism: step time, samples/s,
per-rank peak memory and the bytes that cross between ranks, at the same rank counts.

    python benchmarks/mesh_throughput.py [--sizes mini full] [--cases 2:1x1 2:2x1 4:1x1 4:2x1 4:4x1 4:2x2]


A case `N:PDxPH` runs `horovodrun -np N` with `parallel.spatial=[PD,PH]` (1x1: the data-parallel
path); `N:PDxPH@B` sets its local batch (samples per group and step) to B instead of the size's default. Each worker builds exactly what `cosmoflow/train.py` builds from the config (its strategy, its
`build` and the steps the strategy trains with: `data_parallel_steps` or the hybrid mesh steps) and
times real training steps (forward, backward, gradient allreduce, SGD update; on the hybrid path also
each rank's write of the weights into its slices of the mesh and of its block into its queue) on in-memory
batches of log1p(Poisson) counts, each rank holding what its input pipeline would give it (the whole batch,
or on the hybrid path its block of it); input I/O is not part of these figures. Sizes: `mini` is
cosmo_mini.yaml (32^3 x 4, half width, local batch 4), `full` is cosmo.yaml (128^3 x 4, the reference
network, local batch 1 by default to bound memory and time), `256` the reference network on 256^3 x 4
(local batch 1).

Recorded per case: the median step time on rank 0 (a group leader), samples/s over all groups, each
rank's peak resident memory (getrusage) and its resident memory once the model and mesh were built,
the bytes sent on the loopback interface during the timed steps, per step (machine-wide: Mesh-TF's gRPC
transfers between the group's TensorFlow servers; Horovod's allreduce between ranks of one node was
measured not to cross it, 0.0 MB/step on the data-parallel path), and, for the hybrid cases, the halo bytes per sample that conv3d_with_blocks must exchange (arithmetic, forward
pass; the backward pass sends as many). Writes benchmarks/results/mesh_throughput.json (runs of the sizes
not measured this time are kept, each size with the date and sgemm rate of its own invocation under
`sizes`; `cases`: one
{"sample", "layout" ("data" or "PDxPH"), "ranks", "peak_rss_mb" (one per rank), "samples_per_second"} per
case; `runs`: everything measured) and the table between the markers in docs/mesh.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import time
from pathlib import Path

import numpy as np

# Run as a script, so benchmarks/ is on sys.path.
from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section,
                     run_header, run_worker, sgemm_gflops, timed, write_json_atomic, write_worker_result)

DOC = REPO / "docs/mesh.md"  # its tables live beside what they measure
RESULTS = RESULTS_DIR / "mesh_throughput.json"
BEGIN, END = "<!-- mesh-throughput:begin -->", "<!-- mesh-throughput:end -->"


@dataclasses.dataclass(frozen=True)
class Size:
    config: str
    local_batch: int
    steps: int
    warmup: int
    overrides: tuple[str, ...] = ()


SIZES = {"mini": Size("cosmoflow/configs/cosmo_mini.yaml", 4, 10, 2),
         "full": Size("cosmoflow/configs/cosmo.yaml", 1, 8, 2),  # hybrid steps vary by +-20%: 8 of them
         # The reference network on 256^3 x 4 samples (Oyama et al.'s reason to split: a sample too large for one
         # rank); the dense layers grow with the flattened size.
         "256": Size("cosmoflow/configs/cosmo.yaml", 1, 2, 1, ("model.input_shape=[256,256,256,4]",))}
DEFAULT_CASES = ("2:1x1", "2:2x1", "4:1x1", "4:2x1", "4:4x1", "4:2x2")


@dataclasses.dataclass(frozen=True)
class Case:
    ranks: int
    spatial: tuple[int, int]
    local_batch: int | None = None  # None: the size's

    @classmethod
    def parse(cls, text: str) -> "Case":
        try:
            ranks, parts = text.split(":")
            parts, _, batch = parts.partition("@")
            pd, ph = parts.split("x")
            case = cls(int(ranks), (int(pd), int(ph)), int(batch) if batch else None)
            if case.local_batch is not None and case.local_batch < 1:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"case {text!r}: expected RANKS:PDxPH or RANKS:PDxPH@BATCH, e.g. 4:2x1 "
                                             f"or 4:2x2@4") from None
        if case.ranks % (case.spatial[0] * case.spatial[1]):
            raise argparse.ArgumentTypeError(f"case {text!r}: {case.ranks} ranks are not divisible by "
                                             f"{case.spatial[0] * case.spatial[1]} spatial partitions")
        return case

    @property
    def label(self) -> str:
        batch = f"@{self.local_batch}" if self.local_batch else ""
        return f"{self.ranks}:{self.spatial[0]}x{self.spatial[1]}{batch}"

    @property
    def groups(self) -> int:
        return self.ranks // (self.spatial[0] * self.spatial[1])


# ----------------------------------------------------------------------------- measurements (pure)
def _conv_layers(input_shape, filters, spatial, pool_size: int):
    """Per conv layer: its input (depth, height, width, channels), its filters, and whether depth and height
    are split there, by the mesh model's rule (`pooling_splits`: a split is merged before a pooling whose
    windows would straddle blocks and stays merged)."""
    from cosmoflow.mesh.model import pooling_splits
    depth, height, width, channels = input_shape
    split = (spatial[0] > 1, spatial[1] > 1)
    for f, keep in zip(filters, pooling_splits(input_shape, spatial, len(filters), pool_size)):
        yield (depth, height, width, channels), f, split
        split = keep
        depth, height, width, channels = depth // pool_size, height // pool_size, width // pool_size, f


def halo_bytes_per_sample(input_shape, filters, spatial, pool_size: int, kernel: int) -> int:
    """Bytes (float32) the forward pass's halo exchanges move for one sample.

    Each conv layer whose input is split pd ways in depth sends, across each of the pd - 1 internal
    boundaries and in both directions, kernel // 2 planes of (height x width x channels); likewise for
    height; with both split, each block also takes its diagonal neighbours' corner rows (kernel // 2 squared
    rows of width x channels each). Splits as `_conv_layers`.
    """
    pd, ph = spatial
    halo, total = kernel // 2, 0
    for (depth, height, width, channels), _, (split_d, split_h) in _conv_layers(input_shape, filters, spatial,
                                                                                pool_size):
        total += split_d * 2 * (pd - 1) * halo * height * width * channels
        total += split_h * 2 * (ph - 1) * halo * depth * width * channels
        total += split_d * split_h * 4 * (pd - 1) * (ph - 1) * halo * halo * width * channels
    return 4 * total


def conv_macs_ratio(input_shape, filters, spatial, pool_size: int, kernel: int) -> float:
    """The conv layers' multiply-adds summed over a group's devices, against the whole cube's (one sample).

    Per layer, each device convolves its block; with a kernel of 3 each neighbouring block's boundary plane
    adds one kernel face (k^2 taps) over that plane (cosmoflow/mesh/haloconv.py); with another kernel the
    blocks grow by their halos and their halo planes' outputs are computed too. A layer whose split was merged
    runs on every device that shares the merged block. Splits as `_conv_layers`.
    """
    pd, ph = spatial
    done = whole_total = 0.0
    for (depth, height, width, channels), f, (split_d, split_h) in _conv_layers(input_shape, filters, spatial,
                                                                                pool_size):
        taps = channels * f * width
        whole = depth * height * taps * kernel ** 3
        if kernel == 3:
            layer = whole + (split_d * 2 * (pd - 1) * height + split_h * 2 * (ph - 1) * depth) * taps * kernel ** 2
        else:
            halo = kernel // 2
            layer = (depth + split_d * 2 * halo * pd) * (height + split_h * 2 * halo * ph) * taps * kernel ** 3
        done += layer * (pd * ph) // ((pd if split_d else 1) * (ph if split_h else 1))
        whole_total += whole
    return done / whole_total


def loopback_bytes() -> int:
    """Bytes sent on the loopback interface so far (/proc/net/dev), machine-wide."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])  # transmit bytes
    raise RuntimeError("/proc/net/dev has no 'lo' interface")


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 1e6


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


# ----------------------------------------------------------------------------- worker
def worker(size: str, spatial: tuple[int, int], count: int, warmup: int, out: str, local_batch: int,
           overrides: tuple[str, ...] = ()) -> None:
    """Build the app's model and steps for this case, time `steps` training steps, gather every rank's memory
    and CPU time (`overrides`: config settings after the case's own)."""
    spec = SIZES[size]
    from common.runtime.config import load_config
    from common.runtime.dist import init_distributed
    from cosmoflow import train as app
    from cosmoflow.config import CosmoConfig
    cfg = load_config(REPO / spec.config, [f"parallel.spatial=[{spatial[0]},{spatial[1]}]",
                                           f"train.local_batch_size={local_batch}", *spec.overrides, *overrides],
                      schema=CosmoConfig)
    dist = init_distributed(cfg.dist)
    strategy = app.strategy_for(cfg, dist)
    trainee = app.build(cfg, strategy)
    strategy.prepare(cfg)
    steps = strategy.make_steps(trainee, dist, None)
    train = steps.train
    block = strategy.input_block if cfg.parallel.hybrid else None
    x, y = _batch(cfg, strategy.input_dist.rank, block)
    built_rss = rss_mb()
    for _ in range(warmup):
        train(x, y)
    dist.barrier()
    sent = loopback_bytes()
    before, cpu_before = steps.clock.snapshot() if steps.clock else {}, os.times()
    seconds = [timed(lambda: train(x, y)) for _ in range(count)]
    cpu = os.times()
    cpu = {"user": (cpu.user - cpu_before.user) / count, "system": (cpu.system - cpu_before.system) / count}
    dist.barrier()
    phases = {k: (v - before[k]) / count for k, v in steps.clock.snapshot().items()} if steps.clock else None
    sent = loopback_bytes() - sent
    memory = dist.gather_object({"rank": dist.rank, "built_rss_mb": built_rss, "peak_rss_mb": peak_rss_mb(),
                                 "cpu_seconds_per_step": cpu})
    model = cfg.model
    phases = dist.gather_object(phases)
    write_worker_result(out, seconds, dist, memory=memory, loopback_bytes_per_step=sent / count, phases=phases,
                        groups=strategy.replicas, local_batch=cfg.train.local_batch_size,
                        input_shape=list(model.input_shape), conv_filters=list(model.conv_filters),
                        halo_bytes_per_sample=halo_bytes_per_sample(model.input_shape, model.conv_filters, spatial,
                                                                    model.pool_size, model.kernel_size),
                        conv_macs_ratio=conv_macs_ratio(model.input_shape, model.conv_filters, spatial,
                                                        model.pool_size, model.kernel_size),
                        weight_bytes=4 * sum(int(np.prod(w.shape)) for w in trainee.model.trainable_weights))


def _batch(cfg, replica: int, block) -> tuple[np.ndarray, np.ndarray]:
    """What the input pipeline gives a rank: the batch (B, D, H, W, C), or only its block of it (B, d, h, W, C)
    on the hybrid path; the targets of the replica's samples."""
    rng = np.random.default_rng(replica)
    y = rng.uniform(-1, 1, (cfg.train.local_batch_size, cfg.model.target_size)).astype(np.float32)
    shape = block.shape(cfg.model.input_shape) if block else cfg.model.input_shape
    return np.log1p(rng.poisson(20, (cfg.train.local_batch_size, *shape))).astype(np.float32), y


# ----------------------------------------------------------------------------- driver
def measure(size: str, case: Case, steps: int, warmup: int, local_batch: int, overrides: tuple[str, ...] = (),
            launcher: tuple[str, ...] = ()) -> dict:
    """One case's figures (`overrides`: config settings for the workers; `launcher`: horovodrun options)."""
    args = ["--size", size, "--spatial", f"{case.spatial[0]}x{case.spatial[1]}", "--steps", str(steps),
            "--warmup", str(warmup), "--local-batch", str(local_batch), "--set", *overrides]
    extra = f", {' '.join([*launcher, *overrides])}" if overrides or launcher else ""
    res = run_worker(__file__, args, case.ranks, RESULTS_DIR / f".worker-mesh-{size}-{case.label.replace(':', '-')}.json",
                     f"{size}, {case.label} ({case.groups} group(s)){extra}: {warmup} warm-up + {steps} timed steps",
                     launcher)
    median = float(np.median(res["step_seconds"]))
    peaks = [m["peak_rss_mb"] for m in res["memory"]]
    return {"size": size, "case": case.label, "ranks": case.ranks, "spatial": list(case.spatial),
            "groups": res["groups"], "local_batch": res["local_batch"], "threads_per_rank": res["threads_per_rank"],
            "input_shape": res["input_shape"], "conv_filters": res["conv_filters"],
            "median_step_seconds": median, "step_seconds": res["step_seconds"],
            "samples_per_second": res["local_batch"] * res["groups"] / median,
            "peak_rss_mb_max": max(peaks), "peak_rss_mb_per_rank": peaks,
            "built_rss_mb_per_rank": [m["built_rss_mb"] for m in res["memory"]],
            "cpu_seconds_per_step_per_rank": [m["cpu_seconds_per_step"] for m in res["memory"]],
            "loopback_mb_per_step": res["loopback_bytes_per_step"] / 1e6,
            "halo_mb_per_sample_forward": res["halo_bytes_per_sample"] / 1e6,
            "conv_macs_ratio": res["conv_macs_ratio"],
            "weight_mb": res["weight_bytes"] / 1e6,
            # hybrid cases: each rank's mean seconds per timed step in each phase (cosmoflow/mesh/hybrid.py)
            "phase_seconds_per_rank": res["phases"] if res["phases"] and res["phases"][0] else None}


def merged_result(path: Path, runs: list[dict], header: dict, sizes: list[str]) -> dict:
    """The result file's content: this invocation's runs of `sizes`, plus the runs of the other sizes already in
    `path` (each size's runs come from one invocation, whose header `sizes[size]` keeps)."""
    import json
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = [r for r in old.get("runs", []) if r["size"] not in sizes]
    old_header = {k: old[k] for k in ("date", "machine", "sgemm_gflops", "total_seconds") if k in old}
    headers = {r["size"]: old.get("sizes", {}).get(r["size"], old_header) for r in kept} | {s: header for s in sizes}
    order = list(SIZES)
    all_runs = sorted(kept + runs, key=lambda r: order.index(r["size"]))  # stable: cases keep their order
    return {**header, "sizes": headers, "cases": [case_record(r) for r in all_runs], "runs": all_runs}


def case_record(run: dict) -> dict:
    """One entry of the result's `cases`: the figures a comparison needs, in a fixed form."""
    spatial = run["spatial"]
    return {"sample": run["input_shape"][0], "layout": "data" if spatial == [1, 1] else f"{spatial[0]}x{spatial[1]}",
            "ranks": run["ranks"], "local_batch": run["local_batch"], "peak_rss_mb": run["peak_rss_mb_per_rank"],
            "samples_per_second": run["samples_per_second"]}


def table_rows(result: dict) -> list[str]:
    rows = ["| sample | ranks | spatial | groups x local batch | median step (s) | samples/s | "
            "peak RSS per rank (MB) | loopback MB/step | halo MB/sample (fwd) | conv MACs / cube's |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        shape = "x".join(str(s) for s in r["input_shape"][:3])
        spatial = "data parallel" if r["spatial"] == [1, 1] else f"{r['spatial'][0]}x{r['spatial'][1]}"
        peaks = ", ".join(f"{p:.0f}" for p in r["peak_rss_mb_per_rank"])
        rows.append(f"| {shape} (filters {r['conv_filters'][0]}..{r['conv_filters'][-1]}) | {r['ranks']} | {spatial} | "
                    f"{r['groups']} x {r['local_batch']} | {r['median_step_seconds']:.3f} | "
                    f"{r['samples_per_second']:.2f} | {peaks} | {r['loopback_mb_per_step']:.1f} | "
                    f"{r['halo_mb_per_sample_forward']:.1f} | {r.get('conv_macs_ratio', float('nan')):.2f} |")
    rows += ["", "Where a hybrid step's time goes, on the group leader (rank 0) and, after the slash, the slowest "
             "other rank: seconds per step writing the weights into its slices and, on the leader, waiting for its peers' writes (sync), "
             "queueing its block (put), the leader's mesh step, the gradient allreduce (the other ranks wait "
             "there for the leader's step) and the SGD update.", "",
             "| sample | ranks | spatial | groups x local batch | step (s) | sync | put | mesh | allreduce | update |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        if not r.get("phase_seconds_per_rank"):
            continue
        lead, others = r["phase_seconds_per_rank"][0], r["phase_seconds_per_rank"][1:]
        cells = [f"{lead[k]:.2f} / {max(o[k] for o in others):.2f}" for k in
                 ("sync", "put", "mesh", "allreduce", "update")]
        rows.append(f"| {r['input_shape'][0]}^3 | {r['ranks']} | {r['spatial'][0]}x{r['spatial'][1]} | "
                    f"{r['groups']} x {r['local_batch']} | {r['median_step_seconds']:.2f} | " + " | ".join(cells) + " |")
    notes = [f"{size}: " + measured_note(header).strip() for size, header in result.get("sizes", {}).items()]
    return rows + ([""] + notes if notes else [measured_note(result)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--cases", nargs="+", type=Case.parse, default=[Case.parse(c) for c in DEFAULT_CASES])
    p.add_argument("--steps", type=int, help="timed steps per case (default: 10 mini, 8 full, 2 at 256)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: 2 mini, 2 full, 1 at 256)")
    p.add_argument("--local-batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", help=argparse.SUPPRESS)
    p.add_argument("--spatial", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--set", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        pd, ph = (int(v) for v in args.spatial.split("x"))
        return worker(args.size, (pd, ph), args.steps, args.warmup, args.out, args.local_batch, tuple(args.set))
    check_marked_section(DOC, BEGIN, END)
    print("sgemm ...", flush=True)
    gflops, started, runs = sgemm_gflops(), time.perf_counter(), []
    for size in args.sizes:
        spec = SIZES[size]
        done = set()
        for case in args.cases:
            batch = case.local_batch or spec.local_batch
            if (case.ranks, case.spatial, batch) in done:  # e.g. 4:2x2@4 at a size whose default batch is 4
                continue
            done.add((case.ranks, case.spatial, batch))
            runs.append(measure(size, case, args.steps or spec.steps, args.warmup or spec.warmup, batch))
            r = runs[-1]
            print(f"    {r['samples_per_second']:.2f} samples/s, step {r['median_step_seconds']:.3f} s, peak RSS "
                  f"{r['peak_rss_mb_max']:.0f} MB, loopback {r['loopback_mb_per_step']:.1f} MB/step", flush=True)
    result = merged_result(RESULTS, runs, {**run_header(gflops), "total_seconds": time.perf_counter() - started},
                           args.sizes)
    write_json_atomic(RESULTS, result)
    replace_marked_section(DOC, BEGIN, END, "\n".join(table_rows(result)))
    print(f"wrote {RESULTS} and the table in {DOC}")


if __name__ == "__main__":
    main()
