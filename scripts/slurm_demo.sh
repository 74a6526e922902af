#!/usr/bin/env bash
# make slurm-demo: the CosmoFlow mini benchmark to its real target (MAE < 0.124) through the Slurm path.
# Generates the mini dataset (once, as make demo does), renders the batch script for the localhost-slurm
# example site (2 tasks, srun --mpi=pmix, staging to /dev/shm), starts a one-node Slurm on this host
# (python -m jobs.localslurm: munged, slurmctld, slurmd; needs root), submits the script with
# `sbatch --wait`, and prints the run's summary. The rendered script runs the compliance checker itself.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-.venv/bin/python}
DEMO_DIR=${DEMO_DIR:-demo}
STAMP=$(date +%Y%m%d-%H%M%S)
JOB_DIR="$DEMO_DIR/slurm/$STAMP"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

say() { printf '\n==> %s\n' "$*"; }
seconds_since() { echo $(( $(date +%s) - $1 )); }
# shellcheck source=scripts/mini_data.sh
source scripts/mini_data.sh

cosmo_mini_data "$DEMO_DIR/data/cosmo_mini" || exit 1
mkdir -p "$JOB_DIR" || exit 2
say "Rendering the Slurm script for the localhost-slurm site: $JOB_DIR/job.sh"
"$PY" -m jobs render --site localhost-slurm --bench cosmoflow --nodes 1 \
    --config cosmoflow/configs/cosmo_mini.yaml --out "$JOB_DIR/job.sh" || exit 2
say "Starting a one-node Slurm and submitting the script (sbatch --wait; about 15 minutes here)"
t0=$(date +%s)
OUTPUT_ROOT="$PWD/$JOB_DIR/runs" STAGE_DIR="/dev/shm/hpc-sciml-stage-$STAMP" \
    "$PY" -m jobs.localslurm submit "$JOB_DIR/job.sh" --dir "$JOB_DIR"
rc=$?
rm -rf "/dev/shm/hpc-sciml-stage-$STAMP"
echo "submission to the job's end: $(seconds_since "$t0") s (exit $rc)"
runs=("$JOB_DIR"/runs/cosmoflow-*)
if [ -d "${runs[0]}" ]; then
    say "Summary"
    "$PY" -m common.campaign.summary "${runs[@]}" || rc=1
else
    echo "no run directory under $JOB_DIR/runs" >&2
    rc=1
fi
exit $rc
