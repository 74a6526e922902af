"""Every record the repository commits (run configs, campaign and study records, summaries, manifests, pack.json)
reads through the strict readers of common/base/documents.py: a change to a format that would refuse one of them
fails here, naming the file. Records are found by `git ls-files` patterns, wherever they live."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common.base import documents
from common.base.errors import BenchError
from common.campaign.spec import CampaignFile, RunRecord
from common.hpo.study import StudyFile
from common.hpo.trial import TrialResult
from common.io.manifest import Manifest
from common.io.packing import Pack
from common.campaign.summary import Summary
from tests.conftest import REPO


def _tracked() -> list[str]:
    proc = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def _config_schema(path: str):
    """The config class of a saved run config (its benchmark's), found by its sections."""
    from cosmoflow.config import CosmoConfig
    from deepcam.config import DeepCamConfig
    raw = documents.load(REPO / path, "yaml")
    return DeepCamConfig if "loss" in raw or "deepcam" in str(raw.get("data", {}).get("dir", "")) else CosmoConfig


SCHEMAS = {"campaign.json": CampaignFile, "campaign_run.json": RunRecord, "hpo.json": StudyFile,
           "trial.json": TrialResult, "summary.json": Summary, "manifest.json": Manifest, "pack.json": Pack}
TRACKED = _tracked()
RECORDS = sorted(p for p in TRACKED if Path(p).name in SCHEMAS and not p.startswith("tests/"))
CONFIGS = sorted(p for p in TRACKED if Path(p).name == "config.yaml" and "/configs/" not in p)


def test_the_records_are_found():
    assert not TRACKED or (RECORDS and CONFIGS)  # outside a git checkout there is nothing to list


@pytest.mark.parametrize("path", RECORDS)
def test_a_committed_record_reads_strictly(path):
    schema = SCHEMAS[Path(path).name]
    given = {"root": (REPO / path).parent} if schema in (Manifest, Pack) else {}
    documents.read(REPO / path, schema, **given)


@pytest.mark.parametrize("path", CONFIGS)
def test_a_committed_run_config_reads_strictly(path):
    from common.runtime.config import load_config
    load_config(REPO / path, [], _config_schema(path))


@pytest.mark.parametrize("path", sorted(p for p in TRACKED if Path(p).name == "journal.log"))
def test_a_committed_study_reads_with_its_settings(path):
    from common.hpo.study import read_study, saved_settings
    out = (REPO / path).parent
    _space, settings = saved_settings(out)
    assert read_study(out, settings).trials


# ---------------------------------------------------------------------------- each format refuses bad values
def _first(name: str) -> Path:
    return REPO / next(p for p in RECORDS if Path(p).name == name)


def _manifest_doc(tmp_path: Path) -> dict:
    from tests.unit.test_manifest import _manifest
    return _manifest(tmp_path).to_dict()


def _meta_doc(tmp_path: Path) -> dict:
    from tests.unit.test_checkpoint_meta import write_checkpoint
    return documents.load(write_checkpoint(tmp_path) / "meta.json")


def _space_doc(_tmp_path: Path) -> dict:
    from tests.unit.test_hpo import SPACE
    return dict(SPACE)


def _stamp_doc(_tmp_path: Path) -> dict:
    record = {"bytes": 3, "kind": "xxh3_128", "digest": "0" * 32, "mtime_ns": 1, "ctime_ns": 1, "ino": 5}
    return {"version": 1, "files": {"train/a.tfrecord": record}, "decompressed": {}}


def _stamp_schema():
    from common.io.staging import _Stamp
    return _Stamp


def _space_schema():
    from common.hpo.space import SpaceFile
    return SpaceFile


def _meta_schema():
    from common.runtime.checkpoint import Meta
    return Meta


# format -> (the document, its schema, the name it is written under, (key path, a wrong type, an out-of-range
# value, what the message says is expected of that value))
FORMATS = {
    "manifest": (_manifest_doc, lambda: Manifest, "manifest.json", (("target_size",), "4", 0, "an integer >= 1")),
    "meta.json": (_meta_doc, _meta_schema, "meta.json", (("progress", "step"), "2", -1, "an integer >= 0")),
    "staging stamp": (_stamp_doc, _stamp_schema, ".stage-verified.json", (("version",), "1", 2, "one of [1]")),
    "HPO space": (_space_doc, _space_schema, "space.yaml", (("failure_penalty",), "2", 0.5, ">= 1")),
    "campaign spec": (lambda _t: documents.load(_first("campaign.json")), lambda: CampaignFile, "campaign.json",
                      (("spec", "ranks"), "2", 0, ">= 1")),
    "campaign run": (lambda _t: documents.load(_first("campaign_run.json")), lambda: RunRecord,
                     "campaign_run.json", (("exit_code",), "0", 2 ** 63, "an integer in [-2^63, 2^63)")),
    "hpo.json": (lambda _t: documents.load(_first("hpo.json")), lambda: StudyFile, "hpo.json",
                 (("space", "objective"), 1, "loss", "one of ['epochs', 'time']")),
    "trial.json": (lambda _t: documents.load(_first("trial.json")), lambda: TrialResult, "trial.json",
                   (("state",), 1, "done", "one of ['complete', 'pruned', 'failed']")),
    "summary.json": (lambda _t: documents.load(_first("summary.json")), lambda: Summary, "summary.json",
                     (("target",), "0.1", float("inf"), "a finite number")),
}


def _set(doc: dict, keys: tuple, value) -> dict:
    node = doc
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return doc


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("damage", ["unknown key", "wrong type", "out of range"])
def test_each_format_names_the_file_key_value_and_expected(tmp_path, fmt, damage):
    make, schema, name, (keys, wrong, out_of_range, expected) = FORMATS[fmt]
    doc, dotted = make(tmp_path / "made"), ".".join(keys)
    path = tmp_path / name
    if damage == "unknown key":
        doc["bogus"] = 1
        message = f"{path}: the top level: unknown key(s) bogus; valid keys: "
    else:
        value = wrong if damage == "wrong type" else out_of_range
        _set(doc, keys, value)
        message = f"{path}: key {dotted} = {value!r}: expected "
    documents.write(path, doc)
    given = {"root": tmp_path} if fmt == "manifest" else {}
    with pytest.raises(BenchError) as err:
        documents.read(path, schema(), **given)
    assert str(err.value).startswith(message), str(err.value)
    if damage == "out of range":
        assert expected in str(err.value), str(err.value)
