"""The one exception type for bad input and inconsistent configuration.

Entry points (train.py, `python -m data_prep`) catch `BenchError`, print its message as a
single paragraph without a traceback, and exit non-zero. Raise it with the facts: the file
or key, the value found and the value expected.
"""


class BenchError(Exception):
    """Bad input or configuration that the user must fix; carries a complete message."""
