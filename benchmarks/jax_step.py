"""The suite's two model files trained under Keras' JAX backend: jit-compiled training steps, no TensorFlow.

    KERAS_BACKEND=jax python benchmarks/jax_step.py [--out FILE] [--budget-s 420] [--steps 20] [--tiny]

The model files (cosmoflow/model.py, deepcam/model.py) are pure Keras 3, so this runs where TensorFlow is not
installed: a GPU machine with JAX and the Keras wheel carried over (docs/performance.md, "The model files under
JAX"). Each case builds the reference network (build_model's defaults: 128^3 x 4 and 768 x 1152 x 16) under the
float32 or mixed_bfloat16 dtype policy and times one jit-compiled function that does the forward pass, the loss
(CosmoFlow's mean squared error, DeepCAM's weighted cross-entropy), the backward pass and the optimizer update
(SGD with momentum 0.9; Keras' LAMB, as the suite's DeepCAM trains with LAMB) on random data already on the
device. The first call (the compile) and `--warmup` more calls are untimed; each timed step waits for its
results. Only the step is timed: no input pipeline, no allreduce, no evaluation, unlike an MLPerf result.

Cases run in the issue's order (CosmoFlow at local batch 1 and 4, DeepCAM at 1 and 8, each at float32 then
bfloat16); when `--budget-s` seconds have passed since the start, the cases left are recorded as skipped, and a
case that fails (out of memory, say) is recorded with its error while the others run (exit status 1). The JSON is
rewritten (through a temporary name) after every case, so a run cut short keeps what it measured.
`--tiny` shrinks both networks (CosmoFlow's input to 32^3 x 4; DeepCAM's to 96 x 144 x 16, at width 0.125 with one
middle-flow block) to check the script on a CPU in a minute or two; its figures are not the benchmark's.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from common.base.files import write_text_atomic  # noqa: E402  (standard library only, as is host)
from common.base.host import cpu_model  # noqa: E402

# Per-GPU rates of NVIDIA's MLPerf HPC v3.0 results on H100 (end to end in runs of 512 to 2,048 GPUs, input,
# communication and evaluation included), as issue 49 quotes them: samples/s per GPU by (app, local batch);
# CosmoFlow's is given for its runs, whatever their local batch.
PUBLISHED_H100_V3 = {("cosmoflow", None): 207.0, ("deepcam", 1): 30.0, ("deepcam", 8): 82.0}
PRECISIONS = ("float32", "mixed_bfloat16")
BATCHES = {"cosmoflow": (1, 4), "deepcam": (1, 8)}


class JaxStepError(RuntimeError):
    """The script cannot run as asked (a wrong backend, a bad argument)."""


@dataclasses.dataclass(frozen=True)
class Case:
    app: str
    batch: int
    precision: str


def cases(apps=("cosmoflow", "deepcam"), precisions=PRECISIONS) -> list[Case]:
    """The issue's cases in its order: each app's batches, each batch at every precision."""
    return [Case(app, batch, precision) for app in apps for batch in BATCHES[app] for precision in precisions]


def sample_shape(app: str, tiny: bool) -> tuple[int, ...]:
    if app == "cosmoflow":
        return (32, 32, 32, 4) if tiny else (128, 128, 128, 4)
    return (96, 144, 16) if tiny else (768, 1152, 16)


def published_rate(app: str, batch: int) -> float | None:
    return PUBLISHED_H100_V3.get((app, batch), PUBLISHED_H100_V3.get((app, None)))


def check_backend() -> None:
    backend = os.environ.get("KERAS_BACKEND")
    if backend != "jax":
        raise JaxStepError(f"KERAS_BACKEND is {backend!r}: expected 'jax' (set it before Keras is imported)")


def build(app: str, tiny: bool):
    """The app's network at build_model's defaults (the reference's), its loss and its optimizer."""
    import keras
    shape = sample_shape(app, tiny)
    if app == "cosmoflow":
        from cosmoflow.model import build_model, mse_loss
        return build_model(input_shape=shape), mse_loss, keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)
    from deepcam.model import WeightedCrossEntropy, build_model, class_weights
    model = build_model(input_shape=shape, width=0.125, middle_blocks=1) if tiny else build_model(input_shape=shape)
    return model, WeightedCrossEntropy(class_weights()), keras.optimizers.Lamb(learning_rate=1e-3)


def random_batch(app: str, batch: int, tiny: bool, seed: int = 0):
    """Random inputs and targets of the app's shapes, as float32 and int32 arrays on the default device."""
    import jax.numpy as jnp
    import numpy as np
    rng = np.random.default_rng(seed)
    shape = sample_shape(app, tiny)
    x = rng.standard_normal((batch, *shape), dtype=np.float32)
    if app == "cosmoflow":
        y = rng.uniform(-1, 1, (batch, 4)).astype(np.float32)
    else:
        y = rng.integers(0, 3, (batch, *shape[:2]), dtype=np.int32)
    return jnp.asarray(x), jnp.asarray(y)


def train_step(model, loss_fn, optimizer):
    """One jit-compiled function of (state, x, y) -> (loss, state): forward, loss, gradients, update."""
    import jax

    def loss_and_state(trainable, non_trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, y_pred), non_trainable

    grad_fn = jax.value_and_grad(loss_and_state, has_aux=True)

    def step(state, x, y):
        trainable, non_trainable, opt_vars = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, (trainable, non_trainable, opt_vars)

    return jax.jit(step, donate_argnums=0)


