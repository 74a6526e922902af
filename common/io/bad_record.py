"""The record behind a failed read: each application's `read_error` reads this rank's record files again, one
record at a time, and names the first bad one (file, record number, what is wrong) in its BenchError. Only a
failed run loads this module."""
from __future__ import annotations

from typing import Callable, Sequence

from common.base.errors import BenchError


def first_line(text: str, default: str = "") -> str:
    return (str(text).strip().splitlines() or [default])[0]


def first_bad_record(paths: Sequence[str], compression: str, features: dict, expected: str,
                     wrong_size: Callable[[dict], str | None]) -> str | None:
    """The first problem in the TFRecord files `paths` (`compression`: the manifest's, "none" or "gzip"): a bad
    frame or CRC, a record that is no tf.train.Example or not `expected` (parsed with `features`), or one for which
    `wrong_size(example)` says what is wrong; None when every record is intact."""
    import tensorflow as tf
    for path in paths:
        good = 0  # records read intact so far; the next one is the culprit
        try:
            for record in tf.data.TFRecordDataset(path, compression_type="GZIP" if compression == "gzip" else ""):
                problem = wrong_size(tf.io.parse_single_example(record, features))
                if problem:
                    return f"{path}: record {good} {problem}"
                good += 1
        except tf.errors.DataLossError as loss:
            return (f"{path}: corrupt or truncated TFRecord at record {good} (bad length or CRC: "
                    f"{first_line(loss.message)}); the file no longer matches its xxh3-128 in the manifest "
                    f"(data.verify_checksums=true finds such files up front): reconvert it")
        except tf.errors.InvalidArgumentError as bad:
            return f"{path}: record {good} is not {expected} ({first_line(bad.message)})"
        except UnicodeDecodeError:  # TensorFlow quotes a payload that is no Example in its error, undecodable
            return (f"{path}: record {good} is not a tf.train.Example (its bytes do not parse as one); expected "
                    f"{expected}")
    return None


def read_failure(benchmark: str, err: Exception, paths: Sequence[str], rank: int, problem: str | None) -> BenchError:
    """The BenchError of a failed read: the bad record `problem` when one was found, else the read's own error."""
    if problem:
        return BenchError(problem)
    return BenchError(f"reading the {benchmark} records failed ({first_line(str(err), type(err).__name__)}); "
                      f"every record of the {len(paths)} files rank {rank} reads is intact and of the expected size")
