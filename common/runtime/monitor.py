"""What a run measures besides its MLPerf events: summary.json's `system` object and TensorBoard.

    monitor = RunMonitor(cfg, dist)
    monitor.prepare()        # before run_start: the node's peak (probed once per host, cached)
    monitor.started()        # at run_start: energy counters
    ... a callback of the loop: the phase clock at its start, the window and TensorBoard after every step
    and every evaluation
    monitor.stopped()        # at run_stop: energy counters
    figures = monitor.system_figures(result, model, samples_per_second)   # collective
    monitor.close(figures)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from common.runtime import energy, probe, system
from common.runtime.dist import DistEnv
from common.runtime.flops import training_gflop_per_sample
from common.runtime.loop import Callback, Loop
from common.runtime.tensorboard import EventWriter


class RunMonitor(Callback):
    """This rank's measurements of one run."""

    def __init__(self, cfg: Any, dist: DistEnv):
        out = Path(cfg.run.output_dir)
        self.cfg, self.dist = cfg.system, dist
        steps = cfg.system.window_steps if cfg.system.enabled and not cfg.dist.elastic.enabled else 0
        self.window = system.StepWindow(cfg.system.warmup_steps, steps)
        self.elastic = cfg.dist.elastic.enabled
        self.energy = energy.EnergyMeter(dist)
        self.readings: tuple | None = None
        self.board = EventWriter(out, cfg.tensorboard.every_steps) if cfg.tensorboard.enabled and dist.is_root \
            else None
        self.peak: dict | None = None
        self.peak_reason = ""
        self.last_step = self.last_done = 0
        self.last_totals: dict = {}

    def prepare(self) -> None:
        """Rank 0 reads (or, with system.probe, measures once) its node's peak; nodes are taken as alike."""
        if not (self.cfg.enabled and self.dist.is_root):
            return
        cached = probe.cached()
        if cached is None and not self.cfg.probe:
            self.peak_reason = (f"no probe of this host in {probe.cache_path()} and system.probe=false: run "
                                f"python -m common.runtime.probe")
            return
        self.peak = cached or probe.probe()

    def started(self) -> None:
        if self.cfg.enabled:
            self.energy.start()

    def stopped(self) -> None:
        if self.cfg.enabled:
            self.readings = self.energy.stop()

    def start(self, loop: Loop) -> None:
        """The phase clock of the steps the loop is about to train (None: steps that keep none)."""
        self.window.attach(loop.steps.clock)

    def after_step(self, loop: Loop) -> None:
        """`boundary`: an epoch's end or an evaluation follows, which the window does not time."""
        every, step = loop.options.eval_every_steps, loop.global_step
        boundary = loop.step == loop.data.train_steps or bool(every and step % every == 0)
        self.window.tick(loop.done, boundary, loop.totals)
        self.last_step, self.last_done, self.last_totals = step, loop.done, loop.totals  # the loop's, kept current
        if self.board:
            self.board.train(step, loop.running)

    def evaluated(self, loop: Loop, record: dict) -> None:
        if self.board:
            self.board.evaluation(record["step"], record)

    def system_figures(self, dist: DistEnv, history: list[dict], model: Any,
                       samples_per_second: float | None) -> dict | None:
        """summary.json's `system` (on rank 0; a collective on every rank of `dist`, the run's layout now);
        None when system.enabled is off."""
        if not self.cfg.enabled:
            return None
        self.dist = dist  # an elastic run's layout now
        self.window.finish(self.last_done, self.last_totals)  # a run that ended inside the window
        rss = self.dist.gather_object(system.peak_rss_mb())
        gpu = self.dist.gather_object(system.gpu_peak_mb(self.dist))
        readings = self.dist.gather_object(self.readings or (None, None, "energy counters not read"))
        collectives = self._collectives(model)
        if not self.dist.is_root:
            return None
        return self._figures(history, model, samples_per_second, rss, gpu, readings, collectives)

    def _figures(self, history, model, samples_per_second, rss, gpu, readings, collectives: dict) -> dict:
        joules, source, reason = energy.job_energy(readings)
        trained = system.samples_trained(history)
        figures = {"peak": system.describe_peak(self.peak),
                   **system.flops_figures(training_gflop_per_sample(model), samples_per_second, self.peak,
                                          self.dist.num_nodes),
                   "input_wait_share": system.input_wait_share(history),
                   "peak_rss_mb": rss, "gpu_peak_memory_mb": gpu if self.dist.gpu else None,
                   "energy_joules": joules, "energy_source": source or None,
                   "energy_j_per_sample": joules / trained if joules is not None and trained else None,
                   **collectives}
        figures["reasons"] = _reasons(figures, self.peak_reason, reason, self._window_reason())
        return figures

    def _collectives(self, model: Any) -> dict:
        """The window's figures on rank 0 (a collective: every rank's window is gathered, and with more than one
        rank the gradients' allreduce is timed on its own)."""
        w = self.window.window if self.window.closed else None
        timed = w is not None and w.steps > 0
        exchanged = self.dist.horovod and self.dist.size > 1
        none = None if exchanged else 0.0  # one rank: nothing to wait for or exchange
        figures = {"allreduce_share": none, "allreduce_wait_share": none, "allreduce_gb_per_s": None,
                   "allreduce_bytes_per_step": none}
        if not timed:  # the same on every rank (their windows close at the same steps): no collective to match
            return figures | {"step_breakdown": None, "window": None}
        blocked = w.phases.get("allreduce", 0.0)
        breakdown = system.step_breakdown(w.totals, w.seconds, blocked)
        ranks = self.dist.gather_object(((blocked, w.seconds), breakdown))
        exchange = system.exchange_timing(self.dist, model.trainable_variables) if exchanged else None
        if not self.dist.is_root:
            return {}
        if exchange:
            figures = system.collective_figures([r[0] for r in ranks], w.steps, exchange)
        return figures | {"step_breakdown": system.mean_shares([r[1] for r in ranks]),
                          "window": {"first_step": w.first_step, "steps": w.steps, "seconds": w.seconds,
                                     "exchange": exchange}}

    def _window_reason(self) -> str:
        if self.dist.size == 1 or not self.dist.horovod:
            return "one rank: no allreduce"
        if self.window.closed and self.window.window.steps:
            return ("the gradients' allreduce on its own took no longer than a one-element one: too small to "
                    "time beside Horovod's coordination")
        if self.elastic:
            return "elastic runs record no window of steps (their ranks may change inside it)"
        if self.cfg.window_steps == 0:
            return "system.window_steps is 0"
        return f"the run trained fewer than system.warmup_steps + 1 = {self.cfg.warmup_steps + 1} steps"

    def close(self, figures: dict | None) -> None:
        if self.board:
            if figures:
                self.board.system(self.last_step, figures)
            self.board.close()


def _reasons(figures: dict, peak_reason: str, energy_reason: str, window_reason: str) -> dict:
    """Why each null figure is null."""
    why = {"fraction_of_peak": peak_reason or "no peak probe", "energy_j_per_sample": energy_reason,
           "allreduce_share": window_reason, "allreduce_gb_per_s": window_reason, "step_breakdown": window_reason,
           "gpu_peak_memory_mb": "no GPU", "sustained_gflops": "no steady samples/s"}
    return {k: v for k, v in why.items() if figures.get(k) is None and v}
