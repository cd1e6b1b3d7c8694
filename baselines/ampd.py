"""AMPD: per-turn remote-vs-local (append-)prefill decided from *predicted* quantities.

(He et al., "Efficient Multi-round LLM Inference over Disaggregated Serving", arXiv 2602.14516;
docs/schedulers.md "ampd".) The paper's exact rule is not public; this is the emulation
docs/schedulers.md describes:
  * Turn 0: prefill on a prefiller, KV to the decoder with the lowest *predicted* peak KV demand: the
    context of the conversations pinned there plus their predicted KV growth until they end
    (``Predictor.kv_growth``); the decode stays there (multi-round KV reuse). ConServe makes the same
    choice from observed occupancy alone.
  * Turn k >= 1: compare predicted costs (s) and take the cheaper::

        T_remote = q_P + prefill_P(new + prev_out) + transfer(new + prev_out)
        T_local  = q_D + prefill_D(new) * (1 + w * running_D) + preemption risk

    q_X = queued prefill tokens / prefill throughput of X; ``prefill_X(n) = n / throughput``; the
    prefiller recomputes the previous output it never saw (``prev_out``); ``w`` is
    ``interference_weight`` (a local prefill stalls the ``running_D`` co-running decodes), set to 0
    when the turn is predicted to be the user-visible last one (then only its own TTFT counts);
    preemption risk = ``prefill_D(prompt)`` when the decoder's KV after the turn's predicted growth
    (``used + new + predicted output``) exceeds ``kv_high_frac`` of capacity (a recompute is likely).
  * Predictions (decode length, tool use, remaining turns) come from the injected-error
    :class:`harness.policy.Predictor` (``predictor.sigma`` / ``predictor.error_rate``; 0 = oracle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.policy import (AdmitAll, ClusterView, InstanceView, Placement, PolicyContext, Predictor, PredictorConfig,
                            TurnView, pick_prefiller, register, require_roles)


@dataclass
class AmpdConfig:
    """interference_weight: w above (dimensionless, >= 0); kv_high_frac: KV watermark in (0, 1]."""

    name: str = "ampd"
    interference_weight: float = 0.1
    kv_high_frac: float = 0.95
    predictor: PredictorConfig = field(default_factory=PredictorConfig)


class Ampd(AdmitAll):
    """AMPD placement with an explicit, error-injected predictor."""

    name = "ampd"

    def __init__(self, cfg: AmpdConfig, predictor: Predictor):
        self.cfg, self.pred = cfg, predictor

    def predicted_demand(self, inst: InstanceView) -> float:
        """Predicted peak KV demand of a decoder as a fraction of capacity: the context of its pinned
        conversations now plus their predicted KV growth until they end."""
        growth = sum(self.pred.kv_growth(cid, k) for cid, k in inst.conversations)
        return (inst.conversation_context_tokens + growth) / inst.kv_capacity_tokens

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        p = pick_prefiller(view)
        pred_out = self.pred.output_tokens(turn)
        pred_left = self.pred.remaining_turns(turn)
        if turn.prev_decode_instance < 0:
            demand = [(i.index, self.predicted_demand(i)) for i in view.by_role("decoder")]
            d, dem = min(demand, key=lambda c: (c[1], c[0]))
            return Placement(p.index, d, f"turn 0: predicted demand {dem:.3f}", tuple(demand))
        d = view.instances[turn.prev_decode_instance]
        n_remote = turn.new_input_tokens + turn.prev_output_tokens
        t_remote = (p.queued_prefill_tokens + n_remote) / p.prefill_tokens_per_s + view.transfer_s(n_remote)
        w = 0.0 if pred_left < 0.5 else self.cfg.interference_weight
        pf_local = turn.new_input_tokens / d.prefill_tokens_per_s
        t_local = d.queued_prefill_tokens / d.prefill_tokens_per_s + pf_local * (1 + w * d.num_running)
        if d.kv_used_tokens + turn.new_input_tokens + pred_out > self.cfg.kv_high_frac * d.kv_capacity_tokens:
            t_local += turn.prompt_tokens / d.prefill_tokens_per_s
        why = f"T_local={t_local * 1e3:.2f}ms T_remote={t_remote * 1e3:.2f}ms pred_out={pred_out:.0f}"
        cands = ((d.index, t_local), (p.index, t_remote))
        if t_local <= t_remote:
            return Placement(d.index, d.index, "local: " + why, cands)
        return Placement(p.index, d.index, "remote: " + why, cands)


@register("ampd", AmpdConfig)
def make(cfg: AmpdConfig, ctx: PolicyContext) -> Ampd:
    if not cfg.interference_weight >= 0:
        raise ValueError(f"scheduler.interference_weight must be >= 0, got {cfg.interference_weight!r}")
    if not 0 < cfg.kv_high_frac <= 1:
        raise ValueError(f"scheduler.kv_high_frac must be in (0, 1], got {cfg.kv_high_frac!r}")
    require_roles("ampd", ctx.cluster_roles, ("prefiller", "decoder"))
    pred = Predictor.from_config(ctx.truth, cfg.predictor)
    return Ampd(cfg, pred)
