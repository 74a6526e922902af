"""The one place that makes mesh-tensorflow 0.1.21 importable on TensorFlow >= 2.13.

Mesh-TF 0.1.21 (archived upstream) needs two names that TensorFlow has since removed:
`tensorflow.compat.v1.estimator` (ops.py subclasses its `CheckpointSaverListener` and
`SessionRunHook`) and `tensorflow.python.framework.ops.register_tensor_conversion_function`
(tpu_variables.py). `apply_shim()` restores exactly these two, pointing at their current homes,
and nothing else; it is idempotent and leaves names that already exist alone. Nothing else in
the project may patch TensorFlow: import Mesh-TF through `import_mtf()`.
"""
from __future__ import annotations

import sys
import types
from typing import Any

ESTIMATOR_MODULE = "tensorflow.compat.v1.estimator"
CONVERSION_FUNCTION = "register_tensor_conversion_function"
# The estimator names that mesh_tensorflow/ops.py uses, all still in tf.compat.v1.train.
ESTIMATOR_NAMES = ("CheckpointSaverListener", "SessionRunHook")


def apply_shim() -> list[str]:
    """Restore the two names Mesh-TF 0.1.21 needs; returns what was patched (empty when nothing was)."""
    patched = []
    if _patch_conversion_function():
        patched.append(f"tensorflow.python.framework.ops.{CONVERSION_FUNCTION}")
    if _register_estimator_module():
        patched.append(ESTIMATOR_MODULE)
    return patched


def import_mtf() -> Any:
    """`mesh_tensorflow`, imported after `apply_shim()`."""
    apply_shim()
    import mesh_tensorflow
    return mesh_tensorflow


def _patch_conversion_function() -> bool:
    from tensorflow.python.framework import ops, tensor_conversion_registry
    if hasattr(ops, CONVERSION_FUNCTION):
        return False
    setattr(ops, CONVERSION_FUNCTION, tensor_conversion_registry.register_tensor_conversion_function)
    return True


def _register_estimator_module() -> bool:
    # `from tensorflow.compat.v1 import estimator` falls back to sys.modules[ESTIMATOR_MODULE]
    # when the attribute is missing, so registering the module is enough.
    if ESTIMATOR_MODULE in sys.modules:
        return False
    import tensorflow as tf
    module = types.ModuleType(ESTIMATOR_MODULE, "Stand-in for the removed tf.compat.v1.estimator (Mesh-TF shim).")
    for name in ESTIMATOR_NAMES:
        setattr(module, name, getattr(tf.compat.v1.train, name))
    sys.modules[ESTIMATOR_MODULE] = module
    return True
