"""The Mesh-TF 0.1.21 shim: makes `import mesh_tensorflow` work, is idempotent, patches only the two names.

Checked in a fresh interpreter, since this pytest process may already have applied the shim.
"""
import json
import sys

import pytest

from tests.conftest import run_cmd, show

# Records what the shim changes, in a fresh interpreter, as JSON on the last line of stdout.
PROBE = r"""
import json, sys
import tensorflow as tf
from tensorflow.python.framework import ops, tensor_conversion_registry
try:
    import mesh_tensorflow
    bare_import = "ok"
except ImportError as err:
    bare_import = str(err)
for name in [m for m in sys.modules if m.startswith("mesh_tensorflow")]:
    del sys.modules[name]  # forget the half-imported package
modules, ops_names = set(sys.modules), set(dir(ops))
train_names = set(dir(tf.compat.v1.train))
from cosmoflow.mesh import shim
first = shim.apply_shim()
new_modules = sorted(m for m in set(sys.modules) - modules if m != "cosmoflow.mesh.shim" and m != "cosmoflow.mesh"
                     and m != "cosmoflow")
new_ops_names = sorted(set(dir(ops)) - ops_names)
second = shim.apply_shim()
mtf = shim.import_mtf()
estimator = sys.modules[shim.ESTIMATOR_MODULE]
print(json.dumps({
    "bare_import": bare_import, "first": first, "second": second, "new_modules": new_modules,
    "new_ops_names": new_ops_names,
    "conversion_is_registry": ops.register_tensor_conversion_function
                              is tensor_conversion_registry.register_tensor_conversion_function,
    "estimator_names": sorted(n for n in vars(estimator) if not n.startswith("__")),
    "estimator_are_train": all(getattr(estimator, n) is getattr(tf.compat.v1.train, n) for n in shim.ESTIMATOR_NAMES),
    "train_unchanged": set(dir(tf.compat.v1.train)) == train_names,
    "mtf_name": mtf.__name__, "has_conv3d_with_blocks": hasattr(mtf.layers, "conv3d_with_blocks"),
    "third": shim.apply_shim(),
}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    proc = run_cmd([sys.executable, "-c", PROBE], timeout=120)
    assert proc.returncode == 0, show(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mesh_tensorflow_needs_the_shim_and_imports_with_it(probe):
    assert "estimator" in probe["bare_import"]  # TF 2.18 without the shim: tf.compat.v1.estimator is gone
    assert probe["mtf_name"] == "mesh_tensorflow" and probe["has_conv3d_with_blocks"]


def test_patches_exactly_the_two_names_of_stack_md(probe):
    assert probe["first"] == ["tensorflow.python.framework.ops.register_tensor_conversion_function",
                              "tensorflow.compat.v1.estimator"]
    assert probe["new_modules"] == ["tensorflow.compat.v1.estimator"]
    assert probe["new_ops_names"] == ["register_tensor_conversion_function"]
    assert probe["conversion_is_registry"]
    assert probe["estimator_names"] == ["CheckpointSaverListener", "SessionRunHook"]
    assert probe["estimator_are_train"] and probe["train_unchanged"]


def test_idempotent(probe):
    assert probe["second"] == [] and probe["third"] == []
