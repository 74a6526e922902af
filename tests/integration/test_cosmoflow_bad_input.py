"""Bad input to CosmoFlow training: a one-paragraph error naming the file or key, and a non-zero exit."""
import json
import sys

import pytest

from common.io.manifest_write import sha256_file
from cosmoflow import train
from tests.conftest import REPO, horovodrun, log_events, run_cmd
from tests.integration.cosmo_fixtures import corrupt_last_train_file, write_config

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset(cosmo_small, writable_copy):
    """A private copy each test may damage."""
    return writable_copy(cosmo_small)


def _train(tmp_path, data_dir, *overrides, capsys=None, **sections):
    cfg = write_config(tmp_path / "c.yaml", data_dir, tmp_path / "run", **sections)
    code = train.main([str(cfg), *overrides])
    err = capsys.readouterr().err if capsys else ""
    return code, " ".join(err.split())  # unwrap the paragraph


def _first_train_file(data_dir):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    return data_dir / manifest["splits"]["train"]["files"][0]["path"]


def _assert_aborted(tmp_path, err):
    """Refused after run_start (the data is first read in the timed part): the summary says why."""
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["error"] == "BenchError"
    assert summary["reason"] in err


def test_missing_data_dir(tmp_path, capsys):
    code, err = _train(tmp_path, tmp_path / "nowhere", capsys=capsys)
    assert code == 2 and "nowhere" in err and "not found" in err
    _assert_aborted(tmp_path, err)


def test_missing_manifest(dataset, tmp_path, capsys):
    (dataset / "manifest.json").unlink()
    code, err = _train(tmp_path, dataset, capsys=capsys)
    assert code == 2 and "manifest.json" in err and str(dataset) in err


def test_manifest_disagrees_with_files(dataset, tmp_path, capsys):
    victim = _first_train_file(dataset)
    victim.write_bytes(victim.read_bytes()[:-100])  # truncated: size no longer matches the manifest
    code, err = _train(tmp_path, dataset, capsys=capsys)
    assert code == 2 and victim.name in err and "bytes" in err


def test_missing_record_file(dataset, tmp_path, capsys):
    victim = _first_train_file(dataset)
    victim.unlink()
    code, err = _train(tmp_path, dataset, capsys=capsys)
    assert code == 2 and f"{victim}: listed in the manifest (train split) but missing" in err
    _assert_aborted(tmp_path, err)


def test_index_that_does_not_match_its_record_file(dataset, tmp_path, capsys):
    victim = _first_train_file(dataset)
    index = victim.with_name(victim.name + ".idx")
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:-1]))  # the last record unindexed
    code, err = _train(tmp_path, dataset, capsys=capsys)
    assert code == 2 and f"{index}: 7 index lines, expected 8" in err
    _assert_aborted(tmp_path, err)


def test_corrupt_record_bad_crc(dataset, tmp_path, capsys):
    victim = _first_train_file(dataset)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, payload byte flipped: the record CRC no longer matches
    victim.write_bytes(bytes(raw))
    # tf.data checks every record's CRC; DALI's reader (the default loader) does not, so there the
    # file checksums of data.verify_checksums (or of staging) are what catch the flipped byte.
    code, err = _train(tmp_path, dataset, "data.shuffle=false", "data.loader=tfdata", capsys=capsys)
    assert code == 2 and victim.name in err and ("corrupt" in err or "CRC" in err)
    _assert_aborted(tmp_path, err)
    (tmp_path / "verified").mkdir()
    code, err = _train(tmp_path / "verified", dataset, "data.verify_checksums=true", capsys=capsys)
    assert code == 2 and f"{victim}: xxh3_128" in err and "the manifest says" in err


def test_record_of_wrong_size(dataset, tmp_path, capsys):
    import numpy as np
    import tensorflow as tf
    victim = _first_train_file(dataset)
    records = list(tf.data.TFRecordDataset(str(victim)).as_numpy_iterator())
    short = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.zeros((8, 8, 8, 4), np.int16).tobytes()])),
        "y": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0] * 4))})).SerializeToString()
    with tf.io.TFRecordWriter(str(victim)) as writer:
        for i, rec in enumerate(records):
            writer.write(short if i == 2 else rec)
    _rewrite_manifest_entry(dataset, victim)  # the manifest agrees with the damaged file
    code, err = _train(tmp_path, dataset, "data.shuffle=false", capsys=capsys)
    assert code == 2 and victim.name in err and "record 2" in err and "2048" in err and "16384" in err


