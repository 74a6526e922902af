#!/usr/bin/env bash
# make demo: for each benchmark named on the command line, generate its mini synthetic dataset
# (once), train with horovodrun -np $NP to the quality target (staging the dataset to $STAGE_DIR
# inside init, logged and untimed, as hpc 3.0.0 allows), run the official MLPerf compliance
# checker on the log, and print a summary table of the runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-.venv/bin/python}
NP=${NP:-2}
DEMO_DIR=${DEMO_DIR:-demo}
HOROVODRUN="$(dirname "$PY")/horovodrun"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# This checkout's code first: a .venv shared with another checkout (a git worktree) holds that one as its
# editable install, which `python cosmoflow/train.py` would otherwise import.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STAMP=$(date +%Y%m%d-%H%M%S)
# Node-local directory below which each run stages its data (inside init, untimed) into a directory of
# its own, removed after the run (STAGE_DIR itself is left alone).
STAGE_DIR=${STAGE_DIR:-$DEMO_DIR/stage}
runs=()
failed=0

say() { printf '\n==> %s\n' "$*"; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

# shellcheck source=scripts/mini_data.sh
source scripts/mini_data.sh

# demo_run NAME BENCH CONFIG DATA MAKE_DATA TARGET CHECK: generate DATA once, train BENCH with CONFIG, check the log.
# Each run stages into a directory of its own below $STAGE_DIR, and only that directory is removed after it.
demo_run() {
    local name=$1 bench=$2 config=$3 data=$4 make_data=$5 target=$6 check=$7
    local run="$DEMO_DIR/runs/$bench-$STAMP" stage="$STAGE_DIR/$bench-$STAMP" t0 t1 rc
    t0=$(date +%s)
    "$make_data" "$data" || return 1
    say "$name: training with horovodrun -np $NP to $target (output: $run)"
    t1=$(date +%s)
    "$HOROVODRUN" -np "$NP" -H "localhost:$NP" "$PY" "$bench/train.py" "$config" \
        "data.dir=$data/tfrecords" "run.output_dir=$run" "data.stage_dir=$stage" data.stage_mode=node
    rc=$?
    rm -rf "$stage"
    echo "training took $(seconds_since "$t1") s (exit $rc); data + training: $(seconds_since "$t0") s"
    runs+=("$run")
    say "$name: MLPerf compliance check ($check)"
    "$PY" -m common.campaign.compliance "$run" || rc=1
    return $rc
}

demo_cosmoflow() {
    demo_run CosmoFlow cosmoflow cosmoflow/configs/cosmo_mini.yaml "$DEMO_DIR/data/cosmo_mini" cosmo_mini_data \
        "validation MAE < 0.124" "hpc 3.0.0"
}

demo_deepcam() {
    demo_run DeepCAM deepcam deepcam/configs/deepcam_mini.yaml "$DEMO_DIR/data/deepcam_mini" deepcam_mini_data \
        "IoU >= 0.82" "hpc 3.0.0, open division"
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
    "$PY" -m common.campaign.summary "${runs[@]}" || failed=1
fi
exit $failed
