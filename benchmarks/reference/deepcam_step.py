"""Time training steps of the MLCommons reference DeepCAM model, in the reference's own environment.

    python deepcam_step.py --checkout HPC --height 768 --width 1152 --batch 1 --steps 3 --warmup 1 [--precision P]
        --out OUT.json

Runs under the reference's virtual environment (benchmarks/reference/requirements-deepcam.txt), so it
imports nothing of this suite. The model is the checkout's own
`deepcam/src/deepCam/architecture/deeplab_xception.py` `DeepLabv3_plus` (16 input channels, 3 classes,
output stride 16, as the reference's train.py builds it), loaded from its file so that the package's
other modules (apex, h5py, the data loaders) are not needed. One step: forward, the reference's loss
(per-pixel cross-entropy weighted by class frequency**-0.125, plain mean), backward and an AdamW update
(the reference's optimiser without apex; LAMB needs apex's CUDA kernels). --precision mixed_bfloat16 runs
the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16): the reference has no CPU autocast
of its own (its GPU runs use apex's AMP); this harness adds it. Data: the suite's benchmark
data (fields uniform in [0, 1), labels drawn with the climate data's class frequencies). Threads: PyTorch's
defaults, as the reference ships. Writes step seconds and versions as JSON.
"""
import argparse
import importlib.util
import os
import sys

from steptime import sha256_of, time_calls, write_json_atomic

ARCHITECTURE = "deepcam/src/deepCam/architecture/deeplab_xception.py"
CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
LABEL_FREQUENCIES = (0.985, 0.0007, 0.0143)


def load_architecture(checkout: str):
    """The checkout's deeplab_xception module, loaded from its file alone."""
    path = os.path.join(checkout, ARCHITECTURE)
    spec = importlib.util.spec_from_file_location("reference_deeplab_xception", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--checkout", "--out"):
        p.add_argument(name, required=True)
    for name, default in (("--height", 768), ("--width", 1152), ("--batch", 1), ("--steps", 3), ("--warmup", 1)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--precision", choices=("float32", "mixed_bfloat16"), default="float32")
    args = p.parse_args()
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = load_architecture(args.checkout).DeepLabv3_plus(n_input=16, n_classes=3, os=16, pretrained=False,
                                                          _print=False)
    net.train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    weight = torch.tensor([f ** -0.125 for f in CLASS_FREQUENCIES], dtype=torch.float32)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.random((args.batch, 16, args.height, args.width), dtype=np.float32))
    y = torch.from_numpy(rng.choice(3, size=(args.batch, args.height, args.width), p=LABEL_FREQUENCIES))

    bf16 = args.precision == "mixed_bfloat16"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), y, weight=weight, reduction="none").mean()
        loss.backward()
        optimizer.step()

    seconds = time_calls(step, args.warmup, args.steps)
    write_json_atomic(args.out, {
        "step_seconds": seconds, "framework": f"torch {torch.__version__}", "precision": args.precision,
        "parameters": sum(p.numel() for p in net.parameters() if p.requires_grad),
        "model_file_sha256": sha256_of(os.path.join(args.checkout, ARCHITECTURE)),
        "intra_op_threads": torch.get_num_threads()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
