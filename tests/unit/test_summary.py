"""common.campaign.summary: the table of finished runs, with staging figures when a run staged its data."""
from common.campaign.summary import format_table


def _run(io=None):
    return {"benchmark": "cosmoflow", "status": "success", "time_to_train_seconds": 650.04, "epochs": 9,
            "metric_name": "mae", "final_metric": 0.1221, "target": 0.124, "samples_per_second_steady": 116.2,
            "ranks": 2, "compliance": {"passed": True}, "config": {"mlperf": {"division": "closed"}}, "io": io}


def test_table_shows_staging_time_and_rate_or_a_dash():
    staged = _run({"staging": {"seconds": 2.5, "write_gb_per_second": 0.9}})
    lines = format_table([staged, _run()]).splitlines()
    assert lines[0].split()[:5] == ["benchmark", "status", "time", "to", "train"] and "staging" in lines[0]
    assert lines[1].split()[2:8] == ["650.0", "s", "2.5", "s,", "0.90", "GB/s"] and "mae 0.1221" in lines[1]
    assert lines[2].split()[2:5] == ["650.0", "s", "-"] and lines[2].rstrip().endswith("SUCCESS (closed)")
