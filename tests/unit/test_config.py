"""Typed configuration: YAML, overrides, unknown keys, types, saving; every shipped config validates."""
import re
from pathlib import Path

import pytest
import yaml

from common.runtime.config import load_config, save_config, to_dict
from common.base.errors import BenchError
from cosmoflow.config import CosmoConfig
from deepcam.config import DeepCamConfig

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(REPO.glob("*/configs/*.yaml"))


@pytest.fixture
def cfg_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"run": {"name": "t"}, "train": {"local_batch_size": 2},
                                    "model": {"conv_filters": [4, 8]}}))
    return path


def test_yaml_defaults_and_types(cfg_file):
    cfg = load_config(cfg_file, [], CosmoConfig)
    assert cfg.run.name == "t" and cfg.train.local_batch_size == 2
    assert cfg.model.conv_filters == (4, 8)  # lists become tuples: the config is frozen
    assert cfg.optimizer.momentum == 0.9  # default from the dataclass
    assert cfg.run.output_dir == "runs/t"  # ${run.name} expanded
    with pytest.raises(Exception):
        cfg.train.local_batch_size = 3


def test_dotted_overrides(cfg_file):
    cfg = load_config(cfg_file, ["optimizer.base_lr=0.02", "model.input_shape=[32,32,32,4]",
                                 "data.loader=dali", "dist.hierarchical_allreduce=true"], CosmoConfig)
    assert cfg.optimizer.base_lr == 0.02
    assert cfg.model.input_shape == (32, 32, 32, 4)
    assert cfg.data.loader == "dali" and cfg.dist.hierarchical_allreduce is True


def test_int_accepted_for_float(cfg_file):
    assert load_config(cfg_file, ["optimizer.base_lr=1"], CosmoConfig).optimizer.base_lr == 1.0


@pytest.mark.parametrize("override, words", [
    ("optimizer.lr=0.1", ["unknown key", "lr", "base_lr"]),
    ("optimiser.base_lr=0.1", ["unknown key", "optimiser", "optimizer"]),
    ("train.local_batch_size=two", ["train", "local_batch_size", "'two'", "int"]),
    ("data.loader=pytorch", ["data", "loader", "pytorch", "tfdata", "dali"]),
    ("train.local_batch_size=0", ["train.local_batch_size", ">= 1"]),
    ("schedule.decay_epochs=[3,2]", ["decay"]),
    ("noequals", ["section.key=value"]),
    ("dist.elastic.hang_timeout_s=2", ["dist.elastic.hang_timeout_s", "0 (no watchdog) or seconds >= 5"]),
    ("dist.elastic.hang_timeout_s=-1", ["dist.elastic.hang_timeout_s", "-1"]),
    ("model.kernel_size=0", ["model.kernel_size", "0", "an integer >= 1"]),
    ("model.pool_size=0", ["model.pool_size", "0", "an integer >= 1"]),
    ("model.target_size=0", ["model.target_size", "an integer >= 1"]),
    ("model.dense_units=[0]", ["model.dense_units", "[0]", "integers >= 1"]),
    ("model.conv_filters=[]", ["model.conv_filters", "at least one layer"]),
    ("run.seed=-1", ["run.seed", "-1", "[0, 2^31)"]),
    ("run.output_dir=", ["run.output_dir", "''", "not empty"]),
])
def test_bad_keys_and_values_name_the_key(cfg_file, override, words):
    with pytest.raises(BenchError) as err:
        load_config(cfg_file, [override], CosmoConfig)
    for word in words:
        assert word in str(err.value)


def test_elastic_hang_timeout_default_and_off(cfg_file):
    assert load_config(cfg_file, [], CosmoConfig).dist.elastic.hang_timeout_s == 60.0
    assert load_config(cfg_file, ["dist.elastic.hang_timeout_s=0"], CosmoConfig).dist.elastic.hang_timeout_s == 0


