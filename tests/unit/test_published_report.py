"""`report` over a published submission tree and a campaign of the suite's own: the paper's analyses on one set
of axes (issue 48 §3), written only under --out."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from common.campaign.analysis.__main__ import main
from common.campaign.analysis.published import RunLog, is_tree
from common.campaign.analysis.scores import time_split

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "mlperf_hpc_v1.0"
CAMPAIGN = REPO / "studies" / "hpo_study" / "logs" / "best-b4"  # a committed 3-run CosmoFlow campaign
FIGURES = ("split", "epochs", "throughput_units", "time_units")


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_published_tree_and_a_campaign_are_reported_together_and_nothing_is_written_under_them(tmp_path, capsys):
    before, campaign_before = listing(FIXTURE), listing(CAMPAIGN)
    out = tmp_path / "report"
    assert main(["report", str(FIXTURE), str(CAMPAIGN), "--round", "1.0", "--out", str(out)]) == 0
    assert listing(FIXTURE) == before and listing(CAMPAIGN) == campaign_before
    figures = {p.name for p in (out / "figures").iterdir()}
    for bench in ("cosmoflow", "deepcam"):
        assert {f"{f}_{bench}.png" for f in FIGURES} <= figures
    summary = (out / "summary.md").read_text()
    for title in ("Where this machine stands", "Time to solution split (Fig. 1)", "(Fig. 2b)", "(Fig. 2c)",
                  "(Fig. 2d)", "Staging ratio (Table 5)", "Per benchmark (Table 6)"):
        assert title in summary, title
    assert "▶ this machine: best-b4, " in summary and "NVIDIA dgxa100_n16_ngc21.09_mxnet" in summary
    page = (out / "report.html").read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page  # opens with no network
    table = pd.read_csv(out / "submissions.csv")
    own = table[table["own"]]
    assert list(own["submitter"]) == ["best-b4"] and own["unscored_reason"].iloc[0].endswith("ask for 10")
    nvidia = table[(table["submitter"] == "NVIDIA") & (table["benchmark"] == "cosmoflow")
                   & (table["scaling"] == "strong")].iloc[0]
    assert abs(nvidia["score_minutes"] - 25.781025) < 1e-9
    parts = nvidia[["staging_minutes", "training_minutes", "evaluation_minutes", "other_minutes"]].sum()
    assert abs(parts - nvidia["mean_minutes"]) < 1e-9 and nvidia["staging_minutes"] > 0  # v1.0 staged in the run
    printed = capsys.readouterr()
    assert "read from" in printed.out
    assert "warning: " in printed.err and "a failed run" in printed.err  # best-b4's run that did not converge


def test_the_time_split_leaves_evaluations_out_of_training_and_untimed_staging_out():
    log = RunLog(Path("r.txt"), 1, [], {}, run_start=1_000.0, run_stop=61_000.0,
                 epochs=[(1, 1_000.0, 31_000.0), (2, 31_000.0, 61_000.0)], eval_spans=[(1, 25_000.0, 31_000.0)],
                 staging_ms=500.0, staging_start=0.0)  # staged before run_start: in init, not in the time to train
    split = time_split([log])
    assert split["evaluation_minutes"] == 6_000 / 60_000 and split["training_minutes"] == 54_000 / 60_000
    assert split["staging_minutes"] == 0.0 and split["other_minutes"] == 0.0
    assert split["epoch_minutes"] == 27_000 / 60_000


def test_a_campaign_is_not_a_submission_tree_although_it_holds_its_submission_layout(tmp_path):
    (tmp_path / "c" / "submission" / "results").mkdir(parents=True)
    assert is_tree(tmp_path / "c")
    (tmp_path / "c" / "campaign.json").write_text("{}")
    assert not is_tree(tmp_path / "c") and is_tree(FIXTURE) and is_tree(FIXTURE / "NVIDIA")
    assert not is_tree(tmp_path / "missing")
