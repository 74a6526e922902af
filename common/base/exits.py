"""The exit codes of every command of the suite: one meaning each (the README's "Exit codes" table).

A training's code comes from its result (`common/runtime/summary.exit_code`), a command's from what ended it
(`common/base/cli.guarded`).
"""
from __future__ import annotations

SUCCESS = 0
# a training ended (train.max_epochs) without meeting its quality target; a campaign has no valid score (too few
# of its runs met it)
TARGET_NOT_REACHED = 1
# bad input or config: the message names the file or key, the value and what was expected (data_prep validate:
# the dataset has findings)
BAD_INPUT = 2
NON_FINITE_LOSS = 3  # a training's loss became NaN or infinite
INTERNAL_ERROR = 4  # an unexpected exception: a one-line message, the traceback in a file it names
# a check the command runs failed: the MLPerf compliance checker refused a log, mlperf-logging's RCP checker a
# campaign (`campaign rcp-check`), or the exported model's outputs differ from the checkpoint's (`export --check`)
CHECKER_FAILED = 5
STOPPED = 75  # stopped by SIGTERM or SIGUSR1, or an instance job that gave up waiting for its shared start
# (EX_TEMPFAIL: resume later, from the checkpoint when there is one)

MEANINGS = {
    SUCCESS: "success (a training: its quality target reached)",
    TARGET_NOT_REACHED: "target not reached",
    BAD_INPUT: "bad input or config",
    NON_FINITE_LOSS: "non-finite loss",
    INTERNAL_ERROR: "internal error",
    CHECKER_FAILED: "a check failed (compliance checker, RCP checker, export --check)",
    STOPPED: "stopped by a signal",
}

