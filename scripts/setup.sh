#!/usr/bin/env bash
# Idempotent set-up of everything the suite needs on a fresh Debian/Ubuntu machine:
# Debian packages, a virtual environment, TensorFlow, Horovod and the DALI TF plugin
# compiled against that TensorFlow, then this project in editable mode with its test extra, then a
# self-check.
#
# Environment knobs (for GPU clusters and other sites):
#   VENV=.venv                    where the virtual environment lives
#   PYTHON=python3                interpreter used to create it
#   TF_PACKAGE=tensorflow-cpu     set to "tensorflow" on GPU nodes (same version, CUDA build)
#   HOROVOD_GPU_OPERATIONS=NCCL   set on GPU nodes before running this script
#   SKIP_APT=1                    do not touch Debian packages (no root, modules provide MPI/compilers)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TF_PACKAGE=${TF_PACKAGE:-tensorflow-cpu}
TF_VERSION=2.18.1
HOROVOD_VERSION=0.28.1
DALI_VERSION=2.4.0
APT_PACKAGES=(g++ cmake make openmpi-bin libopenmpi-dev shellcheck munge slurmctld slurmd slurm-client)

step() { printf '\n==> %s\n' "$*"; }

install_apt_packages() {
    [ "${SKIP_APT:-0}" = 1 ] && { step "SKIP_APT=1: not checking Debian packages"; return; }
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        step "Debian packages present: ${APT_PACKAGES[*]}"
        return
    fi
    step "Installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        step "Creating virtual environment $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    PY="$VENV/bin/python"
    PIP=("$PY" -m pip --disable-pip-version-check)
    "${PIP[@]}" install -q -c constraints.txt pip setuptools wheel
}

have() { "$PY" -c "$1" >/dev/null 2>&1; }

install_tensorflow() {
    step "Installing $TF_PACKAGE==$TF_VERSION and pinned base packages"
    "${PIP[@]}" install -c constraints.txt "$TF_PACKAGE==$TF_VERSION" numpy packaging psutil cloudpickle pyyaml
}

build_horovod() {
    if have "import horovod, horovod.tensorflow; assert horovod.__version__ == '$HOROVOD_VERSION'; \
             from horovod.common.util import gloo_built, mpi_built; assert gloo_built() and mpi_built()"; then
        step "Horovod $HOROVOD_VERSION already built with TensorFlow, Gloo and MPI"
        return
    fi
    step "Building Horovod $HOROVOD_VERSION against TensorFlow (4-8 minutes on 2 cores)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
        "${PIP[@]}" install -c constraints.txt --no-cache-dir --no-build-isolation "horovod==$HOROVOD_VERSION"
}

install_dali() {
    if have "import nvidia.dali, nvidia.dali.plugin.tf; assert nvidia.dali.__version__ == '$DALI_VERSION'"; then
        step "DALI $DALI_VERSION and its TensorFlow plugin already installed"
        return
    fi
    step "Installing DALI $DALI_VERSION and compiling its TensorFlow plugin (about a minute)"
    "${PIP[@]}" install -c constraints.txt "nvidia-dali-cuda120==$DALI_VERSION"
    "${PIP[@]}" install -c constraints.txt --no-cache-dir --no-build-isolation \
        "nvidia-dali-tf-plugin-cuda120==$DALI_VERSION"
}

install_project() {
    step "Installing the project in editable mode"
    TF_PACKAGE="$TF_PACKAGE" "${PIP[@]}" install -c constraints.txt --no-build-isolation -e ".[test]"
    "${PIP[@]}" check
}

self_check() {
    step "Self-check"
    "$VENV/bin/horovodrun" --check-build | tee "$VENV/horovod-check-build.txt"
    for fw in TensorFlow Gloo MPI; do
        grep -Eq "\[X\] $fw" "$VENV/horovod-check-build.txt" || {
            echo "self-check failed: horovodrun --check-build does not list $fw as available" >&2; exit 1; }
    done
    "$PY" - <<'PYEOF'
import tensorflow as tf, nvidia.dali as dali, nvidia.dali.plugin.tf  # noqa: F401
import mlperf_logging.mllog, h5py, yaml  # noqa: F401
import common, cosmoflow, data_prep  # noqa: F401
import google_crc32c
assert google_crc32c.implementation == "c", "google-crc32c has no C extension here: TFRecord CRCs would be slow"
print(f"TensorFlow {tf.__version__}, DALI {dali.__version__} with TF plugin, mlperf-logging OK")
PYEOF
}

install_apt_packages
make_venv
install_tensorflow
build_horovod
install_dali
install_project
self_check
touch "$VENV/.setup-stamp"
step "Set-up complete: $VENV"
