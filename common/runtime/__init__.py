"""The training runtime: config, the distributed runtime (DistEnv), the run steps, the loop, MLPerf logging,
checkpoints, elastic runs, stop signals and the summary."""
