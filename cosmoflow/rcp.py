"""CosmoFlow's reference convergence points: `with_rcp(cfg, global_batch)` gives the config the hyperparameters of a
reference convergence point (`optimizer.rcp=cosmoflow_ref_128`). The RCP keys carry the reference's meanings
(mlcommons/hpc cosmoflow/utils/optimizers.py): `opt_base_learning_rate` is the scaled rate warm-up reaches (our
peak) and `opt_learning_rate_warmup_factor` the scaling factor, so our unscaled `base_lr` is their quotient and
`base_batch_size` the global batch over the factor. Where an RCP gives one decay factor for several boundaries, the
k-th boundary (1-based) gets the factor to the k-th power: every RCP that lists its factors follows that rule
([0.25, 0.0625], [0.5, 0.25, 0.125, 0.0625]).
"""
from __future__ import annotations

import dataclasses

from common.base.errors import BenchError
from common.base.rcp import Rcp, requested_rcp
from cosmoflow.config import CosmoConfig


def with_rcp(cfg: CosmoConfig, global_batch: int) -> CosmoConfig:
    """`cfg` with every hyperparameter of `optimizer.rcp` (unchanged when it names none); refuses a
    global batch other than the RCP's."""
    rcp = requested_rcp(cfg, "cosmoflow", global_batch)
    if rcp is None:
        return cfg
    if str(rcp.value("opt_name")).lower() != "sgd":
        raise BenchError(f"optimizer.rcp={rcp.name}: opt_name {rcp.value('opt_name')!r}, CosmoFlow trains with SGD")
    factor = float(rcp.value("opt_learning_rate_warmup_factor"))
    optimizer = dataclasses.replace(cfg.optimizer, base_lr=float(rcp.value("opt_base_learning_rate")) / factor,
                                    base_batch_size=_base_batch(rcp, factor),
                                    weight_decay=float(rcp.value("opt_weight_decay")))
    boundaries = tuple(int(b) for b in rcp.value("opt_learning_rate_decay_boundary_epochs"))
    schedule = dataclasses.replace(cfg.schedule, warmup_epochs=int(rcp.value("opt_learning_rate_warmup_epochs")),
                                   decay_epochs=boundaries, decay_factors=_factors(rcp, len(boundaries)),
                                   granularity="epoch")
    model = dataclasses.replace(cfg.model, dropout=float(rcp.value("dropout")))
    return dataclasses.replace(cfg, optimizer=optimizer, schedule=schedule, model=model)


def _base_batch(rcp: Rcp, factor: float) -> int:
    base = rcp.global_batch_size / factor
    if factor <= 0 or base != int(base):
        raise BenchError(f"optimizer.rcp={rcp.name}: warm-up factor {factor} does not divide its global batch "
                         f"{rcp.global_batch_size} into a whole base batch size")
    return int(base)


def _factors(rcp: Rcp, boundaries: int) -> tuple[float, ...]:
    factors = rcp.value("opt_learning_rate_decay_factor")
    if isinstance(factors, list):
        if len(factors) != boundaries:
            raise BenchError(f"optimizer.rcp={rcp.name}: {len(factors)} decay factors for {boundaries} boundaries")
        return tuple(float(f) for f in factors)
    return tuple(float(factors) ** k for k in range(1, boundaries + 1))
