"""TensorBoard event files of a run, written by rank 0 into RUN_DIR/tensorboard (`tensorboard --logdir runs/`).

Scalars, by global training step: `train/loss`, `train/learning_rate` and `train/samples_per_second` every
`tensorboard.every_steps` steps (the epoch's running figures); `eval/<metric>` (and its parts) and `eval/val_loss` at each evaluation; and at
the end the run's `system/*` figures (summary.json's `system`: shares, FLOP/s, memory, energy).
"""
from __future__ import annotations

from pathlib import Path

SUBDIR = "tensorboard"
# A history record's keys that are not the evaluation's.
TRAINING_KEYS = {"epoch", "step", "loss", "lr", "steps", "train_seconds", "samples_per_second", "input_wait_seconds",
                 "step_seconds", "val_samples_seen"}


class EventWriter:
    """A tf.summary file writer for rank 0's scalars."""

    def __init__(self, out_dir: str | Path, every_steps: int):
        import tensorflow as tf
        self.tf, self.every = tf, every_steps
        self.writer = tf.summary.create_file_writer(str(Path(out_dir) / SUBDIR))

    def scalars(self, step: int, values: dict) -> None:
        """Write every finite number in `values` at `step`."""
        with self.writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                    self.tf.summary.scalar(name, float(value))

    def train(self, step: int, running: dict) -> None:
        if step % self.every == 0:
            self.scalars(step, {"train/loss": running.get("loss"), "train/learning_rate": running.get("lr"),
                                "train/samples_per_second": running.get("samples_per_second")})

    def evaluation(self, step: int, record: dict) -> None:
        """An evaluation's record: the metric (and its parts) and the validation loss."""
        self.scalars(step, {f"eval/{k}": v for k, v in record.items() if k not in TRAINING_KEYS})

    def system(self, step: int, figures: dict) -> None:
        flat = {f"system/{k}": v for k, v in figures.items()}
        flat |= {f"system/step_{k}": v for k, v in (figures.get("step_breakdown") or {}).items()}
        ranks = figures.get("peak_rss_mb") or []
        if ranks:
            flat["system/peak_rss_mb_max"] = max(ranks)
        self.scalars(step, flat)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in a run's event files (for tests and reports)."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((Path(run_dir) / SUBDIR).glob("events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(raw.numpy())
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                found.setdefault(value.tag, []).append((event.step, float(number)))
    return found
