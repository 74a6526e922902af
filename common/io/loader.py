"""Which input pipeline reads a dataset: `data.loader` tfdata, dali, or auto.

`auto` picks DALI when its TensorFlow plugin imports and the records can be read by DALI's
TFRecord reader (uncompressed, with index files); otherwise tf.data. Both loaders give the same
tensors (tested), so the choice changes speed, not results; docs/performance.md has the figures.
"""
from __future__ import annotations

from typing import Collection, Sequence

from common.base.errors import BenchError
from common.io.manifest import MANIFEST_NAME, Manifest

LOADERS = ("auto", "tfdata", "dali")


def dali_problem(manifest: Manifest, splits: Sequence[str], files: Collection[str] | None = None) -> str | None:
    """Why DALI cannot read these splits of the dataset (only the paths in `files`, when given: what one rank
    reads), or None when it can."""
    where = manifest.root / MANIFEST_NAME
    if manifest.compression != "none":
        return (f"{where}: records are {manifest.compression}-compressed, but DALI's TFRecord reader needs "
                f"uncompressed records with index files; set data.loader=tfdata, stage them uncompressed "
                f"(data.stage_dir with data.stage_decompress=true), or convert with --compression none")
    missing = [e.path for s in splits for e in manifest.splits[s].files
               if e.index is None and (files is None or e.path in files)]
    if missing:
        return (f"{where}: {len(missing)} record file(s) have no DALI index (first: {missing[0]}); reconvert the "
                f"dataset or set data.loader=tfdata")
    return None


def checksums_wanted(setting: bool | None, loader: str) -> bool:
    """Whether a rank checks the checksums of the files it reads: data.verify_checksums, or when unset, for
    DALI (its reader checks no record CRC, and one changed byte in a record can kill the process)."""
    return loader == "dali" if setting is None else setting


def resolve_loader(requested: str, manifest: Manifest, splits: Sequence[str],
                   files: Collection[str] | None = None) -> str:
    """"tfdata" or "dali" for data.loader = `requested`; raises BenchError when DALI was asked for but cannot read
    (the `files` of the splits, when given)."""
    if requested not in LOADERS:
        raise BenchError(f"data.loader {requested!r}: expected one of {list(LOADERS)}")
    problem = dali_problem(manifest, splits, files) if requested != "tfdata" else None
    if requested == "dali" and problem:
        raise BenchError(problem)
    if requested == "auto":
        return "dali" if problem is None and dali_plugin_available() else "tfdata"
    return requested


def dali_plugin_available() -> bool:
    try:
        import nvidia.dali.plugin.tf  # noqa: F401
    except ImportError:
        return False
    return True
