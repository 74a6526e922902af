"""Data on disk: each format's contract (formats/), TFRecord framing and DALI indexes (tfrecord.py) with
hardware CRC32C (crc.py), the manifest, packing, staging to node-local storage and its copier (pycopy.py),
sharding, loader choice, Datasets and I/O counters. Imports only common.base."""
