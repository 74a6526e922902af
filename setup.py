"""Packaging for the HPC scientific deep-learning benchmark suite.

Exact pins: the suite measures a machine, so every run must use the same stack.
GPU sites set TF_PACKAGE=tensorflow (same version, CUDA build) before installing.
Horovod and the DALI TF plugin compile against the installed TensorFlow, so
scripts/setup.sh installs them first with the right build flags; here they are
only listed so that pip verifies them.
"""
import os

from setuptools import find_packages, setup

TF_PACKAGE = os.environ.get("TF_PACKAGE", "tensorflow-cpu")
if TF_PACKAGE not in ("tensorflow-cpu", "tensorflow"):
    raise SystemExit(f"TF_PACKAGE={TF_PACKAGE!r}: expected 'tensorflow-cpu' or 'tensorflow'")

setup(
    name="hpc-sciml-bench",
    version="0.1.0",
    description="MLPerf-HPC-style benchmarks (CosmoFlow, DeepCAM) with Horovod, DALI and Mesh-TensorFlow",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["common*", "cosmoflow*", "deepcam*", "data_prep*", "jobs*"]),
    package_data={"cosmoflow": ["configs/*.yaml"], "deepcam": ["configs/*.yaml"],
                  "jobs": ["sites/*.yaml", "templates/*.sh"]},
    install_requires=[
        f"{TF_PACKAGE}==2.18.1",
        "numpy==2.0.2",
        "horovod==0.28.1",
        "mesh-tensorflow==0.1.21",
        "nvidia-dali-cuda120==2.4.0",
        "nvidia-dali-tf-plugin-cuda120==2.4.0",
        "mlperf-logging==4.1.68",
        "pandas==2.2.3",
        "matplotlib==3.11.2",
        "h5py==3.12.1",
        "scipy==1.17.1",
        "pyyaml==6.0.2",
        "tqdm==4.67.1",
        "psutil==6.1.1",
        "xxhash==3.6.0",
        "optuna==5.0.0",  # hyperparameter search (common/hpo, docs/hpo.md)
        "onnx==1.20.1",  # trained models in ONNX (common/export.py): onnx 1.21+ needs protobuf 6, TF 2.18 < 6
        "tf2onnx==1.17.0",  # Keras 3's ONNX export on the TensorFlow backend (1.16 pins protobuf 3.20)
        "onnxruntime==1.32.0",  # `export --check` runs the exported model
        "zstandard==0.25.0",
        "google-crc32c==1.9.0",  # TFRecord CRCs with the CPU's CRC32C instructions (common/io/crc.py)
    ],
    extras_require={"test": [  # `pip install -e ".[test]"` (scripts/setup.sh): what `make test` needs
        "pytest==8.3.4",
        "pytest-xdist==3.8.0",  # `make test` runs the unit and fuzz tests on TEST_WORKERS processes
        "hypothesis==6.170.15",  # the fuzz tests (tests/fuzz, docs/fuzzing.md)
    ]},
    # Each the same as its `python -m` form (README.md).
    entry_points={"console_scripts": [
        "sciml-data-prep=data_prep.__main__:main",
        "sciml-train-cosmoflow=cosmoflow.train:main",
        "sciml-train-deepcam=deepcam.train:main",
        "sciml-campaign=common.campaign.run:main",
        "sciml-report=common.campaign.analysis.__main__:main",
        "sciml-jobs=jobs.__main__:main",
        "sciml-export=common.export:main",
        "sciml-hpo=common.hpo.__main__:main",
    ]},
)
