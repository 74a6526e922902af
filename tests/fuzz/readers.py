"""The readers the fuzz tests call in an isolated worker process (harness.Isolated), each returning a small
picklable summary of what it read, for the tests to compare with what the intact file gives.

Only light imports at module level: the worker process imports this module to unpickle the calls.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
from pathlib import Path

import numpy as np


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------- HDF5: CosmoFlow universes
def cosmo_universe(path: str, sample_size: int, training: bool) -> dict:
    """What cosmo-convert reads of one universe: the checks of `inspect_universe` and `make_plan`, the
    sub-cubes, and for a training universe the statistics."""
    from data_prep import cosmo_convert
    path = Path(path)
    universe = cosmo_convert.inspect_universe(path)
    args = argparse.Namespace(sample_size=sample_size, val_fraction=0.0, val_universes=0, input=path.parent, seed=0,
                              out=path.parent / "out", compression="none", gzip_level=6)
    cosmo_convert.make_plan(args, [universe])  # the size must be a multiple of the sample size
    cubes = list(cosmo_convert.iter_subcubes(path, sample_size))
    summary = {"size": universe.size, "target": universe.target, "cubes": len(cubes), "digest": _digest(cubes),
               "shapes": sorted({c.shape for c in cubes}), "dtypes": sorted({c.dtype.str for c in cubes}),
               "min": min((int(c.min()) for c in cubes), default=None)}
    if training:
        summary["moments"] = cosmo_convert.log1p_moments(path).tolist()
    return summary


# ---------------------------------------------------------------------------- HDF5: DeepCAM snapshots and stats
def deepcam_snapshot(path: str) -> dict:
    """What deepcam-convert reads of one snapshot: its (H, W) and then its checked fields and labels."""
    from data_prep import deepcam_convert
    path = Path(path)
    shape = deepcam_convert.image_shape_of(path)
    fields, labels = deepcam_convert.read_sample(path, shape, path)
    return {"shape": tuple(shape), "fields": (fields.shape, fields.dtype.str), "labels": (labels.shape,
            labels.dtype.str), "digest": _digest([fields, labels]), "finite": bool(np.isfinite(fields).all()),
            "classes": sorted(int(c) for c in np.unique(labels))}


def deepcam_stats(path: str) -> dict:
    """What the DeepCAM loader reads of stats.h5: the statistics and both normalisations' constants."""
    from common.base.errors import BenchError
    from common.io.formats.deepcam import read_stats
    from deepcam.data import normalization_constants
    stats = read_stats(path)
    summary = {"digest": _digest([stats[k] for k in sorted(stats)])}
    for kind in ("minmax", "meanstd"):
        try:
            shift, divisor = normalization_constants(stats, kind, path)
        except BenchError as err:
            summary[kind] = f"BenchError: {err}"
            continue
        summary[kind] = {"finite": bool(np.isfinite(shift).all() and np.isfinite(divisor).all()),
                         "positive": bool((divisor > 0).all())}
    return summary


# ---------------------------------------------------------------------------- TFRecords through the applications
BATCH = 2


def quiet_tensorflow() -> None:
    """Worker initializer: no TensorFlow banner, one thread each (the fuzz runs beside other work)."""
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _app(app: str):
    if app == "cosmoflow":
        from cosmoflow import data
        from cosmoflow.config import CosmoDataConfig
        return data, CosmoDataConfig
    from deepcam import data
    from deepcam.config import DeepCamDataConfig
    return data, DeepCamDataConfig


class UndecodableError(Exception):
    """TensorFlow's UnicodeDecodeError for a record that is no Example, with the application's diagnosis."""


def _read_error(app: str):
    """The application's read_error as its run calls it (its App record's)."""
    return importlib.import_module(f"{app}.train").APP.read_error


