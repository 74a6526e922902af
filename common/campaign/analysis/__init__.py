"""Analysis of MLPerf logs: tidy tables (logs.py), the paper's analyses (analyses.py), time-to-solution
prediction (predict.py), figures (figures.py) and the HTML / Markdown report (report.py).

    python -m common.campaign.analysis report PATH [PATH ...] --out DIR [--predict BENCH:UNITS:BATCH ...]
    python -m common.campaign.analysis runs PATH [PATH ...] [--csv FILE]
    python -m common.campaign.analysis predict PATH [PATH ...] --predict BENCH:UNITS:BATCH [...]

PATH: run directories (holding mlperf.log) or directories above them (campaigns, `demo/runs`).
"""
