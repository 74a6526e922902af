"""Two real Horovod ranks stay in sync and match one process training on the union of their data."""
import numpy as np
import pytest

from tests.conftest import REPO, horovodrun, show

pytestmark = pytest.mark.slow


def _weights(npz, prefix):
    return [npz[k] for k in sorted((k for k in npz.files if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The directory of one Horovod job of 2 ranks that trained CosmoFlow (rank<r>.npz), then DeepCAM
    (deepcam_rank<r>.npz): hvd_sync_worker.py."""
    out = tmp_path_factory.mktemp("sync")
    # 600 s: the two kinds once had a 300 s job each, which a loaded 2-core host needs.
    proc = horovodrun(2, [REPO / "tests/integration/hvd_sync_worker.py", out], timeout=600)
    assert proc.returncode == 0, show(proc)
    return out


def test_two_ranks_identical_and_equal_to_single_process_on_union(trained):
    r0, r1 = (np.load(trained / f"rank{r}.npz") for r in (0, 1))
    # Broadcast: rank 1 started from rank 0's weights although its own seed differed.
    for a, b in zip(_weights(r0, "initial"), _weights(r1, "initial")):
        np.testing.assert_array_equal(a, b)
    # Different data per rank, yet identical weights after the steps.
    assert not np.allclose(r0["xs"], r1["xs"])
    for a, b in zip(_weights(r0, "final"), _weights(r1, "final")):
        np.testing.assert_array_equal(a, b)
    # Each layer's update equals that of one process stepping on the union of both ranks' batches,
    # up to float32 rounding (batches of 2 and of 4 sum in different orders).
    for initial, got, want in zip(_weights(r0, "initial"), _weights(r0, "final"), _weights(r0, "reference")):
        update, expected = got - initial, want - initial
        assert np.linalg.norm(expected) > 0, "training did not change the weights"
        error = np.linalg.norm(update - expected) / np.linalg.norm(expected)
        assert error < 1e-3, f"update of a {initial.shape} tensor differs by {error:.2e} (relative)"


def test_two_deepcam_ranks_keep_identical_weights(trained):
    """DeepLabv3+ (batch norm, the suite's LAMB of deepcam/lamb.py, weighted cross-entropy): broadcast, then
    identical after every step."""
    r0, r1 = (np.load(trained / f"deepcam_rank{r}.npz") for r in (0, 1))
    assert not np.allclose(r0["xs"], r1["xs"])
    initial0, initial1 = _weights(r0, "initial"), _weights(r1, "initial")
    final0, final1 = _weights(r0, "final"), _weights(r1, "final")
    assert len(final0) > 100  # every trainable tensor of the network, not a subset
    for a, b in zip(initial0, initial1):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(final0, final1):
        np.testing.assert_array_equal(a, b)
    changed = sum(not np.array_equal(a, b) for a, b in zip(initial0, final0))
    assert changed == len(final0), f"only {changed} of {len(final0)} tensors changed in training"
