"""Point labels of the submission figures: none overlaps another, on log axes with tens of points."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common.campaign.analysis import labels  # noqa: E402


def _overlaps(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]


def test_thirty_clustered_points_on_log_axes_get_labels_that_do_not_overlap():
    rng = np.random.default_rng(3)
    xs = 2.0 ** rng.integers(4, 12, 30)
    ys = 10 ** rng.uniform(0.5, 1.2, 30)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.scatter(xs, ys)
    names = [f"Submitter{i} system_n{int(x)}" for i, x in enumerate(xs)]
    notes = labels.place(ax, xs, ys, names)
    assert len(notes) == 30
    fig.canvas.draw()
    boxes = labels.boxes(notes, fig.canvas.get_renderer())
    assert not _overlaps(boxes)
    texts = {n.get_text() for n in notes}
    listed = [t for t in ax.texts if t not in notes]
    # every name is either at its point or in the list below the axes (numbered at the point)
    for name in names:
        assert name in texts or any(name in t.get_text() for t in listed), name
    plt.close(fig)


def test_a_few_points_all_get_their_own_label_beside_them():
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = [1, 2, 4], [3.0, 3.1, 2.9]
    ax.scatter(xs, ys)
    ax.set_xlim(0.5, 5)
    ax.set_ylim(2, 4)
    notes = labels.place(ax, xs, ys, ["a", "b", "c"])
    assert [n.get_text() for n in notes] == ["a", "b", "c"]
    plt.close(fig)
