"""benchmarks/rehearsal.py's judgements of a finished emulated run: the sharding from the ranks' I/O reports, and
the largest rank count that fits in a memory budget."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import rehearsal  # noqa: E402  (a script beside harness.py, not a package)


def _run(tmp_path, planned, read, epochs=2, steps=6, batch=1, train_samples=24):
    """A run directory's io_report.json and the summary fields the checks read."""
    ranks = [{"planned": {"train_records": p}, "measured": {"rchar": r}} for p, r in zip(planned, read)]
    (tmp_path / "io_report.json").write_text(json.dumps({"ranks": ranks, "totals": {"planned_bytes": 1000}}))
    return {"config": {"train": {"local_batch_size": batch}}, "history": [{"steps": steps}] * epochs,
            "train_samples": train_samples}


def test_every_sample_once_per_epoch_passes(tmp_path):
    summary = _run(tmp_path, planned=[12, 12, 12, 12], read=[300, 300, 250, 250], train_samples=24)
    assert all(rehearsal.sharding_checks(tmp_path, summary, 2).values())


def test_a_rank_that_read_a_share_twice_or_too_little_fails(tmp_path):
    twice = _run(tmp_path, planned=[12, 24, 12, 12], read=[300] * 4, train_samples=24)
    checks = rehearsal.sharding_checks(tmp_path, twice, 2)
    assert not checks["ranks' training records = epochs x split"]
    assert not checks["each rank's records = its steps x local batch"]
    short = _run(tmp_path, planned=[12] * 4, read=[100] * 4, train_samples=24)
    assert not rehearsal.sharding_checks(tmp_path, short, 2)["bytes read >= the planned records' bytes"]


def test_the_largest_count_that_fits_uses_the_largest_rank():
    results = [{"figures": {"rss_mb_max": 600.0}}, {"figures": {"rss_mb_max": 620.0}}, {"figures": {}}]
    assert rehearsal.largest_fitting(results, 20.0) == int(20 * 1024 // 620)
    assert rehearsal.largest_fitting([{"figures": {}}], 20.0) == 0
