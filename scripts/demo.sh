#!/usr/bin/env bash
# make demo: for each benchmark named on the command line, generate its mini synthetic dataset
# (once), train with horovodrun -np $NP to the quality target (staging the dataset to $STAGE_DIR
# inside the timed run first), run the official MLPerf compliance checker on the log, and print a
# summary table of the runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-.venv/bin/python}
NP=${NP:-2}
DEMO_DIR=${DEMO_DIR:-demo}
HOROVODRUN="$(dirname "$PY")/horovodrun"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
STAMP=$(date +%Y%m%d-%H%M%S)
# Node-local directory the runs stage their data into (timed, as MLPerf HPC does); removed after each run.
STAGE_DIR=${STAGE_DIR:-$DEMO_DIR/stage}
runs=()
failed=0

say() { printf '\n==> %s\n' "$*"; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

# shellcheck source=scripts/mini_data.sh
source scripts/mini_data.sh

demo_cosmoflow() {
    local data="$DEMO_DIR/data/cosmo_mini" run="$DEMO_DIR/runs/cosmoflow-$STAMP" t0
    t0=$(date +%s)
    cosmo_mini_data "$data" || return 1
    say "CosmoFlow: training with horovodrun -np $NP to validation MAE < 0.124 (output: $run)"
    local t1; t1=$(date +%s)
    "$HOROVODRUN" -np "$NP" -H "localhost:$NP" "$PY" cosmoflow/train.py cosmoflow/configs/cosmo_mini.yaml \
        "data.dir=$data/tfrecords" "run.output_dir=$run" "data.stage_dir=$STAGE_DIR" data.stage_mode=node
    local rc=$?
    rm -rf "$STAGE_DIR"
    echo "training took $(seconds_since "$t1") s (exit $rc); data + training: $(seconds_since "$t0") s"
    runs+=("$run")
    say "CosmoFlow: MLPerf compliance check (hpc 3.0.0)"
    "$PY" -m common.compliance "$run" || rc=1
    return $rc
}

demo_deepcam() {
    local data="$DEMO_DIR/data/deepcam_mini" run="$DEMO_DIR/runs/deepcam-$STAMP" t0
    t0=$(date +%s)
    deepcam_mini_data "$data" || return 1
    say "DeepCAM: training with horovodrun -np $NP to IoU >= 0.82 (output: $run)"
    local t1; t1=$(date +%s)
    "$HOROVODRUN" -np "$NP" -H "localhost:$NP" "$PY" deepcam/train.py deepcam/configs/deepcam_mini.yaml \
        "data.dir=$data/tfrecords" "run.output_dir=$run" "data.stage_dir=$STAGE_DIR" data.stage_mode=node
    local rc=$?
    rm -rf "$STAGE_DIR"
    echo "training took $(seconds_since "$t1") s (exit $rc); data + training: $(seconds_since "$t0") s"
    runs+=("$run")
    say "DeepCAM: MLPerf compliance check (hpc 3.0.0, open division)"
    "$PY" -m common.compliance "$run" || rc=1
    return $rc
}

for bench in "$@"; do
    case "$bench" in
        cosmoflow) demo_cosmoflow || failed=1 ;;
        deepcam) demo_deepcam || failed=1 ;;
        *) echo "make demo: unknown benchmark '$bench' (known: cosmoflow, deepcam)" >&2; exit 2 ;;
    esac
done

if [ ${#runs[@]} -gt 0 ]; then
    say "Summary"
    "$PY" -m common.summary "${runs[@]}" || failed=1
fi
exit $failed
