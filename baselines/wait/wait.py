"""WAIT: threshold batching with known output lengths (Ao, Luo, Simchi-Levi, Wang, arXiv 2504.11320,
Algorithm 1; docs/wait.md), run by each engine as its batch rule, with collocated placement.

Prompt types are output-length bins (``output_bins``, tokens) of the workload's turns; a request's type
comes from its output length as predicted by the :class:`~harness.core.policy.Predictor` (``predictor.sigma
= 0``, the default, is the paper's known-length setting). Thresholds ``n_j`` (prompts per stage per step),
chosen by ``thresholds``:

* ``fluid``: the smallest integers with ``d0 + d1 M^pi + d2 sum_j n_j l_j <= n_j / lambda_j``
  (``baselines.wait.fluid.wait_thresholds``; the prefill term ``d2`` is ours, see there and docs/wait.md). If
  the fluid model is infeasible (overloaded) every threshold is 1 and the plan note says why.
* ``tl``: the paper's experiments: one system-wide batch cap ``tl`` spread over the stages in proportion
  to the arrival rates, ``n_j = max(1, floor(tl lambda_j / sum_k lambda_k (l'_k + 1)))`` (the authors'
  ``booking_limit_replica_scheduler.py``: ``int(max(per_stage_limit, 1))``).

The rule itself (eligibility, per-stage caps, pausing, eviction preference, finite-horizon timeout) is
:class:`baselines.wait.fluid_admission.WaitRule`.
"""

from __future__ import annotations


from dataclasses import dataclass, field

from baselines.wait.fluid_admission import (WaitRule, check_knobs, fluid_flag, fluid_reason, instance_coefficients,
                                       kv_reservation_tokens, OutputBinClassifier, paper_types,
                                       prefill_coefficient, prompt_types)
from baselines.wait.fluid import wait_thresholds
from harness.core.policy import BatchRulePolicy, PolicyContext, Predictor, PredictorConfig, register


@dataclass
class WaitConfig:
    """output_bins: type boundaries on output tokens; thresholds: ``fluid`` or ``tl``; total_cap_tl: the
    paper's ``tl`` (prompts per step over all stages; ``tl`` only); margin: slack on the fluid inequality
    (``fluid`` only); max_wait_s: finite-horizon timeout, s; idle_policy: ``wait`` (Algorithm 1) or
    ``decode_residents``."""

    name: str = "wait"
    output_bins: list[int] = field(default_factory=lambda: [64, 256, 1024])
    thresholds: str = "fluid"
    total_cap_tl: float = 256.0
    margin: float = 0.0
    max_wait_s: float = 0.5
    idle_policy: str = "wait"
    predictor: PredictorConfig = field(default_factory=PredictorConfig)


class Wait(BatchRulePolicy):
    """WAIT batching in every engine + sticky collocated placement, no admission hold. ``fluid_infeasible``:
    per instance, ``""`` or why its fluid plan (``thresholds=fluid``'s, computed in either mode) is
    infeasible; :meth:`summary` names it (``baselines.wait.fluid_admission.fluid_flag``)."""

    name = "wait"

    def __init__(self, rules, plan_note: str, fluid_infeasible=()):
        super().__init__(rules, plan_note)
        self.fluid_infeasible = list(fluid_infeasible)

    def summary(self) -> dict:
        """``fluid_plan_infeasible`` and its reason (docs/metrics.md, "Validity")."""
        return fluid_flag(self.fluid_infeasible)


def tl_thresholds(types, tl: float) -> list[int]:
    """``n_j = max(1, floor(tl lambda_j / sum_k lambda_k o_k))`` with ``o_k = l'_k + 1`` iterations."""
    denom = sum(t.rate_per_s * t.output_tokens for t in types)
    return [max(1, int(tl * t.rate_per_s / denom)) for t in types]


@register("wait", WaitConfig, forms_batches=True, reads_workload=True)
def make(cfg: WaitConfig, ctx: PolicyContext) -> Wait:
    edges = check_knobs(cfg.output_bins, cfg.max_wait_s, cfg.thresholds, cfg.total_cap_tl, cfg.idle_policy)
    if not cfg.margin >= 0:
        raise ValueError(f"scheduler.margin must be >= 0, got {cfg.margin!r}")
    pred = Predictor.from_config(ctx.truth, cfg.predictor)
    classify = OutputBinClassifier(pred, edges)
    n_inst = len(ctx.cluster_roles)
    types, bins = prompt_types(ctx, edges, n_inst)  # a config problem (no arrival rate) is an error
    rules, notes, infeasible = [], [], []
    for i in range(n_inst):
        d0, d1 = instance_coefficients(ctx, i)

        def fluid(i=i, d0=d0, d1=d1):
            return wait_thresholds(paper_types(types), d0, d1, ctx.kv_capacity_tokens[i], cfg.margin,
                                   d2_s_per_prefill_token=prefill_coefficient(ctx, i))
        if cfg.thresholds == "tl":
            n = tl_thresholds(types, cfg.total_cap_tl)
            how = f"tl={cfg.total_cap_tl:g}"
            infeasible.append(fluid_reason(fluid))   # the fluid model's verdict on this workload, not used
        else:
            try:
                n, _ = fluid()
                how = "fluid"
                infeasible.append("")
            except ValueError as e:  # the fluid model is infeasible here: n = 1 (plan_note says why)
                n = [1] * len(types)
                how = f"fluid infeasible, thresholds 1: {e}"
                infeasible.append(str(e))
        by_bin = [1] * (len(edges) + 1)
        for b, k in zip(bins, n):
            by_bin[int(b)] = int(k)
        m_pi = sum(kv_reservation_tokens([k] * max(1, round(t.output_tokens)), t.input_tokens)
                   for k, t in zip(n, types))
        rules.append(WaitRule(by_bin, classify, cfg.max_wait_s, cfg.idle_policy))
        notes.append(f"{how}; n={list(n)} for output bins {[int(b) for b in bins]}; M^pi={m_pi:.0f} tokens")
    return Wait(rules, notes[0], infeasible)
