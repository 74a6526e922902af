"""The record `train.precision=auto` weighs: epochs to the target in float32 and in mixed_bfloat16, per mini.

    python benchmarks/precision_epochs.py run --app cosmoflow --data DIR [--runs 3] [--seed 1000] [--np 2]
        [--out-dir studies/precision] [overrides ...]
    python benchmarks/precision_epochs.py collect CAMPAIGN_F32 CAMPAIGN_BF16 --app cosmoflow
        [--more-bf16 CAMPAIGN ...] [--out benchmarks/results/precision_epochs.json]

`run` trains the application's mini config as two campaigns of --runs seeds each (the same seeds), one per
precision (`python -m common.campaign run ... train.precision=<p>`), then collects them. `collect` reads two
finished campaigns and writes, for the application, each precision's epochs to the target (the epoch of the first
evaluation at it; a run that did not reach it is listed under `not_converged` and left out of the ratio), the
seeds, the time to train and the campaign, into the record (other applications' entries kept). --more-bf16 adds
campaigns such as a missed seed rerun with a larger train.max_epochs: a seed counts once, by its run that reached
the target.
common/runtime/precision.py's `epochs_ratio` reads it: bfloat16's mean epochs over float32's.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness import REPO, RESULTS_DIR, run_header, sgemm_gflops, write_json_atomic

sys.path.insert(0, str(REPO))
from common.campaign.analysis.logs import load_runs  # noqa: E402

RECORD = RESULTS_DIR / "precision_epochs.json"
CONFIGS = {"cosmoflow": "cosmoflow/configs/cosmo_mini.yaml", "deepcam": "deepcam/configs/deepcam_mini.yaml"}
PRECISIONS = ("float32", "mixed_bfloat16")


def precision_entry(campaigns: list[Path]) -> dict:
    """Epochs to the target, seeds and minutes of finished campaigns' runs (converged ones; the others named).
    A seed run in several campaigns (a rerun with a larger train.max_epochs) counts once: its run that reached
    the target, else its last."""
    runs, _ = load_runs(campaigns)
    runs = runs.assign(order=range(len(runs)), reached=runs["converged"].astype(bool))
    runs = runs.sort_values(["seed", "reached", "order"]).groupby("seed").tail(1)
    done = runs[runs["reached"]]
    return {"campaign": ", ".join(map(str, campaigns)), "seeds": [int(s) for s in done["seed"]],
            "epochs": [int(e) for e in done["epochs_to_converge"]],
            "time_to_train_minutes": [round(t / 60, 2) for t in done["time_to_train"]],
            "not_converged": [int(s) for s in runs[~runs["reached"]]["seed"]]}


def collect(app: str, campaigns: dict[str, list[Path]], out: Path) -> dict:
    """Write the application's entry into the record at `out` (other applications' kept); returns the record."""
    record = json.loads(out.read_text()) if out.is_file() else {}
    record[app] = {p: precision_entry(c) for p, c in campaigns.items()} | run_header(sgemm_gflops())
    write_json_atomic(out, record)
    return record


def run_campaigns(args: argparse.Namespace) -> dict[str, list[Path]]:
    """The two campaigns, one per precision, on the same seeds."""
    out = {}
    for precision in PRECISIONS:
        folder = Path(args.out_dir) / f"{args.app}-{precision}"
        cmd = [sys.executable, "-m", "common.campaign", "run", args.app, str(REPO / CONFIGS[args.app]),
               f"data.dir={args.data}", f"train.precision={precision}", *args.overrides, "--out", str(folder),
               "--runs", str(args.runs), "--seed", str(args.seed), "--np", str(args.np)]
        print(" ".join(cmd[1:]), flush=True)
        code = subprocess.run(cmd, cwd=REPO).returncode
        if code not in (0, 1):  # 1: a campaign without a valid score (fewer runs than the rules ask) still counts
            raise SystemExit(f"the {precision} campaign exited {code}")
        out[precision] = [folder]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--app", choices=list(CONFIGS), required=True)
    run.add_argument("--data", required=True)
    run.add_argument("--runs", type=int, default=3)
    run.add_argument("--seed", type=int, default=1000)
    run.add_argument("--np", type=int, default=2)
    run.add_argument("--out-dir", default=str(REPO / "studies/precision"))
    run.add_argument("overrides", nargs="*")
    got = sub.add_parser("collect")
    got.add_argument("campaigns", nargs=2, metavar=("CAMPAIGN_F32", "CAMPAIGN_BF16"))
    got.add_argument("--app", choices=list(CONFIGS), required=True)
    got.add_argument("--more-bf16", nargs="+", type=Path, default=[], metavar="CAMPAIGN",
                     help="further mixed_bfloat16 campaigns, e.g. a missed seed rerun with a larger max_epochs")
    for p in (run, got):
        p.add_argument("--out", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    if args.command == "run":
        campaigns = run_campaigns(args)
    else:
        campaigns = {"float32": [Path(args.campaigns[0])], "mixed_bfloat16": [Path(args.campaigns[1]), *args.more_bf16]}
    entry = collect(args.app, campaigns, args.out)[args.app]
    for precision in PRECISIONS:
        print(f"{args.app} {precision}: epochs {entry[precision]['epochs']} (seeds {entry[precision]['seeds']}; "
              f"not converged: {entry[precision]['not_converged'] or 'none'})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
