"""Hyperparameter search over real trainings of either benchmark, with Optuna (docs/hpo.md).

    python -m common.hpo run SPACE.yaml --out hpo/cosmo-b8 [--trials 10] [--np 2] [--launcher TEMPLATE]
        [--python PATH] [--storage URL] [--stale-minutes 10] [--stage-dir DIR] [key=value ...]
    python -m common.hpo report hpo/cosmo-b8

`run` searches the space file's parameters (common/hpo/space.py) with a sampler (TPE or random) and a
median pruner fed each evaluation in the trials' MLPerf logs; the objective is what MLPerf scores, epochs
(or seconds) to the quality target, with a miss penalised. Trials start through the campaigns' launcher
template (default: this environment's horovodrun on localhost; a scheduler's launcher inside a job), one
after the other per worker; several workers (jobs, nodes) running the same command share the study
through its journal file (a batch job's worker: `python -m jobs render ... --hpo SPACE.yaml`, docs/hpo.md).
A killed worker's trial is run again; the command started again goes on where the study stood. `run` ends
with `report`: trials.csv, the best settings per global batch size as configs (OUT/best/), report.md and
its figures.
"""