def app_records(app: str, root: str, shape: tuple, loader: str, verify: bool) -> dict:
    """One epoch of both splits read through the application's pipeline (unshuffled), a read failure turned
    into the application's error as common/runtime/run.py does; a summary of the batches."""
    import tensorflow as tf
    from common.runtime.dist import DistEnv
    module, config = _app(app)
    cfg = config(dir=root, shuffle=False, loader=loader, verify_checksums=verify)
    dist = DistEnv()
    data = module.build_datasets(cfg, shape, BATCH, dist, seed=0)
    batches = []
    try:
        for dataset, steps in ((data.train, data.train_steps), (data.val, data.val_steps)):
            batch_iter = iter(dataset)
            for _ in range(steps):
                batches += [np.asarray(t) for t in next(batch_iter)]
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.InternalError) as err:
        raise _read_error(app)(cfg, BATCH, dist, err) from None
    except UnicodeDecodeError as err:
        # What TensorFlow raises for a well-framed record that is no Example: its error message quotes the
        # payload and cannot be decoded (common/runtime/run.py `reading_as` catches it too: docs/fuzzing.md); counted
        # apart, as in the campaign's table.
        raise UndecodableError(_read_error(app)(cfg, BATCH, dist, err)) from None
    summary = {"loader": data.loader, "digest": _digest(batches), "finite": all(np.isfinite(b).all() for b in
                                                                                   batches if b.dtype.kind == "f")}
    if app == "deepcam":
        summary["classes"] = sorted({int(c) for b in batches if b.dtype.kind == "i" for c in np.unique(b)})
    return summary


def _feature(spec, intact):
    """A feature value for serialize_example from a spec: "keep", ("bytes", n), ("floats", n), ("ints", n)."""
    if spec == "keep":
        return intact
    kind, n = spec
    if kind == "bytes":
        return bytes(range(256)) * (n // 256) + bytes(n % 256)
    return np.full(n, 0.5, np.float32) if kind == "floats" else np.full(n, 1, np.int64)


def _bad_values(app: str, name: str, value):
    """The same size and type with values no converter writes: negative counts, NaN, a class id of 7."""
    from common.io.formats import cosmoflow as cosmo_format
    from common.io.formats import deepcam as deepcam_format
    if isinstance(value, bytes):
        dtype, bad = {cosmo_format.SAMPLE_KEY: (cosmo_format.STORED_SAMPLE_DTYPE, -5),
                      deepcam_format.SAMPLE_KEY: (deepcam_format.STORED_SAMPLE_DTYPE, np.nan),
                      deepcam_format.TARGET_KEY: (deepcam_format.STORED_TARGET_DTYPE, 7)}[name]
        array = np.frombuffer(value, dtype).copy()
        array[len(array) // 2] = bad
        return array.tobytes()
    array = np.array(value, np.float32)
    array[0] = np.nan
    return array


def replace_record(app: str, root: str, rel: str, number: int, spec) -> None:
    """Rewrite record file `rel` of dataset `root` with record `number` replaced as `spec` says, properly
    framed, with a new index and the manifest entry updated: a file whose framing and checksums are all
    right, holding one record that is not what the loader expects.

    spec: {"raw": bytes} for a payload that is not an Example, else feature name -> "keep", "drop", "values"
    (bad values of the right size), or a _feature spec; extra names are added as features.
    """
    import tensorflow as tf
    from common.io.manifest import load_manifest
    from common.io.manifest_write import write_manifest
    from common.io.tfrecord import read_records
    from data_prep import tfrecords
    root_path = Path(root)
    manifest = load_manifest(root_path)
    records = [frame.payload for frame in read_records(root_path / rel, manifest.compression)]
    if "raw" in spec:
        records[number] = spec["raw"]
    else:
        example = tf.train.Example.FromString(records[number])
        intact = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            values = list(getattr(feature, kind).value)
            intact[name] = values[0] if kind == "bytes_list" else np.array(values, np.float32)
        features = {}
        for name in sorted(set(intact) | set(spec)):
            choice = spec.get(name, "keep")
            if choice == "drop":
                continue
            features[name] = (_bad_values(app, name, intact[name]) if choice == "values"
                              else _feature(choice, intact.get(name, b"extra")))
        records[number] = tfrecords.serialize_example(features)
    target = root_path / rel
    written = tfrecords.write_record_file(target, records, manifest.compression)
    entry = tfrecords.file_entry(written, root_path)
    obj = manifest.to_dict()
    for split in obj["splits"].values():
        split["files"] = [dataclasses.asdict(entry) if f["path"] == rel else f for f in split["files"]]
    write_manifest(obj, root_path)
