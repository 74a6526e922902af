#!/usr/bin/env bash
# make hpo-study: the hyperparameter study of docs/hpo.md on this machine. CosmoFlow mini at global batch
# 4 (1 rank), 8 (2 ranks), 16 (2 ranks, local batch 8) and 32 (2 ranks, local batch 16); BATCHES overrides the
# list ("name:ranks:local batch" words). A search of TRIALS trials each (learning rate, warm-up, decay epochs;
# the config's own settings first), then SEEDS runs of each batch size's best settings as a campaign (score with
# its interval), then the analysis report of the campaigns in REPORT_DIR and that of the searches (every
# trial's run, each search's best settings and figures) in REPORT_DIR/searches.
# Resumable: run it again and the searches and campaigns continue where they stopped. The study's record
# (logs, configs, scores; not checkpoints) is copied to $REPORT_DIR/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TRIALS=${TRIALS:-8}
SEEDS=${SEEDS:-3}
STUDY_DIR=${STUDY_DIR:-studies/cosmo-hpo}
REPORT_DIR=${REPORT_DIR:-studies/hpo_study}
DATA_ROOT=${DATA_ROOT:-demo/data}
STAGE_DIR=${STAGE_DIR:-/dev/shm/hpc-sciml-hpo}
SYSTEM=${SYSTEM:-local-2core}
MAX_EPOCHS=${MAX_EPOCHS:-16}  # as make study: global batch 4 needs more than cosmo_mini.yaml's 12
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

say() { printf '\n==> %s\n' "$*"; }
seconds_since() { echo $(( $(date +%s) - $1 )); }
# shellcheck source=scripts/mini_data.sh
source scripts/mini_data.sh

# write_space FILE LOCAL_BATCH: the search space of one batch size
write_space() {
    cat > "$1" <<SPACE
benchmark: cosmoflow
config: cosmoflow/configs/cosmo_mini.yaml
overrides: [data.dir=$DATA_ROOT/cosmo_mini/tfrecords, train.local_batch_size=$2, train.max_epochs=$MAX_EPOCHS]
objective: epochs
failure_penalty: 2.0
seed: 1000
sampler: {name: tpe, seed: 1, startup_trials: 4}
pruner: {name: median, startup_trials: 3, warmup_epochs: 3}
params:
  optimizer.base_lr: {type: float, low: 0.002, high: 0.032, log: true}
  schedule.warmup_epochs: {type: int, low: 0, high: 3}
  schedule.decay_epochs: {type: categorical, choices: [[5, 7], [7, 10], [9, 12]]}
enqueue:
  - {optimizer.base_lr: 0.008, schedule.warmup_epochs: 1, schedule.decay_epochs: [5, 7]}
SPACE
}

# copy_logs: the study's record into $REPORT_DIR/logs (each run's MLPerf log, summary, config, command and
# output; each search's journal and settings; each campaign's record and score), without checkpoints,
# event files, submission packages or the runs an interrupted campaign set aside
copy_logs() {
    local dest="$PWD/$REPORT_DIR/logs"
    rm -rf "$dest" && mkdir -p "$dest"
    (cd "$STUDY_DIR" && find . \( -name submission -o -name aborted -o -name tensorboard -o -name 'ckpt*' \) -prune \
        -o -type f \( -name mlperf.log -o -name summary.json -o -name config.yaml -o -name trial.json \
        -o -name command.txt -o -name train.log -o -name journal.log -o -name hpo.json -o -name 'space-*.yaml' \
        -o -name campaign.json -o -name campaign_run.json -o -name score.json \) -print0 |
        xargs -0 cp --parents -t "$dest")
    echo "copied $(find "$dest" -type f | wc -l) files of the study's record to $REPORT_DIR/logs"
}

read -r -a CONFIGS <<< "${BATCHES-b4:1:4 b8:2:4 b16:2:8 b32:2:16}"  # name:ranks:local batch size
[ "${#CONFIGS[@]}" -gt 0 ] || { echo "error: BATCHES is empty; expected words name:ranks:local batch (e.g. b8:2:4)" >&2; exit 2; }
NAMES=()
for config in "${CONFIGS[@]}"; do
    [[ "$config" =~ ^b[0-9]+:[1-9][0-9]*:[1-9][0-9]*$ ]] || {
        echo "error: BATCHES word '$config' is not name:ranks:local batch (e.g. b8:2:4)" >&2; exit 2; }
    NAMES+=("${config%%:*}")
done
cosmo_mini_data "$DATA_ROOT/cosmo_mini"
mkdir -p "$STUDY_DIR"
for config in "${CONFIGS[@]}"; do
    IFS=: read -r name ranks local <<< "$config"
    t0=$(date +%s)
    say "search at global batch $((ranks * local)) on $ranks rank(s): $TRIALS trials ($STUDY_DIR/search-$name)"
    write_space "$STUDY_DIR/space-$name.yaml" "$local"
    "$PY" -m common.hpo run "$STUDY_DIR/space-$name.yaml" --out "$STUDY_DIR/search-$name" --trials "$TRIALS" \
        --np "$ranks"
    echo "search $name took $(seconds_since "$t0") s"
done
for config in "${CONFIGS[@]}"; do
    IFS=: read -r name ranks local <<< "$config"
    best="$STUDY_DIR/search-$name/best/cosmoflow_b$((ranks * local)).yaml"
    [ -f "$best" ] || { echo "error: the search at $name found no settings reaching the target ($best)" >&2; exit 1; }
    say "$SEEDS runs of the best settings at global batch $((ranks * local)) ($STUDY_DIR/best-$name)"
    rc=0  # exit 1: no valid MLPerf score (fewer runs than the rules' 10), expected here
    "$PY" -m common.campaign run cosmoflow "$best" --out "$STUDY_DIR/best-$name" --runs "$SEEDS" --np "$ranks" \
        --system "$SYSTEM" --stage-dir "$STAGE_DIR" || rc=$?
    [ "$rc" -le 1 ] || exit "$rc"
done
say "analysis report of the best settings' runs in $REPORT_DIR, of the searches in $REPORT_DIR/searches"
"$PY" -m common.campaign.analysis report "${NAMES[@]/#/$STUDY_DIR/best-}" --out "$REPORT_DIR"
"$PY" -m common.campaign.analysis report "${NAMES[@]/#/$STUDY_DIR/search-}" --out "$REPORT_DIR/searches"
for name in "${NAMES[@]}"; do
    mkdir -p "$REPORT_DIR/search-$name"
    cp "$STUDY_DIR/search-$name/report.md" "$STUDY_DIR/search-$name/trials.csv" "$REPORT_DIR/search-$name/"
    cp -r "$STUDY_DIR/search-$name/figures" "$STUDY_DIR/search-$name/best" "$REPORT_DIR/search-$name/"
    cp "$STUDY_DIR/best-$name/score.md" "$REPORT_DIR/search-$name/best_runs_score.md"
done
copy_logs
