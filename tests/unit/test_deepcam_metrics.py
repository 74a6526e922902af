"""DeepCAM's loss and IoU (its optimizers and schedules: test_deepcam_optim.py)."""
import numpy as np
import pytest

from deepcam.model import MeanIoU, WeightedCrossEntropy, class_weights, per_sample_iou


def reference_iou(pred: np.ndarray, gt: np.ndarray, classes: int) -> float:
    """The MLPerf reference's score, written out with numpy loops: per sample, sum over classes of
    tp / (3 * (tp + fp + fn)) with 0/0 counted as 1/classes; then the mean over samples."""
    scores = []
    for p, g in zip(pred.reshape(len(pred), -1), gt.reshape(len(gt), -1)):
        total = 0.0
        for c in range(classes):
            tp = np.sum((p == c) & (g == c))
            fp = np.sum((p == c) & (g != c))
            fn = np.sum((p != c) & (g == c))
            union = (tp + fp + fn) * classes
            total += 1.0 / classes if union == 0 else tp / union
        scores.append(total)
    return float(np.mean(scores))


def logits_for(pred: np.ndarray, classes: int = 3) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[pred] * 5.0


def test_iou_matches_the_reference_formula():
    rng = np.random.default_rng(0)
    gt = rng.choice(3, size=(4, 8, 12), p=[0.8, 0.05, 0.15])
    pred = np.where(rng.random(gt.shape) < 0.8, gt, rng.integers(0, 3, gt.shape))
    gt[0] = 0  # a sample without events: absent classes count as IoU 1
    pred[0] = 0
    metric = MeanIoU(3)
    sums = np.asarray(metric.batch_sums(gt, logits_for(pred)))
    assert sums[0] == 4
    assert metric.result(sums) == pytest.approx(reference_iou(pred, gt, 3), abs=1e-6)
    assert metric.result(sums) > 0.0
    details = metric.details(sums)
    assert set(details) == {"iou_background", "iou_cyclone", "iou_river"}
    assert np.mean(list(details.values())) == pytest.approx(metric.result(sums), abs=1e-6)


def test_iou_sums_add_across_batches():
    rng = np.random.default_rng(1)
    gt = rng.integers(0, 3, (6, 4, 4))
    pred = rng.integers(0, 3, (6, 4, 4))
    metric = MeanIoU(3)
    parts = np.asarray(metric.batch_sums(gt[:2], logits_for(pred[:2]))) + \
        np.asarray(metric.batch_sums(gt[2:], logits_for(pred[2:])))
    assert metric.result(parts) == pytest.approx(reference_iou(pred, gt, 3), abs=1e-6)


def test_perfect_prediction_scores_one_and_absent_class_counts_one():
    gt = np.zeros((2, 4, 4), dtype=np.int32)
    gt[1, :2, :2] = 2
    iou = np.asarray(per_sample_iou(gt, logits_for(gt), 3))
    np.testing.assert_allclose(iou, np.ones((2, 3)))


def test_class_weights_follow_frequency_power():
    weights = class_weights((0.986, 0.0005, 0.0133), -0.125)
    assert weights[1] > weights[2] > weights[0]
    assert weights[1] == pytest.approx(0.0005 ** -0.125)
    with pytest.raises(ValueError, match="expected all > 0"):
        class_weights((0.5, 0.0, 0.5))


def test_weighted_cross_entropy_is_the_plain_mean_of_weighted_pixel_losses():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 3, 5, 3)).astype(np.float32)
    labels = rng.integers(0, 3, (2, 3, 5))
    weights = (1.0, 3.0, 2.0)
    got = float(WeightedCrossEntropy(weights)(labels, logits))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    want = np.mean(-picked * np.asarray(weights)[labels])
    assert got == pytest.approx(want, rel=1e-5)
