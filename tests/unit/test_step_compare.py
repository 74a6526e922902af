"""benchmarks/step_compare.py: two commits' training steps alternate per round in clean worktrees, and the JSON
says NEW over OLD pooled and per round (the step measurement itself is faked here: it is the probe's, tested in
test_precision.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import step_compare  # noqa: E402  (a script beside the benchmarks, not a package)


def worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "step-compare-" in line]


def test_the_commits_alternate_in_clean_worktrees_and_new_over_old_is_pooled_and_per_round(monkeypatch, tmp_path):
    old, new = (subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", c], capture_output=True,
                               text=True, check=True).stdout.strip() for c in ("HEAD~1", "HEAD"))
    seen = []
    seconds = {old: iter([2.0, 2.2, 2.0, 2.0]), new: iter([1.0, 1.1, 1.5, 1.0])}

    def fake_measure(tree, app, config, precision, threads, overrides):
        commit = next(c for c in (old, new) if tree.name.startswith(c))
        assert (tree / ".venv").resolve() == (REPO / ".venv").resolve() and (tree / "deepcam/model.py").is_file()
        seen.append((commit, precision, overrides))
        return next(seconds[commit])
    monkeypatch.setattr(step_compare, "measure", fake_measure)
    monkeypatch.setattr(step_compare, "sgemm_gflops", lambda: 100.0)
    out = tmp_path / "r.json"
    assert step_compare.main(["--commits", "HEAD~1", "HEAD", "--out", str(out), "train.local_batch_size=1"]) == 0
    assert [(c, p) for c, p, _ in seen] == [(old, "float32"), (new, "float32"), (new, "float32"), (old, "float32"),
                                            (old, "mixed_bfloat16"), (new, "mixed_bfloat16"),
                                            (new, "mixed_bfloat16"), (old, "mixed_bfloat16")]
    assert all(o == ["train.local_batch_size=1"] for _, _, o in seen)
    result = json.loads(out.read_text())
    assert result["commits"] == [old, new] and result["config"] == "deepcam/configs/deepcam.yaml"
    f32, bf16 = result["precisions"]
    assert f32["step_seconds"] == {old: [2.0, 2.2], new: [1.0, 1.1]}
    assert f32["new_over_old"] == pytest.approx(1.05 / 2.1)
    assert f32["new_over_old_per_round"] == pytest.approx([0.5, 0.5])
    assert bf16["new_over_old"] == pytest.approx(1.25 / 2.0) and len(bf16["sgemm_gflops"][old]) == 2
    assert worktrees() == []  # removed after the run


def test_an_unknown_commit_is_refused_with_gits_reason(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(step_compare, "sgemm_gflops", lambda: 100.0)
    with pytest.raises(SystemExit, match="--commits no-such-commit: git worktree add failed"):
        step_compare.main(["--commits", "HEAD", "no-such-commit", "--out", str(tmp_path / "r.json")])
    assert worktrees() == [] and not (tmp_path / "r.json").exists()
    with pytest.raises(SystemExit):
        step_compare.main(["--commits", "HEAD", "HEAD~1", "--rounds", "0"])
    assert "--rounds 0: expected at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_compare.main(["--commits", "HEAD", "HEAD"])
    assert "--commits HEAD HEAD: expected two different commits" in capsys.readouterr().err
