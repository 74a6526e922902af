# shellcheck shell=bash
# Sourced by scripts/demo.sh and scripts/study.sh: make the mini synthetic datasets once.
# Expects PY (the interpreter) and the say() and seconds_since() helpers of the caller.

# CosmoFlow mini: 64^3 universes (mini prior) cut into 32^3 samples, 8 per universe.
COSMO_UNIVERSES=${COSMO_UNIVERSES:-1088}
COSMO_VAL_UNIVERSES=${COSMO_VAL_UNIVERSES:-64}
# DeepCAM mini: 96 x 144 synthetic climate snapshots with heuristic labels.
DEEPCAM_TRAIN=${DEEPCAM_TRAIN:-1024}
DEEPCAM_VAL=${DEEPCAM_VAL:-128}

# cosmo_mini_data DIR: DIR/raw (HDF5 universes) and DIR/tfrecords, unless DIR/tfrecords is complete.
cosmo_mini_data() {
    local data=$1 t0
    t0=$(date +%s)
    if [ -f "$data/tfrecords/manifest.json" ]; then
        say "CosmoFlow: using the existing dataset $data/tfrecords (delete it to regenerate)"
        return 0
    fi
    say "CosmoFlow: generating $COSMO_UNIVERSES synthetic universes (64^3 x 4) in $data/raw"
    "$PY" -m data_prep cosmo-synth --out "$data/raw" --universes "$COSMO_UNIVERSES" --size 64 --prior mini \
        --seed 2026 || return 1
    say "CosmoFlow: converting to TFRecords of 32^3 x 4 samples in $data/tfrecords"
    "$PY" -m data_prep cosmo-convert --input "$data/raw" --out "$data/tfrecords" --sample-size 32 \
        --val-universes "$COSMO_VAL_UNIVERSES" --seed 2026 || return 1
    echo "data preparation took $(seconds_since "$t0") s"
}

# deepcam_mini_data DIR: DIR/raw (HDF5 snapshots) and DIR/tfrecords, unless DIR/tfrecords is complete.
deepcam_mini_data() {
    local data=$1 t0
    t0=$(date +%s)
    if [ -f "$data/tfrecords/manifest.json" ]; then
        say "DeepCAM: using the existing dataset $data/tfrecords (delete it to regenerate)"
        return 0
    fi
    say "DeepCAM: generating $DEEPCAM_TRAIN + $DEEPCAM_VAL synthetic snapshots (96 x 144 x 16) in $data/raw"
    "$PY" -m data_prep deepcam-synth --out "$data/raw" --train "$DEEPCAM_TRAIN" --validation "$DEEPCAM_VAL" \
        --height 96 --width 144 --seed 2026 || return 1
    say "DeepCAM: converting to TFRecords in $data/tfrecords"
    "$PY" -m data_prep deepcam-convert --input "$data/raw" --out "$data/tfrecords" || return 1
    echo "data preparation took $(seconds_since "$t0") s"
}
