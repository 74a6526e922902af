"""Train DeepCAM to its quality target: `python deepcam/train.py CONFIG [key=value ...]`.

Runs alone or under `horovodrun -np N`. Writes into run.output_dir: config.yaml (resolved),
mlperf.log (MLPerf HPC events, rank 0), summary.json and io_report.json. Exit codes: 0 IoU target
reached, 1 target not reached within train.max_epochs, 2 bad input or config, 3 non-finite loss, 4 internal error,
75 stopped by SIGTERM or SIGUSR1 (after a checkpoint; resume with checkpoint.resume=true).
With dist.elastic.enabled=true ranks may die or join (docs/faults.md).
"""
from __future__ import annotations

import dataclasses

from common.base.cli import exit_now
from common.base.errors import BenchError
from common.runtime import command, run
from common.runtime.loop import Trainee
from common.runtime.dist import StopRequests
from common.runtime.strategy import DataParallel, for_precision, precision_keys, set_precision
from deepcam.config import DeepCamConfig, closed_differences
from deepcam.data import build_datasets, files_read, read_error
from deepcam.rcp import with_rcp


def main(argv=None) -> int:
    return command.main(APP, __doc__, train, argv)


def train(config: str, overrides: list[str], stop: StopRequests) -> int:
    """One MLPerf run of DeepCAM (common/runtime/run.py runs the phases); returns the exit code. `stop`: the
    stop signals, handled since main() began."""
    return run.run_benchmark(APP, config, overrides, stop)


def learning_rates(cfg: DeepCamConfig, strategy: DataParallel) -> list:
    """The learning rate at the start of each epoch, for the dry run; nothing read but the manifest when
    data.train_samples is 0 (the steps per epoch need the training split's size)."""
    from deepcam.optim import StepSchedule
    per_epoch = StepSchedule.from_config(cfg.optimizer, cfg.schedule).per_epoch(train_steps(cfg, strategy.replicas))
    return [per_epoch(float(e)) for e in range(cfg.train.max_epochs)]


def train_steps(cfg: DeepCamConfig, ranks: int) -> int:
    """Optimizer steps per epoch: each rank's block of N // ranks samples in whole local batches."""
    total = cfg.data.train_samples
    if not total:
        from common.io.manifest import load_manifest
        from common.io.formats.deepcam import FORMAT
        try:
            total = load_manifest(cfg.data.dir, expected_format=FORMAT).splits["train"].samples
        except BenchError as err:
            raise BenchError(f"{err}; the steps per epoch need the training split's size: set "
                             f"data.train_samples or data.dir") from None
    per_rank = total // ranks
    if per_rank < cfg.train.local_batch_size:
        raise BenchError(f"{total} training samples over {ranks} ranks leave fewer than train.local_batch_size "
                         f"{cfg.train.local_batch_size} per rank")
    return per_rank // cfg.train.local_batch_size


def build(cfg: DeepCamConfig, strategy: DataParallel) -> Trainee:
    """Model, optimizer, step-based schedule, weighted loss and IoU metric for this rank."""
    import keras
    from deepcam.model import build_model
    from deepcam.optim import StepSchedule, build_optimizer
    keras.utils.set_random_seed(strategy.model_seed(cfg.run.seed))
    set_precision(cfg.train.precision)  # the Keras policy the model is built under
    model = build_model(**dataclasses.asdict(cfg.model))
    steps = StepSchedule.from_config(cfg.optimizer, cfg.schedule)
    optimizer = for_precision(build_optimizer(cfg.optimizer, steps.at_step(0)), cfg.train.precision)
    loss, metric, _ = scoring(cfg)
    return Trainee(model, optimizer, loss, metric,
                   schedule_for=lambda data: steps.per_epoch(data.train_steps), jit_compile=cfg.train.jit_compile)


def scoring(cfg: DeepCamConfig) -> tuple:
    """The weighted loss, the IoU metric and an untrained model's prediction (equal logits: background
    everywhere), which an emulated run's evaluation scores."""
    import keras
    from deepcam.model import MeanIoU, WeightedCrossEntropy, class_weights
    classes = cfg.model.num_classes
    loss = WeightedCrossEntropy(class_weights(cfg.loss.class_frequencies, cfg.loss.weight_power))
    return loss, MeanIoU(classes), lambda y: keras.ops.zeros((*y.shape, classes), "float32")


def hyperparameters(cfg: DeepCamConfig, _strategy: DataParallel) -> dict:
    """Every key the hpc 3.0.0 DeepCAM rules ask for in init (closed division checks their values); the
    scale keys and, after run_start, the dataset sizes are logged by the run."""
    from deepcam.optim import mlperf_optimizer_keys
    return ({"seed": cfg.run.seed}
            | {"batchnorm_group_size": cfg.train.batchnorm_group_size,
               "gradient_accumulation_frequency": cfg.train.gradient_accumulation_frequency}
            | mlperf_optimizer_keys(cfg.optimizer, cfg.schedule)
            | precision_keys(cfg.train.precision, cfg.train.jit_compile))


def input_pipeline(cfg: DeepCamConfig, data_cfg, strategy: DataParallel, seed: int):
    return build_datasets(data_cfg, cfg.model.input_shape, cfg.train.local_batch_size, strategy.input_dist, seed)


def rank_files(cfg: DeepCamConfig, manifest, rank: int, ranks: int) -> list[str]:
    """The dataset paths rank `rank` of `ranks` reads (what data.stage_mode=rank stages)."""
    return files_read(manifest, rank, ranks, cfg.train.local_batch_size)


def example_batch(cfg: DeepCamConfig) -> tuple:
    """One synthetic local batch of the run's shapes (normalised fields, class labels): what the precision
    probe times a step on."""
    import numpy as np
    import tensorflow as tf
    rng, batch = np.random.default_rng(0), cfg.train.local_batch_size
    x = rng.standard_normal((batch, *cfg.model.input_shape), dtype=np.float32)
    y = rng.integers(0, cfg.model.num_classes, (batch, *cfg.model.input_shape[:2])).astype(np.int32)
    return tf.convert_to_tensor(x), tf.convert_to_tensor(y)


APP = run.App(name="deepcam", config=DeepCamConfig, build=build, input=input_pipeline,
              hyperparameters=hyperparameters, rank_files=rank_files, read_error=read_error, with_rcp=with_rcp,
              closed_differences=closed_differences, learning_rates=learning_rates, example_batch=example_batch,
              scoring=scoring)

if __name__ == "__main__":
    exit_now(main())
