"""WAIT: fluid-guided threshold admission with known output lengths (Ao, Luo, Simchi-Levi, Wang,
arXiv 2504.11320; docs/schedulers.md "wait", "nested_wait"), per instance, with collocated placement.

Prompt types are output-length bins (``output_bins``, tokens) of the workload's turns; a turn's type comes
from its output length as predicted by the :class:`~harness.policy.Predictor` (``predictor.sigma = 0``,
the default, is the paper's known-length setting). Thresholds ``n_j`` are the smallest integers with
``d0 + d1 M^pi <= n_j / lambda_j`` (``harness.fluid.wait_thresholds``). If the fluid model is unstable
for the configured load, every threshold is 1 (no batching) and the plan note says why.
See ``baselines.fluid_admission`` for the release rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from baselines.fluid_admission import ThresholdAdmission, check_knobs, instance_coefficients, prompt_types
from harness.fluid import wait_thresholds
from harness.policy import PolicyContext, Predictor, PredictorConfig, register


@dataclass
class WaitConfig:
    """output_bins: type boundaries on output tokens; max_wait_s: hold timeout (s);
    max_active: cap on an instance's running batch; margin: slack on the WAIT inequality."""

    name: str = "wait"
    output_bins: list[int] = field(default_factory=lambda: [64, 256, 1024])
    max_wait_s: float = 0.5
    max_active: int = 256
    margin: float = 0.0
    predictor: PredictorConfig = field(default_factory=PredictorConfig)


class Wait(ThresholdAdmission):
    """WAIT admission + sticky collocated placement."""

    name = "wait"


@register("wait", WaitConfig)
def make(cfg: WaitConfig, ctx: PolicyContext) -> Wait:
    edges = check_knobs(cfg.output_bins, cfg.max_wait_s)
    if not cfg.margin >= 0:
        raise ValueError(f"scheduler.margin must be >= 0, got {cfg.margin!r}")
    if cfg.max_active < 1:
        raise ValueError(f"scheduler.max_active must be >= 1, got {cfg.max_active!r}")
    pred = Predictor.from_config(ctx.truth, cfg.predictor)
    n_inst = len(ctx.cluster_roles)
    types, bins = prompt_types(ctx, edges, n_inst)  # a config problem (no arrival rate) is an error
    thresholds, notes = [], []
    for i in range(n_inst):
        try:
            d0, d1 = instance_coefficients(ctx, i)
            n, m_pi = wait_thresholds(types, d0, d1, ctx.kv_capacity_tokens[i], cfg.margin)
            thresholds.append({int(b): int(k) for b, k in zip(bins, n)})
            notes.append(f"n={n} M^pi={m_pi:.0f}")
        except ValueError as e:  # the fluid model is infeasible here: no batching (plan_note says why)
            thresholds.append({})
            notes.append(f"fluid model infeasible, thresholds 1: {e}")
    edges_arr = np.asarray(edges)
    classify = lambda t: int(np.searchsorted(edges_arr, pred.output_tokens(t), side="left"))  # noqa: E731
    return Wait(thresholds, classify, cfg.max_wait_s, cfg.max_active, notes[0])