def initial_state(model, optimizer):
    optimizer.build(model.trainable_variables)
    return ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
            [v.value for v in optimizer.variables])


def time_case(case: Case, steps: int, warmup: int, tiny: bool) -> dict:
    """Build, compile and time one case; its figures as a dict."""
    import jax
    import keras
    keras.config.set_dtype_policy(case.precision)
    try:
        model, loss_fn, optimizer = build(case.app, tiny)
    finally:
        keras.config.set_dtype_policy("float32")
    step, state = train_step(model, loss_fn, optimizer), initial_state(model, optimizer)
    x, y = random_batch(case.app, case.batch, tiny)
    start = time.perf_counter()
    loss, state = step(state, x, y)
    jax.block_until_ready((loss, state))
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        loss, state = step(state, x, y)
    jax.block_until_ready((loss, state))
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, state = step(state, x, y)
        jax.block_until_ready((loss, state))
        seconds.append(time.perf_counter() - start)
    return figures(case, seconds, compile_s, float(loss), model.count_params(), tiny)


def figures(case: Case, seconds: list[float], compile_s: float, loss: float, params: int, tiny: bool) -> dict:
    """One case's record: its step times, their median, samples/s and the published per-GPU rate beside them."""
    if not seconds or loss != loss:
        raise JaxStepError(f"{case}: {len(seconds)} timed steps, last loss {loss}: expected steps and a finite loss")
    median = statistics.median(seconds)
    rate = case.batch / median
    published = None if tiny else published_rate(case.app, case.batch)
    return {**dataclasses.asdict(case), "sample_shape": list(sample_shape(case.app, tiny)), "parameters": params,
            "compile_and_first_step_s": round(compile_s, 3), "step_seconds": [round(s, 5) for s in seconds],
            "median_step_s": round(median, 5), "samples_per_s": round(rate, 3), "last_loss": loss,
            "published_h100_v3_samples_per_s": published,
            "step_over_published": round(rate / published, 3) if published else None}


def run_header(tiny: bool) -> dict:
    import jax
    import keras
    device = jax.devices()[0]
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": cpu_model(),
            "device": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
            "versions": {"jax": jax.__version__, "keras": keras.__version__, "python": platform.python_version()},
            "tiny": tiny, "timed": "jit-compiled training step only (forward, loss, backward, update)",
            "cases": []}


def table(result: dict) -> str:
    """A markdown table of the run's cases."""
    lines = ["| model | precision | local batch | median step | samples/s | published per-GPU (v3.0, H100) | "
             "step / published |", "|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        if "skipped" in c or "failed" in c:
            why = f"skipped: {c['skipped']}" if "skipped" in c else f"failed: {c['failed'][:80]}"
            lines.append(f"| {c['app']} | {c['precision']} | {c['batch']} | {why} | | | |")
            continue
        pub, ratio = c["published_h100_v3_samples_per_s"], c["step_over_published"]
        lines.append(f"| {c['app']} | {c['precision']} | {c['batch']} | {c['median_step_s'] * 1e3:.1f} ms | "
                     f"{c['samples_per_s']:.1f} | {pub if pub else '-'} | {f'{ratio:.2f}' if ratio else '-'} |")
    return "\n".join(lines)


def run(args, started: float) -> dict:
    result = run_header(args.tiny)
    for case in cases(args.apps, args.precisions):
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            result["cases"].append({**dataclasses.asdict(case), "skipped": f"budget ({elapsed:.0f} s of "
                                                                           f"{args.budget_s:.0f} s spent)"})
        else:
            result["cases"].append(timed_or_failed(case, args))
        write_text_atomic(json.dumps(result, indent=2) + "\n", args.out)
    return result


def timed_or_failed(case: Case, args) -> dict:
    """One case's figures, or its error: a case that fails (out of device memory, say) is recorded and the
    others still run, as a GPU machine's time is lent once."""
    print(f"{case.app} batch {case.batch} {case.precision} ...", flush=True)
    try:
        rec = time_case(case, args.steps, args.warmup, args.tiny)
    except Exception as e:  # noqa: BLE001  (any backend error; it is kept in the JSON and the exit status)
        print(f"  failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return {**dataclasses.asdict(case), "failed": f"{type(e).__name__}: {str(e)[:1000]}"}
    print(f"  median step {rec['median_step_s']:.4f} s", flush=True)
    return rec


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("jax_step.json"), help="results JSON (default jax_step.json)")
    p.add_argument("--apps", nargs="+", choices=sorted(BATCHES), default=sorted(BATCHES))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--steps", type=int, default=20, help="timed steps per case (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the compiling one (default 2)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="start no case after this many seconds (default 420: the 8-minute ceiling, start included)")
    p.add_argument("--tiny", action="store_true", help="small inputs, to check the script on a CPU")
    args = p.parse_args(argv)
    for name in ("steps", "budget_s"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected > 0")
    if args.warmup < 0:
        p.error(f"--warmup {args.warmup}: expected >= 0")
    if not args.out.parent.is_dir():
        p.error(f"--out {args.out}: its folder {args.out.parent} does not exist")
    return args


def main(argv=None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    try:
        check_backend()
        result = run(args, started)
    except JaxStepError as e:
        print(f"jax_step: {e}", file=sys.stderr)
        return 2
    print(table(result))
    print(f"wrote {args.out}")
    failed = [c for c in result["cases"] if "failed" in c]
    if failed:
        print(f"jax_step: {len(failed)} of {len(result['cases'])} cases failed (their errors are in {args.out})",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
