"""The on-disk formats of the converted datasets, one module each: the single owner of a format's contract
(FORMAT name and version, feature keys, sample and target dtypes and shapes, value ranges, auxiliary files), used
by its converter, both loaders (tf.data and DALI) and `python -m data_prep validate`. docs/formats.md describes
them for readers; the TFRecord framing around the records is common/io/tfrecord.py's.
"""

TRAIN, VALIDATION = "train", "validation"
SPLITS = (TRAIN, VALIDATION)  # every converted dataset has these two splits, each in its own directory
