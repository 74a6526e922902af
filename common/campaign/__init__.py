"""Campaigns of repeated runs, their scoring (with the MLPerf compliance checker) and the analysis report.
Reads run directories only."""
