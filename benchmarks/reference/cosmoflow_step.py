"""Time training steps of the MLCommons reference CosmoFlow model, in the reference's own environment.

    python cosmoflow_step.py --checkout HPC --size 128 --batch 4 --steps 3 --warmup 2 [--precision P] --out OUT.json

Runs under the reference's virtual environment (benchmarks/reference/requirements-cosmoflow.txt), so it
imports nothing of this suite. The model is the checkout's own `cosmoflow/models/cosmoflow.py`
`build_model`, called with the `model` section of the checkout's `cosmoflow/configs/cosmo.yaml` (its
input shape cut to --size); it is compiled as the reference's train.py compiles it (loss `mse`, SGD with
momentum 0.9, metric `mae`) and one step is Keras's compiled `train_on_batch`, which is what `fit` runs
per batch. --precision mixed_bfloat16 sets the Keras 2 global policy before the model is built, as the
reference's train.py does for its --amp (which sets mixed_float16: the reference has no bfloat16 mode of its
own; this harness adds it). Data: the suite's benchmark data (log(1 + Poisson(20)) counts, targets uniform in [-1, 1]).
Threads: TensorFlow's defaults, as the reference ships; oneDNN as the caller's TF_ENABLE_ONEDNN_OPTS says.
Writes step seconds and versions as JSON.
"""
import argparse
import os
import sys

from steptime import sha256_of, time_calls, write_json_atomic


def load_model_args(checkout: str, size: int) -> dict:
    """The reference config's model section, without `name`, at a cube of `size`."""
    import yaml
    path = os.path.join(checkout, "cosmoflow/configs/cosmo.yaml")
    with open(path) as f:
        model = dict(yaml.safe_load(f)["model"])
    model.pop("name", None)
    channels = model["input_shape"][-1]
    model["input_shape"] = [size, size, size, channels]
    return model


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--checkout", "--out"):
        p.add_argument(name, required=True)
    for name, default in (("--size", 128), ("--batch", 4), ("--steps", 3), ("--warmup", 2)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--precision", choices=("float32", "mixed_bfloat16"), default="float32")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.checkout, "cosmoflow"))
    import numpy as np
    import tensorflow as tf
    from models.cosmoflow import build_model  # the checkout's

    tf.keras.mixed_precision.set_global_policy(args.precision)  # where the reference's train.py sets --amp's
    model_args = load_model_args(args.checkout, args.size)
    model = build_model(**model_args)
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(learning_rate=0.001, momentum=0.9),
                  metrics=["mae"])
    rng = np.random.default_rng(0)
    x = np.log1p(rng.poisson(20, (args.batch, *model_args["input_shape"]))).astype(np.float32)
    y = rng.uniform(-1, 1, (args.batch, model_args["target_size"])).astype(np.float32)
    seconds = time_calls(lambda: model.train_on_batch(x, y), args.warmup, args.steps)
    write_json_atomic(args.out, {
        "step_seconds": seconds, "framework": f"tensorflow {tf.__version__}", "model_args": model_args,
        "precision": args.precision, "output_dtype": model(x[:1], training=False).dtype.name,  # after the timing: what the policy made
        "parameters": int(model.count_params()),
        "model_file_sha256": sha256_of(os.path.join(args.checkout, "cosmoflow/models/cosmoflow.py")),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