def test_missing_file(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", [], CosmoConfig)


# Regressions found by fuzzing (tests/fuzz/test_config_fuzz.py, docs/fuzzing.md).
@pytest.mark.parametrize("text, words", [
    (b"run:\n  name: \xff\n", ["not readable UTF-8 text"]),
    (b"1: x\nrun: {}\n", ["unknown key(s) 1;", "valid keys: run"]),
    (b"[" * 5000, ["nested too deeply"]),
    (b"false\n", ["expected a mapping of sections, found bool"]),
])
def test_unreadable_config_text_names_the_file(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(BenchError) as err:
        load_config(path, [], CosmoConfig)
    assert str(path) in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_empty_config_file_gives_the_defaults(tmp_path):
    (tmp_path / "c.yaml").write_text("# nothing set\n")
    cfg = load_config(tmp_path / "c.yaml", [], CosmoConfig)
    assert cfg.model == CosmoConfig().model and cfg.run.output_dir == "runs/run"


@pytest.mark.parametrize("override", ["run.name=[", "train.target={a", "run.name=\x1b"])
def test_override_that_is_not_yaml_names_the_override(cfg_file, override):
    with pytest.raises(BenchError, match=f"override {re.escape(repr(override))} is not valid YAML"):
        load_config(cfg_file, [override], CosmoConfig)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "nan", "1e999", "1" + "0" * 400])
def test_float_keys_must_be_finite(cfg_file, value):
    with pytest.raises(BenchError, match=r"config key optimizer.weight_decay = .*: expected a finite number"):
        load_config(cfg_file, [f"optimizer.weight_decay={value}"], CosmoConfig)
    assert load_config(cfg_file, ["optimizer.weight_decay=1e-4"], CosmoConfig).optimizer.weight_decay == 1e-4


def test_saved_config_round_trips(cfg_file, tmp_path):
    cfg = load_config(cfg_file, ["optimizer.base_lr=0.5"], CosmoConfig)
    path = save_config(cfg, tmp_path / "out")
    again = load_config(path, [], CosmoConfig)
    assert again == cfg and to_dict(again)["optimizer"]["base_lr"] == 0.5
    assert not list((tmp_path / "out").glob(".*tmp*"))


def test_shipped_configs_exist():
    assert {p.name for p in SHIPPED} >= {"cosmo.yaml", "cosmo_mini.yaml", "deepcam.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_shipped_config_validates(path):
    app = path.parent.parent.name
    cfg = load_config(path, [], {"cosmoflow": CosmoConfig, "deepcam": DeepCamConfig}[app])
    if app == "cosmoflow":
        from cosmoflow.model import build_model
        assert build_model(**to_dict(cfg.model)).output_shape == (None, cfg.model.target_size)
    else:
        from deepcam.model import build_model
        assert build_model(**to_dict(cfg.model)).output_shape == (None, *cfg.model.input_shape[:2],
                                                                 cfg.model.num_classes)


def test_deepcam_reference_config_is_the_reference():
    cfg = load_config(REPO / "deepcam/configs/deepcam.yaml", [], DeepCamConfig)
    assert cfg.model.input_shape == (768, 1152, 16) and cfg.model.width == 1.0
    assert (cfg.data.train_samples, cfg.data.val_samples) == (121266, 15158)
    assert cfg.optimizer.name == "LAMB" and cfg.optimizer.eps == 1e-6 and cfg.train.target == 0.82
    assert cfg.run.seed > 0 and cfg.mlperf.division == "auto"
    from deepcam.config import closed_differences
    assert closed_differences(cfg) == []  # so it logs closed


def test_deepcam_config_rejects_inconsistent_sections(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"loss": {"class_frequencies": [0.9, 0.1]}}))
    with pytest.raises(BenchError, match="loss.class_frequencies.*one frequency per class"):
        load_config(path, [], DeepCamConfig)
    with pytest.raises(BenchError, match="model.input_shape.*multiples of 16"):
        load_config(path, ["loss.class_frequencies=[0.9,0.05,0.05]", "model.input_shape=[100,144,16]"],
                    DeepCamConfig)


def test_reference_config_is_the_reference():
    cfg = load_config(REPO / "cosmoflow/configs/cosmo.yaml", [], CosmoConfig)
    assert cfg.model.input_shape == (128, 128, 128, 4) and cfg.train.local_batch_size == 4
    assert (cfg.data.train_samples, cfg.data.val_samples) == (524288, 65536)
    assert cfg.train.target == 0.124 and cfg.optimizer.momentum == 0.9
