"""AMPD: per-turn remote-vs-local (append-)prefill decided from *predicted* quantities.

(He et al., "Efficient Multi-round LLM Inference over Disaggregated Serving", arXiv 2602.14516;
docs/schedulers.md "ampd".) Public: AMPD decides adaptively, per round, where the incremental prefill
runs (a prefill instance, or locally on the decode instance that holds the conversation) to maximise
SLO attainment. Its exact rule was not readable to us; the choices below are knobs (``AmpdConfig``), each
documented in docs/schedulers.md:

* Turn 0 (``turn0``): prefill on a prefiller, KV moved to a decoder chosen from observed KV occupancy
  (``observed``, the default: the same observation ConServe uses) or, as an ablation, from each decoder's
  predicted future KV demand (``predicted_demand``: the context of its conversations plus their
  predicted KV growth until they end; an oracle of the future when the predictor has no error).
* Turn k >= 1 on the decoder ``d`` that holds the conversation, prefiller ``p`` (least queued work +
  what it lacks of the prompt). Cache-aware (``cache_aware``): an instance computes only the prompt
  tokens it does not hold (``TurnView.cached_prefix``, the controller's bookkeeping), queues count only
  uncached tokens, and ``d`` receives only the KV it lacks::

      n_X       = prompt - cached_X                        (tokens X must compute)
      q_X       = queued uncached prefill tokens of X / throughput_X
      T_remote  = q_p + n_p / thr_p + transfer(prompt - cached_d)
      T_local   = q_d + n_d / thr_d                        (the turn's own predicted TTFT)
      K_d       = sum over d's other conversations in flight of (context + predicted output)
                  + sum over d's conversations in tool time predicted back within tool_hold_s of context
                  + prompt + predicted output of this turn                     (predicted KV, tokens)
      tau_d     = d0_d + d1_d * K_d                        (predicted decode step, the fluid line, s)
      step_d    = tau_d + min(n_d, chunk_tokens) / thr_d   (a decode step carrying a local prefill chunk)
      over      = K_d > kv_high_frac * capacity_d          (predicted KV overflow -> preemption risk)

  ``mode=remote_default``: remote append-prefill unless ``d`` has slack, i.e. ``step_d <= tpot_slo_s``
  and ``T_local <= ttft_slo_s`` and not ``over`` (then local).
  ``mode=cost``: local iff ``T_local + w * running_d * n_d / thr_d + risk <= T_remote + risk`` with
  ``w = interference_weight`` (0 when the turn is predicted to be the last: only its own TTFT counts)
  and ``risk = prefill_d(prompt)`` when ``over`` (a recompute is likely wherever the prefill ran,
  since the KV lands on ``d`` either way).
  Either mode: when ``over`` and ``migrate``, the decode moves to the decoder with the lowest predicted
  KV demand fraction that is not over (remote prefill, the whole context it lacks moved there) if that
  is cheaper under the mode's rule (remote_default: always; cost: if its T_remote is lowest).
* Predictions (output length, tool time, remaining turns, KV growth) come from the error-injected
  :class:`harness.core.policy.Predictor` (``predictor.*``; sigma = error_rate = 0 is the oracle). Beside every
  decision the same rule is evaluated with an error-free predictor on the same view; ``summary()``
  reports the share of turns >= 1 whose remote/local choice flipped (``ampd_decision_flip_frac``).
* Error at the decision (``misroute_frac``): after the rule has decided a turn >= 1, a seeded
  draw ``u ~ U(0, 1)`` per (conversation, turn) inverts the remote/local choice when
  ``u < misroute_frac``: a local decision becomes remote (prefill on ``p``, decode stays on ``d``), a
  remote one (migration included) becomes local on ``d``. The draw comes from its own stream
  (``numpy.random.default_rng([MISROUTE_STREAM, misroute_seed, workload seed, turn, *conversation id bytes])``;
  workload seed = ``workload.seed``, ``PolicyContext.workload_seed``, the seed a preset sweeps; the top-level
  ``seed`` does not enter, so a sweep over ``workload.seed`` with ``seed`` left at 0 draws a different
  pattern per seed and its intervals include the draw's own variance), independent of the
  predictor's errors and the same for every variant and error arm of a seed, so the flipped turns differ
  between arms only where the runs' turns do (a draw below 0.1 also lies below 0.3: the arms are nested). ``Placement.misrouted`` marks them
  (the ``misrouted`` column of ``decisions.parquet``); ``summary()`` reports the realised share
  (``ampd_misrouted_frac``) beside the predictor's (``ampd_decision_flip_frac``, measured on the rule's
  choice before the inversion) and the share whose final choice differs from the error-free rule's
  (``ampd_decision_error_frac``). ``misroute_frac = 0`` (default) draws nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import LazyModule

from harness.core.policy import (AdmitAll, ClusterView, InstanceHints, InstanceView, Placement, PolicyContext, Predictor,
                            PredictorConfig, TurnView, least_loaded, occupancy, register)

np = LazyModule("numpy", globals(), "np")   # imported on first use (a config error, --help: never), then bound here

MODES = ("remote_default", "cost")
TURN0 = ("observed", "predicted_demand")
# first entropy word of the misroute stream (the predictor's streams start with its seed): "MISR" in ASCII
MISROUTE_STREAM = 0x4D495352


@dataclass
class AmpdConfig:
    """AMPD knobs (module docstring for the formulas; docs/schedulers.md for the choices).

    mode: ``remote_default`` | ``cost``. turn0: ``observed`` | ``predicted_demand`` (ablation).
    cache_aware: count only uncached tokens (False: the cache-blind ablation -- the prefiller recomputes
        the new input and the previous output, the decoder the new input, queues in all prompt tokens).
    interference_weight: w, dimensionless >= 0 (cost mode). kv_high_frac: KV watermark in (0, 1].
    tpot_slo_s: the decode-step budget a local prefill chunk must fit in, s (> 0; remote_default).
    ttft_slo_s: the local TTFT budget, s (> 0; remote_default). chunk_tokens: the engine's token budget
        per step (vLLM 0.32 ``max_num_batched_tokens`` on A40-class GPUs: 2048), tokens >= 1.
    tool_hold_s: a conversation in tool time counts in a decoder's predicted KV when its predicted tool
        time is at most this, s (>= 0). migrate: move the decode off a decoder predicted to overflow.
    misroute_frac: the probability, in [0, 1], that a turn >= 1's remote/local decision is inverted after
        the rule (error at the decision, module docstring); 0 = none. misroute_seed: an int >= 0 mixed
        with the workload seed into the misroute stream (another pattern on the same workload).
    """

    name: str = "ampd"
    mode: str = "remote_default"
    turn0: str = "observed"
    cache_aware: bool = True
    interference_weight: float = 0.1
    kv_high_frac: float = 0.95
    tpot_slo_s: float = 0.015
    ttft_slo_s: float = 1.0
    chunk_tokens: int = 2048
    tool_hold_s: float = 30.0
    migrate: bool = True
    misroute_frac: float = 0.0
    misroute_seed: int = 0
    predictor: PredictorConfig = field(default_factory=PredictorConfig)


@dataclass(frozen=True)
class Costs:
    """What one evaluation of the rule computed (s, tokens); ``placement`` is the decision."""

    placement: Placement
    t_local: float
    t_remote: float
    step_d: float
    kv_pred: float
    over: bool


class Ampd(AdmitAll):
    """AMPD placement with an explicit, error-injected predictor (and an error-free twin that only counts
    how often the errors flip the remote/local choice)."""

    name = "ampd"

    def __init__(self, cfg: AmpdConfig, predictor: Predictor, hints: tuple[InstanceHints, ...], workload_seed: int = 0):
        """``workload_seed``: ``workload.seed`` (``PolicyContext.workload_seed``), an int >= 0, keys the
        misroute draw (:meth:`misroute_draw`)."""
        self.cfg, self.pred, self.hints, self.workload_seed = cfg, predictor, hints, workload_seed
        self.oracle = None if predictor.exact else predictor.error_free()
        self.turns = self.remote = self.flips = self.placement_flips = self.migrations = 0
        self.misrouted = self.decision_errors = 0

    def misroute_draw(self, turn: TurnView) -> float:
        """The uniform draw in [0, 1) that decides whether ``turn``'s decision is inverted (module docstring;
        a function of the misroute seed, the workload seed and the (conversation, turn) only)."""
        rng = np.random.default_rng([MISROUTE_STREAM, self.cfg.misroute_seed, self.workload_seed % 2**63, turn.turn,
                                     *turn.conversation_id.encode()])
        return float(rng.random())

    def misroute(self, turn: TurnView, view: ClusterView, pl: Placement) -> Placement:
        """``pl`` with its remote/local choice inverted (turn >= 1): remote -> local on the decoder that
        holds the conversation; local -> remote from the prefiller :meth:`prefiller` picks, decode stays."""
        d = turn.prev_decode_instance
        if pl.disaggregated:
            return Placement(d, d, f"misrouted local (rule: remote on {pl.prefill_instance}->{pl.decode_instance}): "
                             + pl.reason, pl.candidates, misrouted=True)
        p = self.prefiller(turn, view, d).index
        return Placement(p, d, "misrouted remote (rule: local): " + pl.reason, pl.candidates, misrouted=True)

    # ---- predicted quantities ----------------------------------------------------------------------
    def predicted_demand(self, inst: InstanceView, pred: Predictor) -> float:
        """turn0=predicted_demand: the context of a decoder's conversations now plus their predicted KV
        growth until they end, as a fraction of capacity."""
        growth = sum(pred.kv_growth(cid, k) for cid, k in inst.conversations)
        return (inst.conversation_context_tokens + growth) / inst.kv_capacity_tokens

    def predicted_kv(self, inst: InstanceView, turn: TurnView, pred: Predictor) -> float:
        """K (tokens): the KV ``inst`` is predicted to hold while this turn runs there (module docstring)."""
        k = turn.prompt_tokens + pred.output_tokens(turn)
        for (cid, t), ctx, busy in zip(inst.conversations, inst.conversation_tokens, inst.conversation_in_flight):
            if cid == turn.conversation_id:
                continue
            if busy:
                k += ctx + pred.output_tokens_at(cid, t)
            elif pred.tool_time_at(cid, t) <= self.cfg.tool_hold_s:
                k += ctx
        return k

    def cached(self, turn: TurnView, i: int, decoder: int) -> int:
        """Tokens of the prompt instance ``i`` holds (cache-blind ablation: the decoder holds the reused
        prefix, any other instance all but the previous output)."""
        if self.cfg.cache_aware:
            return turn.cached_on(i)
        return turn.reused_tokens if i == decoder else max(0, turn.reused_tokens - turn.prev_output_tokens)

    def queue_s(self, inst: InstanceView) -> float:
        q = inst.queued_uncached_prefill_tokens if self.cfg.cache_aware else inst.queued_prefill_tokens
        return q / inst.prefill_tokens_per_s

    def prefiller(self, turn: TurnView, view: ClusterView, decoder: int) -> InstanceView:
        """The prefiller with the least queued work plus the prompt tokens it lacks, then lowest index."""
        return min(view.by_role("prefiller"), key=lambda i: (
            self.queue_s(i) + (turn.prompt_tokens - self.cached(turn, i.index, decoder)) / i.prefill_tokens_per_s,
            i.index))

    # ---- the rule ----------------------------------------------------------------------------------
    def decide(self, turn: TurnView, view: ClusterView, pred: Predictor) -> Costs:
        """One evaluation of the rule with predictor ``pred`` (no side effects)."""
        cfg = self.cfg
        decoders = view.by_role("decoder")
        if turn.prev_decode_instance < 0:
            p = self.prefiller(turn, view, -1)
            if cfg.turn0 == "predicted_demand":
                demand = [(i.index, self.predicted_demand(i, pred)) for i in decoders]
                d, dem = min(demand, key=lambda c: (c[1], c[0]))
                return Costs(Placement(p.index, d, f"turn 0: predicted demand {dem:.3f}", tuple(demand)),
                             0.0, 0.0, 0.0, 0.0, False)
            d = least_loaded(decoders)
            return Costs(Placement(p.index, d.index, f"turn 0: observed occupancy {occupancy(d):.3f}",
                                   tuple((i.index, occupancy(i)) for i in decoders)), 0.0, 0.0, 0.0, 0.0, False)
        d = view.instances[turn.prev_decode_instance]
        p = self.prefiller(turn, view, d.index)
        n_d = turn.prompt_tokens - self.cached(turn, d.index, d.index)
        n_p = turn.prompt_tokens - self.cached(turn, p.index, d.index)
        t_remote = self.queue_s(p) + n_p / p.prefill_tokens_per_s + view.transfer_s(n_d)
        pf_local = n_d / d.prefill_tokens_per_s
        t_local = self.queue_s(d) + pf_local
        kv = self.predicted_kv(d, turn, pred)
        over = kv > cfg.kv_high_frac * d.kv_capacity_tokens
        h = self.hints[d.index]
        step = h.fluid_d0_s + h.fluid_d1_s_per_token * kv + min(n_d, cfg.chunk_tokens) / d.prefill_tokens_per_s
        pred_out = pred.output_tokens(turn)
        why = (f"T_local={t_local * 1e3:.2f}ms T_remote={t_remote * 1e3:.2f}ms step={step * 1e3:.2f}ms "
               f"K={kv:.0f} pred_out={pred_out:.0f}")
        # a decoder to migrate to when d is predicted to overflow
        alt = None
        if over and cfg.migrate:
            others = [(self.predicted_kv(i, turn, pred) / i.kv_capacity_tokens, i.index, i)
                      for i in decoders if i.index != d.index]
            others = [o for o in others if o[0] <= cfg.kv_high_frac]
            if others:
                _, _, a = min(others, key=lambda o: (o[0], o[1]))
                lacks = turn.prompt_tokens - self.cached(turn, a.index, d.index) if cfg.cache_aware else turn.prompt_tokens
                alt = (a, self.queue_s(p) + n_p / p.prefill_tokens_per_s + view.transfer_s(lacks))
        if cfg.mode == "remote_default":
            slack = step <= cfg.tpot_slo_s and t_local <= cfg.ttft_slo_s and not over
            cands = ((d.index, t_local), (p.index, t_remote))
            if slack:
                pl = Placement(d.index, d.index, "local (slack): " + why, cands)
            elif alt is not None:
                pl = Placement(p.index, alt[0].index, f"remote, migrate to {alt[0].name} (KV over): " + why,
                               cands + ((alt[0].index, alt[1]),))
            else:
                pl = Placement(p.index, d.index, "remote (no slack): " + why, cands)
            return Costs(pl, t_local, t_remote, step, kv, over)
        w = 0.0 if pred.remaining_turns(turn) < 0.5 else cfg.interference_weight
        risk = turn.prompt_tokens / d.prefill_tokens_per_s if over else 0.0
        c_local = t_local + w * d.num_running * pf_local + risk
        c_remote = t_remote + risk
        cands = ((d.index, c_local), (p.index, c_remote))
        best = min((c_local, 0), (c_remote, 1), *(((alt[1], 2),) if alt else ()))
        if best[1] == 0:
            pl = Placement(d.index, d.index, "local (cost): " + why, cands)
        elif best[1] == 1:
            pl = Placement(p.index, d.index, "remote (cost): " + why, cands)
        else:
            pl = Placement(p.index, alt[0].index, f"remote, migrate to {alt[0].name} (cost): " + why,
                           cands + ((alt[0].index, alt[1]),))
        return Costs(pl, t_local, t_remote, step, kv, over)

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        c = self.decide(turn, view, self.pred)
        rule = pl = c.placement
        later = turn.prev_decode_instance >= 0
        if later and self.cfg.misroute_frac > 0 and self.misroute_draw(turn) < self.cfg.misroute_frac:
            pl = self.misroute(turn, view, rule)
            self.misrouted += 1
        if later:
            self.turns += 1
            self.remote += pl.disaggregated
            self.migrations += pl.decode_instance != turn.prev_decode_instance
        o = rule if self.oracle is None else self.decide(turn, view, self.oracle).placement
        if later:
            self.flips += o.disaggregated != rule.disaggregated
            self.decision_errors += o.disaggregated != pl.disaggregated
        if self.oracle is not None:
            self.placement_flips += (o.prefill_instance, o.decode_instance) != (pl.prefill_instance, pl.decode_instance)
        return pl

    def summary(self) -> dict:
        """Counters for ``summary.json``: turns >= 1 decided, the share prefilled remotely, the share whose
        remote/local choice differs from the error-free predictor's on the same view
        (``ampd_decision_flip_frac``; 0 for the oracle arm), placements (any turn) that differ, and
        decodes moved to another decoder. With ``misroute_frac > 0`` also: the knob, the realised share of
        turns >= 1 whose choice was inverted (``ampd_misrouted_frac``) and the share whose final choice
        differs from the error-free rule's (``ampd_decision_error_frac``: prediction error and misroute
        together; a misroute can undo a prediction flip)."""
        n = self.turns
        nan = float("nan")
        out = {"ampd_turns_decided": n, "ampd_remote_frac": self.remote / n if n else nan,
               "ampd_decision_flip_frac": self.flips / n if n else nan,
               "ampd_placement_flips": self.placement_flips, "ampd_migrations": self.migrations,
               "ampd_mode": self.cfg.mode, "ampd_turn0": self.cfg.turn0}
        if self.cfg.misroute_frac > 0:
            out.update({"ampd_misroute_frac_setting": self.cfg.misroute_frac,
                        "ampd_misrouted_frac": self.misrouted / n if n else nan,
                        "ampd_misrouted_turns": self.misrouted,
                        "ampd_decision_error_frac": self.decision_errors / n if n else nan})
        return out


@register("ampd", AmpdConfig, roles=("prefiller", "decoder"))
def make(cfg: AmpdConfig, ctx: PolicyContext) -> Ampd:
    if cfg.mode not in MODES:
        raise ValueError(f"scheduler.mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    if cfg.turn0 not in TURN0:
        raise ValueError(f"scheduler.turn0 must be one of {', '.join(TURN0)}, got {cfg.turn0!r}")
    if not cfg.interference_weight >= 0:
        raise ValueError(f"scheduler.interference_weight must be >= 0, got {cfg.interference_weight!r}")
    if not 0 < cfg.kv_high_frac <= 1:
        raise ValueError(f"scheduler.kv_high_frac must be in (0, 1], got {cfg.kv_high_frac!r}")
    for key in ("tpot_slo_s", "ttft_slo_s"):
        if not getattr(cfg, key) > 0:
            raise ValueError(f"scheduler.{key} must be > 0 (s), got {getattr(cfg, key)!r}")
    if not (isinstance(cfg.chunk_tokens, int) and cfg.chunk_tokens >= 1):
        raise ValueError(f"scheduler.chunk_tokens must be an int >= 1 (tokens), got {cfg.chunk_tokens!r}")
    if not cfg.tool_hold_s >= 0:
        raise ValueError(f"scheduler.tool_hold_s must be >= 0 (s), got {cfg.tool_hold_s!r}")
    if not 0 <= cfg.misroute_frac <= 1:
        raise ValueError(f"scheduler.misroute_frac must be in [0, 1] (a probability), got {cfg.misroute_frac!r}")
    if not (isinstance(cfg.misroute_seed, int) and 0 <= cfg.misroute_seed < 2**63):
        raise ValueError(f"scheduler.misroute_seed must be an int in [0, 2**63), got {cfg.misroute_seed!r}")
    pred = Predictor.from_config(ctx.truth, cfg.predictor)
    return Ampd(cfg, pred, ctx.hints, ctx.workload_seed)
