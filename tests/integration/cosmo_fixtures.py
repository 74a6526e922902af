"""A tiny CosmoFlow dataset made by the real tools, and a tiny-model config for fast runs."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO, run_cmd, show
import sys

TINY_OVERRIDES = {
    "model": {"input_shape": [16, 16, 16, 4], "conv_filters": [4, 8, 16, 16], "dense_units": [16, 8],
              "dropout": 0.0},
    "optimizer": {"base_lr": 0.01, "base_batch_size": 8},
    "train": {"max_epochs": 2, "local_batch_size": 4},
    "data": {"shuffle_buffer": 8},
    "mlperf": {"platform": "test"},
}


def make_dataset(root: Path, universes: int = 12, val_universes: int = 4) -> Path:
    """cosmo-synth (32^3 universes) then cosmo-convert (16^3 samples, 8 per universe)."""
    raw, records = root / "raw", root / "tfrecords"
    for args in (["cosmo-synth", "--out", raw, "--universes", universes, "--size", 32, "--seed", 7,
                  "--workers", 2],
                 ["cosmo-convert", "--input", raw, "--out", records, "--sample-size", 16,
                  "--val-universes", val_universes, "--seed", 7, "--workers", 2]):
        proc = run_cmd([sys.executable, "-m", "data_prep", *args], timeout=300)
        assert proc.returncode == 0, show(proc)
    return records


def write_config(path: Path, data_dir: Path, out_dir: Path, **sections) -> Path:
    """The mini config with the tiny model and `sections` merged over it."""
    cfg = yaml.safe_load((REPO / "cosmoflow/configs/cosmo_mini.yaml").read_text())
    for name, values in {**TINY_OVERRIDES, **sections}.items():
        cfg.setdefault(name, {}).update(values)
    cfg["data"]["dir"] = str(data_dir)
    cfg["run"]["output_dir"] = str(out_dir)
    path.write_text(yaml.safe_dump(cfg))
    return path
