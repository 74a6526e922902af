"""What exporting the full-size models to ONNX costs, and how fast onnxruntime runs them against Keras.

For each benchmark's reference config (deepcam/configs/deepcam.yaml: 768 x 1152 x 16 DeepLabv3+ at full width;
cosmoflow/configs/cosmo.yaml: 128^3 x 4), the model is built untrained, as `python -m common.export` builds it,
exported with the same code (common/export.py), and both Keras (`predict_on_batch`) and onnxruntime (CPU) run one
random sample (batch 1): one warm-up call, then the median of `--repeats` calls. The outputs are compared as
`--check` compares them.

    python benchmarks/onnx_export.py [--repeats 3] [--only deepcam]

Writes benchmarks/results/onnx_export.json and the table between the markers in docs/export.md. The load average
before and after each model is recorded: other processes on the machine slow every figure down.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import (REPO, RESULTS_DIR, check_marked_section, measured_note, replace_marked_section, run_header,
                     sgemm_gflops, write_json_atomic)

RESULTS = RESULTS_DIR / "onnx_export.json"
DOC = REPO / "docs/export.md"
BEGIN, END = "<!-- onnx-export:begin -->", "<!-- onnx-export:end -->"
CONFIGS = {"deepcam": "deepcam/configs/deepcam.yaml", "cosmoflow": "cosmoflow/configs/cosmo.yaml"}


def build(benchmark: str):
    """The untrained model of the benchmark's reference config, float32, called once."""
    import keras
    from common.export import app_for
    from common.runtime.config import load_config
    app = app_for(benchmark)
    cfg = load_config(REPO / CONFIGS[benchmark], (), app.config_schema())
    keras.utils.set_random_seed(1)
    keras.mixed_precision.set_global_policy("float32")
    model = app.build_model(cfg)
    model(np.zeros((1, *model.input_shape[1:]), np.float32), training=False)
    return model


def measure(benchmark: str, repeats: int, workdir: Path) -> dict:
    """Export seconds, file size, parameters, and per-sample inference seconds of Keras and onnxruntime."""
    from common.export import compare, export_onnx, onnx_session, per_sample_seconds
    load_before = os.getloadavg()[0]
    model = build(benchmark)
    out = workdir / f"{benchmark}.onnx"
    export_seconds = export_onnx(model, out)
    session = onnx_session(out)
    name = session.get_inputs()[0].name
    x = np.random.default_rng(0).normal(size=(1, *model.input_shape[1:])).astype(np.float32)
    diff = compare(np.asarray(model.predict_on_batch(x)), session.run(None, {name: x})[0])
    keras_s = per_sample_seconds(lambda: model.predict_on_batch(x), 1, repeats)
    onnx_s = per_sample_seconds(lambda: session.run(None, {name: x}), 1, repeats)
    return {"benchmark": benchmark, "config": CONFIGS[benchmark], "input_shape": list(model.input_shape[1:]),
            "parameters": int(model.count_params()),
            "trainable_parameters": int(sum(int(np.prod(v.shape)) for v in model.trainable_weights)),
            "export_seconds": export_seconds, "onnx_bytes": out.stat().st_size,
            "onnx_input_shape": [d if isinstance(d, int) else str(d) for d in session.get_inputs()[0].shape],
            "keras_seconds_per_sample": keras_s, "onnxruntime_seconds_per_sample": onnx_s,
            "max_abs_difference": diff.max_abs, "keras_output_scale": diff.scale, "relative_difference": diff.relative,
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}


def table(result: dict) -> str:
    lines = ["| model | input | parameters | export (s) | ONNX size (MB) | Keras (s/sample) | onnxruntime (s/sample) "
             "| rel. difference |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["models"]:
        lines.append(f"| {r['benchmark']} | {'x'.join(map(str, r['input_shape']))} | {r['parameters']:,} | "
                     f"{r['export_seconds']:.1f} | {r['onnx_bytes'] / 1e6:.1f} | {r['keras_seconds_per_sample']:.2f} | "
                     f"{r['onnxruntime_seconds_per_sample']:.2f} | {r['relative_difference']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed inference calls after one warm-up")
    parser.add_argument("--only", choices=sorted(CONFIGS), help="measure one model")
    args = parser.parse_args()
    check_marked_section(DOC, BEGIN, END)
    header = run_header(sgemm_gflops())
    models = [args.only] if args.only else list(CONFIGS)
    with tempfile.TemporaryDirectory() as workdir:
        rows = [measure(m, args.repeats, Path(workdir)) for m in models]
    command = " ".join(["python benchmarks/onnx_export.py", *sys.argv[1:]])
    result = {**header, "command": command, "repeats": args.repeats, "batch": 1, "models": rows,
              "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json_atomic(RESULTS, result)
    text = table(result)
    print(text)
    replace_marked_section(DOC, BEGIN, END, f"{text}\n{measured_note(result)}\n\n`{command}`")


if __name__ == "__main__":
    main()