def _rewrite_manifest_entry(data_dir, path):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    for entry in manifest["splits"]["train"]["files"]:
        if data_dir / entry["path"] == path:
            entry["bytes"], entry["sha256"] = path.stat().st_size, sha256_file(path)
            entry["index"] = entry["index_sha256"] = None
    (data_dir / "manifest.json").write_text(json.dumps(manifest))


def test_model_shape_differs_from_manifest(dataset, tmp_path, capsys):
    code, err = _train(tmp_path, dataset, "model.input_shape=[32,32,32,4]", capsys=capsys)
    assert code == 2 and "[16, 16, 16, 4]" in err and "[32, 32, 32, 4]" in err and "model.input_shape" in err


def test_counts_not_dividing_into_batches(dataset, tmp_path, capsys):
    code, err = _train(tmp_path, dataset, "train.local_batch_size=5", capsys=capsys)
    assert code == 2 and "32" in err and "local batch size 5" in err


def test_dali_on_gzip_records_is_refused(cosmo_small, tmp_path, capsys):
    gz = tmp_path / "gz"
    proc = run_cmd([sys.executable, "-m", "data_prep", "cosmo-convert", "--input", cosmo_small.parent / "raw",
                    "--out", gz, "--sample-size", 16, "--val-universes", 2, "--compression", "gzip"])
    assert proc.returncode == 0, proc.stderr
    code, err = _train(tmp_path, gz, "data.loader=dali", capsys=capsys)
    assert code == 2 and "gzip" in err and "data.loader=tfdata" in err


def test_unknown_config_key_in_a_real_process(dataset, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", dataset, tmp_path / "run")
    proc = run_cmd([sys.executable, REPO / "cosmoflow/train.py", cfg, "optimizer.lr=0.1"])
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2
    assert "unknown key(s) optimizer.lr" in err and "base_lr" in err
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1


@pytest.mark.parametrize("ranks", [1, 2])
def test_non_finite_loss_aborts_and_the_launcher_exits_3(dataset, tmp_path, ranks):
    """One process, and two ranks under horovodrun: every rank exits 3, so the launcher's code is the run's."""
    cfg = write_config(tmp_path / "c.yaml", dataset, tmp_path / "run")
    args = [REPO / "cosmoflow/train.py", cfg, "optimizer.base_lr=1e12", "train.max_epochs=3"]
    proc = run_cmd([sys.executable, *args]) if ranks == 1 else horovodrun(2, args)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = log_events(tmp_path / "run/mlperf.log")[-1]
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted"
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "aborted" and "non-finite" in summary["reason"]


def test_bad_input_that_one_rank_meets_is_every_ranks_and_the_launchers_code(dataset, tmp_path):
    """A corrupt record in a file only rank 1 reads (the last train file, its shard): rank 1 refuses it (exit 2);
    rank 0, whose collective fails with Horovod's shutdown, ends as rank 1 did (common/runtime/failures.py): exit
    2, not an internal error, and summary.json names rank 1's cause. So the launcher's code is 2 whether it
    reports the first failed rank's code (horovodrun) or the largest (srun: tests/integration/test_slurm.py)."""
    victim = corrupt_last_train_file(dataset)
    cfg = write_config(tmp_path / "c.yaml", dataset, tmp_path / "run")
    proc = horovodrun(2, [REPO / "cosmoflow/train.py", cfg, "data.shuffle=false", "data.loader=tfdata",
                          "train.max_epochs=2"])
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 2, output
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "aborted" and summary["error"] == "PeerFailed", summary
    assert summary["reason"].startswith("rank 1: ") and victim.name in summary["reason"], summary
    assert "internal error" not in proc.stdout + proc.stderr, output
    assert "[1,0]<stderr>:error: rank 1: " in proc.stdout + proc.stderr, output
    assert not (tmp_path / "run/traceback.txt").exists()
