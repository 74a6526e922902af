"""The loop's callbacks for fault handling and evaluation (common/runtime/loop.py's `Callback`):

- `Checkpoints`: resuming from a checkpoint (checkpoint.py `resume_loop`; docs/faults.md), periodic checkpoints
  (checkpoint.every_epochs, every_minutes) and the one of the weights that met the target;
- `EvalEverySteps`: train.eval_every_steps > 0: evaluate every this many optimizer steps, inside epochs too;
- `StopSignal`: after every step, whether a stop signal arrived on any rank (read from the step's allreduce, or
  agreed in a collective of its own); if so, a checkpoint of the step (checkpoint.on_signal) and the run ends.
The monitors (common/runtime/monitor.py) and elastic commits (common/runtime/elastic.py) are callbacks too.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

from common.io.input import InputPlan
from common.runtime.loop import Callback, Loop
from common.runtime.config import CheckpointConfig
from common.runtime.summary import RUN_ABORTED, RUN_SUCCESS, Progress
from common.runtime.dist import StopRequests

if TYPE_CHECKING:  # checkpoint.py is imported only by a run that writes or reads a checkpoint
    from common.runtime.checkpoint import Checkpointer, Meta


class EvalEverySteps(Callback):
    """Evaluate every `every` optimizer steps (counted over epochs); the target met ends the epoch."""

    def __init__(self, every: int):
        self.every = every

    def after_step(self, loop: Loop) -> None:
        last = loop.step == loop.data.train_steps and loop.epoch == loop.options.max_epochs
        if loop.global_step % self.every or last:  # the run's last step: the epoch's end evaluates
            return
        if loop.evaluate(loop.running):
            loop.end_epoch = True


class Checkpoints(Callback):
    """The run's checkpoints: the one it resumes from (at the start), then those on the schedule of the checkpoint
    section, each with this attempt's time and number."""

    def __init__(self, cfg: CheckpointConfig, writer: Callable[[], Checkpointer], input_state: bool,
                 run_start: float, resume: Meta | None = None, plan: InputPlan | None = None):
        """`writer` makes the Checkpointer when the first checkpoint is written (a run that writes none never
        imports checkpoint.py for it); `input_state`: save each rank's tf.data iterator; `run_start`: time.time()
        at this attempt's start; `resume`: the checkpoint to continue from, and `plan` (checkpoint.plan_input) how
        the input reaches its position."""
        self.cfg, self.writer, self.input_state, self.run_start = cfg, writer, input_state, run_start
        self.resume, self.plan = resume, plan
        self.checkpointer: Checkpointer | None = None
        self.attempt = Progress()  # where this attempt began: its number and the earlier attempts' seconds
        self.last_time = time.monotonic()  # of the last checkpoint (every_minutes)

    def due(self, epoch: int) -> bool:
        """Whether the end of `epoch` is a periodic checkpoint (every_epochs, or every_minutes since the last)."""
        by_epochs = self.cfg.every_epochs and epoch % self.cfg.every_epochs == 0
        by_time = self.cfg.every_minutes and time.monotonic() - self.last_time >= 60 * self.cfg.every_minutes
        return bool(by_epochs or by_time)

    def start(self, loop: Loop) -> None:
        if self.resume is not None:
            from common.runtime.checkpoint import resume_loop
            resume_loop(loop, self.resume, self.plan)
        self.attempt = loop.start

    def after_epoch(self, loop: Loop) -> None:
        if self.due(loop.epoch):
            self.save(loop, Progress(loop.epoch + 1, 0, loop.history))

    def keep_trained(self, loop: Loop) -> str:
        """After run_stop (run.py `Run.keep_trained`), in a run that met its target: save the weights that met it
        (collective; no input state, nothing is to resume): at the epoch's end, the checkpoint of that end;
        inside the epoch, one of the step reached. `python -m common.export` then exports the model that met
        the target (docs/export.md). Returns the checkpoint's path."""
        if loop.step == loop.data.train_steps:
            return self.save(loop, Progress(loop.epoch + 1, 0, loop.history), input_state=False)
        return self.save(loop, Progress(loop.epoch, loop.step, loop.history, loop.partial()), input_state=False)

    def save(self, loop: Loop, progress: Progress, input_state: bool | None = None) -> str:
        """Checkpoint `progress` (collective), with each rank's input state unless `input_state` is False (None:
        the callback's setting); returns its path."""
        progress = dataclasses.replace(progress, earlier_seconds=self.attempt.earlier_seconds + time.time()
                                       - self.run_start, attempt=self.attempt.attempt, history=list(progress.history))
        step = progress.global_step(loop.data.train_steps)
        self.checkpointer = self.checkpointer or self.writer()
        path = self.checkpointer.save(progress, step, loop.trainee.model, loop.trainee.optimizer, loop.train_iter,
                                      self.input_state if input_state is None else input_state)
        self.last_time = time.monotonic()
        return str(path)


def keep_trained(loop: Loop) -> str:
    """After run_stop: in a run that met its target, the weights that met it saved by its Checkpoints callback
    (checkpoint.keep_trained; collective); returns the checkpoint's path, "" when none is written."""
    checkpoints = next((c for c in loop.callbacks if isinstance(c, Checkpoints)), None)
    if checkpoints is None or loop.result.status != RUN_SUCCESS or not checkpoints.cfg.keep_trained:
        return ""
    return checkpoints.keep_trained(loop)


class StopSignal(Callback):
    """End the run after the step in which a stop signal arrived on any rank, with a checkpoint of that step
    when `checkpoints` is given (checkpoint.on_signal)."""

    def __init__(self, requests: StopRequests, checkpoints: Checkpoints | None):
        self.requests, self.checkpoints = requests, checkpoints

    def start(self, loop: Loop) -> None:
        self.requests.arm()  # a signal that arrived is allreduced with the next step's gradients

    def after_step(self, loop: Loop) -> None:
        if loop.end_epoch:
            return
        flag = loop.steps.stop
        if not (flag.stop_agreed() if flag is not None else self.requests.agreed_now(loop.dist) > 0):
            if loop.step < loop.data.train_steps:
                self.requests.arm()  # (after the epoch's last step: after_epoch arms, past its evaluation)
            return
        progress = Progress(loop.epoch, loop.step, loop.history, loop.partial())
        checkpoint = self.checkpoints.save(loop, progress) if self.checkpoints else ""
        done = loop.history[-1]["epoch"] if loop.history else 0
        where = f"after epoch {done}" if done else "in the first epoch"
        saved = f"; checkpoint {checkpoint}" if checkpoint else "; no checkpoint written (checkpoint.on_signal=false)"
        loop.finish(RUN_ABORTED, f"stopped by {self.requests.describe()} {where}{saved}", None, stopped=True,
                    checkpoint=checkpoint)

    def after_epoch(self, loop: Loop) -> None:
        self.requests.arm()
