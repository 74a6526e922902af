"""CosmoFlow datasets made by the real tools for the integration tests, and small-model configs.

Two datasets:
- `make_dataset`: 12 universes cut into 8 samples each, for tests of mechanics (logs, faults, staging,
  the mesh path). Its tiny model does not learn from it in a few epochs.
- `make_learnable_dataset`: 144 universes of 16^3 cells, one sample each, from the wide `mini` prior, for
  tests that say a run reaches its target. With `LEARN_OVERRIDES` two ranks get the validation MAE from
  about 0.5 (chance: predicting the prior's centre scores 0.5 on every parameter) below `LEARNED_MAE` in
  about 4 epochs (Omega_m and sigma_8 learned first), about 10 s of training.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO, horovodrun, run_cmd, show
import sys

TINY_OVERRIDES = {
    "model": {"input_shape": [16, 16, 16, 4], "conv_filters": [4, 8, 16, 16], "dense_units": [16, 8],
              "dropout": 0.0},
    "optimizer": {"base_lr": 0.01, "base_batch_size": 8},
    "train": {"max_epochs": 2, "local_batch_size": 4, "precision": "float32"},  # auto: test_precision
    "data": {"shuffle_buffer": 8},
    "mlperf": {"platform": "test"},
}


# A run reaching this validation MAE has learned: an untrained model (and the best constant guess) scores 0.5.
LEARNED_MAE = 0.40
LEARN_OVERRIDES = {
    "model": {"input_shape": [16, 16, 16, 4], "conv_filters": [8, 16, 32, 32], "dense_units": [32, 16],
              "dropout": 0.0},
    "optimizer": {"base_lr": 0.02, "base_batch_size": 8},
    "schedule": {"warmup_epochs": 1, "decay_epochs": [12, 16]},
    "train": {"max_epochs": 8, "local_batch_size": 4, "target": LEARNED_MAE, "precision": "float32"},
    "data": {"shuffle_buffer": 32},
    "mlperf": {"platform": "test"},
}


def make_dataset(root: Path, universes: int = 12, val_universes: int = 4) -> Path:
    """cosmo-synth (32^3 universes) then cosmo-convert (16^3 samples, 8 per universe)."""
    return _synth_and_convert(root, ["--universes", universes, "--size", 32], ["--val-universes", val_universes])


def make_learnable_dataset(root: Path) -> Path:
    """cosmo-synth (144 universes of 16^3 cells in a 128 Mpc/h box: the mini dataset's 8 Mpc/h cells, `mini`
    prior) then cosmo-convert: 120 training and 24 validation samples, one per universe (and file), so 1, 2,
    3 and 4 ranks all divide both splits."""
    return _synth_and_convert(root, ["--universes", 144, "--size", 16, "--box-size", 128, "--prior", "mini"],
                              ["--val-universes", 24])


def _synth_and_convert(root: Path, synth_args: list, convert_args: list) -> Path:
    """cosmo-synth into ROOT/raw, then cosmo-convert (16^3 samples) into ROOT/tfrecords; both seeded with 7.
    One worker each: the output does not depend on it (tests/unit/test_cosmo_synth.py, test_cosmo_convert.py),
    and a second worker process costs these small datasets more than it saves (convert 4.5 s against 5.5 s)."""
    raw, records = root / "raw", root / "tfrecords"
    for args in (["cosmo-synth", "--out", raw, *synth_args, "--seed", 7, "--workers", 1],
                 ["cosmo-convert", "--input", raw, "--out", records, "--sample-size", 16, *convert_args,
                  "--seed", 7, "--workers", 1]):
        proc = run_cmd([sys.executable, "-m", "data_prep", *args], timeout=300)
        assert proc.returncode == 0, show(proc)
    return records


def corrupt_last_train_file(data_dir: Path) -> Path:
    """Flip a byte in the middle of the last training file (the one only rank 1 of 2 reads): its record CRC and
    its checksum no longer match. Returns the file."""
    import json
    manifest = json.loads((data_dir / "manifest.json").read_text())
    victim = data_dir / manifest["splits"]["train"]["files"][-1]["path"]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    return victim


def write_config(path: Path, data_dir: Path, out_dir: Path, **sections) -> Path:
    """The mini config with the tiny model and `sections` merged over it (a section given replaces the tiny
    model's section of that name)."""
    return _write(path, data_dir, out_dir, {**TINY_OVERRIDES, **sections})


def two_rank_run(root: Path, data_dir: Path, name: str, **data) -> tuple[Path, object]:
    """(output directory ROOT/NAME, process) of a 2-rank run of the tiny model on `data_dir` (its data section
    updated with `data`) for 2 epochs, a target out of reach: exit 1, the run aborted."""
    out = root / name
    cfg = write_config(root / f"{name}.yaml", data_dir, out, data={**TINY_OVERRIDES["data"], **data},
                       train={"max_epochs": 2, "target": 1e-6})
    proc = horovodrun(2, [REPO / "cosmoflow/train.py", cfg])
    assert proc.returncode == 1, show(proc)  # the target is out of reach: two full epochs
    return out, proc


def write_learning_config(path: Path, data_dir: Path, out_dir: Path, **sections) -> Path:
    """The mini config with the small model that learns from `make_learnable_dataset`, its target
    `LEARNED_MAE`, and `sections` merged over it (key by key within a section)."""
    merged = {name: {**values, **sections.get(name, {})} for name, values in LEARN_OVERRIDES.items()}
    return _write(path, data_dir, out_dir, {**sections, **merged})


def _write(path: Path, data_dir: Path, out_dir: Path, sections: dict) -> Path:
    cfg = yaml.safe_load((REPO / "cosmoflow/configs/cosmo_mini.yaml").read_text())
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    cfg["data"]["dir"] = str(data_dir)
    cfg["run"]["output_dir"] = str(out_dir)
    path.write_text(yaml.safe_dump(cfg))
    return path
