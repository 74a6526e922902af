#!/usr/bin/env bash
# make demo: for each benchmark named on the command line, generate its mini synthetic dataset
# (once), train with horovodrun -np $NP to the quality target (staging the dataset to $STAGE_DIR
# inside the timed run first), run the official MLPerf compliance checker on the log, and print a
# summary table of the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
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

# CosmoFlow mini: 64^3 universes (mini prior) cut into 32^3 samples, 8 per universe.
COSMO_UNIVERSES=${COSMO_UNIVERSES:-1088}
COSMO_VAL_UNIVERSES=${COSMO_VAL_UNIVERSES:-64}

demo_cosmoflow() {
    local data="$DEMO_DIR/data/cosmo_mini" run="$DEMO_DIR/runs/cosmoflow-$STAMP" t0
    t0=$(date +%s)
    if [ ! -f "$data/tfrecords/manifest.json" ]; then
        say "CosmoFlow: generating $COSMO_UNIVERSES synthetic universes (64^3 x 4) in $data/raw"
        "$PY" -m data_prep cosmo-synth --out "$data/raw" --universes "$COSMO_UNIVERSES" --size 64 --prior mini \
            --seed 2026 || return 1
        say "CosmoFlow: converting to TFRecords of 32^3 x 4 samples in $data/tfrecords"
        "$PY" -m data_prep cosmo-convert --input "$data/raw" --out "$data/tfrecords" --sample-size 32 \
            --val-universes "$COSMO_VAL_UNIVERSES" --seed 2026 || return 1
        echo "data preparation took $(seconds_since "$t0") s"
    else
        say "CosmoFlow: using the existing dataset $data/tfrecords (delete it to regenerate)"
    fi
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

# DeepCAM mini: 96 x 144 synthetic climate snapshots with heuristic labels.
DEEPCAM_TRAIN=${DEEPCAM_TRAIN:-1024}
DEEPCAM_VAL=${DEEPCAM_VAL:-128}

demo_deepcam() {
    local data="$DEMO_DIR/data/deepcam_mini" run="$DEMO_DIR/runs/deepcam-$STAMP" t0
    t0=$(date +%s)
    if [ ! -f "$data/tfrecords/manifest.json" ]; then
        say "DeepCAM: generating $DEEPCAM_TRAIN + $DEEPCAM_VAL synthetic snapshots (96 x 144 x 16) in $data/raw"
        "$PY" -m data_prep deepcam-synth --out "$data/raw" --train "$DEEPCAM_TRAIN" --validation "$DEEPCAM_VAL" \
            --height 96 --width 144 --seed 2026 || return 1
        say "DeepCAM: converting to TFRecords in $data/tfrecords"
        "$PY" -m data_prep deepcam-convert --input "$data/raw" --out "$data/tfrecords" || return 1
        echo "data preparation took $(seconds_since "$t0") s"
    else
        say "DeepCAM: using the existing dataset $data/tfrecords (delete it to regenerate)"
    fi
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
