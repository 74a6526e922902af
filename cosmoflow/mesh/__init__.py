"""CosmoFlow with Mesh-TensorFlow spatial partitioning: the import shim, the mesh model and the cluster set-up.

`shim.import_mtf()` is the only way this project imports mesh_tensorflow (0.1.21 needs two small
compatibility patches on TF >= 2.13); `model` expresses the CosmoFlow network over a device mesh with
the cube's depth/height split into blocks; `cluster` starts the TensorFlow servers that let one mesh
span several processes.
"""
