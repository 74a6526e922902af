"""Analysis of MLPerf logs: tidy tables (logs.py), the paper's analyses (analyses.py), time-to-solution
prediction (predict.py), figures (figures.py), the HTML / Markdown report (report.py) and the scores
of published submission trees (published.py, scores.py).

    python -m common.campaign.analysis report PATH [PATH ...] --out DIR [--predict BENCH:UNITS:BATCH ...]
    python -m common.campaign.analysis runs PATH [PATH ...] [--csv FILE]
    python -m common.campaign.analysis predict PATH [PATH ...] --predict BENCH:UNITS:BATCH [...]
    python -m common.campaign.analysis scores ROOT [ROOT ...] [--round R] [--json] [--check]

PATH: run directories (holding mlperf.log) or directories above them (campaigns, `demo/runs`). ROOT: a
published MLPerf HPC results round's folder, one submitter's folder, or a campaign; `scores` prints one row per
(submitter, system, benchmark, scaling) as the rules score it (published.py reads, scores.py scores).
"""
