"""DeepCAM's loss (class-weighted cross-entropy) and validation metric (IoU as the reference defines it).

Both are written with `keras.ops` only. Labels are integer maps (B, H, W) with 0 background,
1 tropical cyclone, 2 atmospheric river; predictions are logits (B, H, W, classes).
"""
from __future__ import annotations

import keras
import numpy as np

CLASSES = ("background", "cyclone", "river")
# Pixel frequencies of the classes in the real DeepCAM training set, as the reference uses them.
REFERENCE_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
WEIGHT_POWER = -0.125


def class_weights(frequencies=REFERENCE_FREQUENCIES, power: float = WEIGHT_POWER) -> tuple[float, ...]:
    """Cross-entropy class weights frequency**power (rarer classes weigh more)."""
    if any(f <= 0 for f in frequencies):
        raise ValueError(f"class frequencies {list(frequencies)}: expected all > 0")
    return tuple(float(f) ** power for f in frequencies)


class WeightedCrossEntropy:
    """Per-pixel cross-entropy times the weight of the pixel's true class, averaged over all pixels.

    This is the reference's `CrossEntropyLoss(weight, reduction='none')` followed by a plain mean
    (not a weight-normalised mean).
    """

    def __init__(self, weights):
        self.weights = tuple(float(w) for w in weights)

    def __call__(self, y_true, logits):
        labels = keras.ops.cast(y_true, "int32")  # (B, H, W)
        log_probs = keras.ops.log_softmax(logits, axis=-1)  # (B, H, W, C)
        one_hot = keras.ops.one_hot(labels, len(self.weights), dtype=log_probs.dtype)
        weights = keras.ops.convert_to_tensor(self.weights, dtype=log_probs.dtype)
        per_pixel = -keras.ops.sum(one_hot * log_probs * weights, axis=-1)  # (B, H, W)
        return keras.ops.mean(per_pixel)


def per_sample_iou(y_true, logits, num_classes: int):
    """(B, C) IoU of each class in each sample; a class absent from both prediction and label counts as 1."""
    pred = keras.ops.argmax(logits, axis=-1)
    labels = keras.ops.cast(y_true, pred.dtype)
    pred_1h = keras.ops.one_hot(keras.ops.reshape(pred, (keras.ops.shape(pred)[0], -1)), num_classes)
    true_1h = keras.ops.one_hot(keras.ops.reshape(labels, (keras.ops.shape(labels)[0], -1)), num_classes)
    tp = keras.ops.sum(pred_1h * true_1h, axis=1)  # (B, C)
    union = keras.ops.sum(keras.ops.maximum(pred_1h, true_1h), axis=1)  # tp + fp + fn
    return keras.ops.where(union > 0, tp / keras.ops.maximum(union, 1.0), keras.ops.ones_like(tp))


class MeanIoU:
    """The reference's score: per sample, the mean over classes of tp / (tp + fp + fn), averaged
    over samples. Sums are [samples, sum of per-sample IoU, sum of each class's IoU ...], so
    they add across batches and ranks."""

    name = "iou"
    mlperf_key = "eval_accuracy"
    higher_is_better = True

    def __init__(self, num_classes: int = len(CLASSES)):
        self.num_classes = num_classes

    def batch_sums(self, y_true, logits):
        iou = per_sample_iou(y_true, logits, self.num_classes)  # (B, C)
        count = keras.ops.cast(keras.ops.shape(iou)[0], "float32")
        per_class = keras.ops.cast(keras.ops.sum(iou, axis=0), "float32")
        total = keras.ops.sum(per_class) / self.num_classes
        return keras.ops.concatenate([keras.ops.reshape(count, (1,)), keras.ops.reshape(total, (1,)), per_class])

    def result(self, sums) -> float:
        sums = np.asarray(sums, dtype=np.float64)
        return float(sums[1] / sums[0])

    def details(self, sums) -> dict:
        """IoU of each class (absent-from-both counted as 1, as in the total)."""
        sums = np.asarray(sums, dtype=np.float64)
        names = CLASSES if len(sums) - 2 == len(CLASSES) else range(len(sums) - 2)
        return {f"iou_{n}": float(v / sums[0]) for n, v in zip(names, sums[2:])}
