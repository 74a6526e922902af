#!/usr/bin/env bash
# make scaling: weak and strong scaling of CosmoFlow mini on 1 and 2 ranks of this machine, then the analysis
# report (scaling efficiency, and where a training step goes from each run's summary.json `system` figures).
# Three campaigns of one run each, EPOCHS epochs (default 1: throughput, not time to train; the runs stop
# before the target and exit 1, which is expected here):
#   w1: 1 rank, local batch 4 (global 4)    w2: 2 ranks, local batch 4 (global 8)    s1: 1 rank, local batch 8
# Weak scaling compares w1 with w2 (same local batch); strong scaling s1 with w2 (same global batch 8).
# Resumable: a campaign that has its run is not run again (remove SCALING_DIR to measure afresh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
EPOCHS=${EPOCHS:-1}
SCALING_DIR=${SCALING_DIR:-studies/cosmo-scaling}
REPORT_DIR=${REPORT_DIR:-studies/scaling}
DATA_ROOT=${DATA_ROOT:-demo/data}
SYSTEM=${SYSTEM:-local-2core}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

seconds_since() { echo $(( $(date +%s) - $1 )); }
say() { printf '\n==> %s\n' "$*"; }
# shellcheck source=scripts/mini_data.sh
source scripts/mini_data.sh

cosmo_mini_data "$DATA_ROOT/cosmo_mini"
# name:ranks:local batch size
CONFIGS=("w1:1:4" "w2:2:4" "s1:1:8")
for config in "${CONFIGS[@]}"; do
    IFS=: read -r name ranks local <<< "$config"
    say "$name: global batch $((ranks * local)) on $ranks rank(s), $EPOCHS epoch(s) ($SCALING_DIR/$name)"
    rc=0
    "$PY" -m common.campaign run cosmoflow cosmoflow/configs/cosmo_mini.yaml --out "$SCALING_DIR/$name" \
        --runs 1 --np "$ranks" --system "$SYSTEM" \
        "data.dir=$DATA_ROOT/cosmo_mini/tfrecords" "train.local_batch_size=$local" "train.max_epochs=$EPOCHS" || rc=$?
    [ "$rc" -le 1 ] || exit "$rc"
done
say "analysis report in $REPORT_DIR"
"$PY" -m common.campaign.analysis report "$SCALING_DIR"/w1 "$SCALING_DIR"/w2 "$SCALING_DIR"/s1 --out "$REPORT_DIR"
