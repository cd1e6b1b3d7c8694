"""ConServe: conversation-level disaggregation by observation, not prediction.

(Ding et al., "Observation, Not Prediction: Conversation-Level Disaggregated Scheduling for Agentic
Serving", arXiv 2606.01839; PAPERS.md "ConServe".)
  * Turn 0: prefill on a prefiller (fewest queued prefill tokens), KV moved once to the decoder with the
    lowest observed KV occupancy (ties: fewest pinned conversations); the conversation is pinned there.
  * Turns >= 1: append-prefill and decode locally on the pinned decoder (prefix cache hit), no migration.
  * Reactive admission of *new* conversations only: admitted while the prefiller's queued prefill time
    (queued tokens / prefill throughput) is under ``max_prefill_queue_s`` and the decoder pool's KV
    occupancy (sum used / sum capacity) is under ``kv_admit_frac``; otherwise they wait in FIFO order
    (re-checked every ``recheck_s``). Later turns of admitted conversations are never held.
The paper leaves the thresholds open: they are knobs here with the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from harness.policy import (Admission, ClusterView, Placement, PolicyContext, TurnView, least_loaded, occupancy, register,
                            require_roles)
from baselines.disaggregated import pick_prefiller


@dataclass
class ConserveConfig:
    """kv_admit_frac: decoder-pool KV occupancy under which new conversations are admitted, (0, 1].
    max_prefill_queue_s: prefiller queue (s of prefill work) under which they are admitted.
    recheck_s: re-poll interval while a new conversation is held, s."""

    name: str = "conserve"
    kv_admit_frac: float = 0.9
    max_prefill_queue_s: float = 2.0
    recheck_s: float = 0.05


class Conserve:
    """ConServe admission + placement."""

    name = "conserve"

    def __init__(self, cfg: ConserveConfig):
        self.cfg = cfg

    def admit(self, queue: Sequence[TurnView], view: ClusterView, now: float) -> Admission:
        decoders = view.by_role("decoder")
        used = sum(max(d.kv_used_tokens, d.conversation_context_tokens) for d in decoders)
        cap = sum(d.kv_capacity_tokens for d in decoders)
        pf = min(view.by_role("prefiller"), key=lambda p: p.queued_prefill_tokens / p.prefill_tokens_per_s)
        queue_s = pf.queued_prefill_tokens / pf.prefill_tokens_per_s
        open_ = used / cap < self.cfg.kv_admit_frac and queue_s < self.cfg.max_prefill_queue_s
        admit = []
        blocked = False
        for i, t in enumerate(queue):
            if t.turn > 0:
                admit.append(i)
            elif open_ and not blocked:
                admit.append(i)
                queue_s += t.prompt_tokens / pf.prefill_tokens_per_s
                open_ = queue_s < self.cfg.max_prefill_queue_s
            else:
                blocked = True
        held = len(admit) < len(queue)
        reason = f"pool kv={used / cap:.3f} prefill queue={queue_s:.2f}s"
        return Admission(tuple(admit), reason, now + self.cfg.recheck_s if held else None)

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        if turn.prev_decode_instance >= 0:
            d = turn.prev_decode_instance
            return Placement(d, d, "pinned: local append-prefill")
        p = pick_prefiller(view)
        d = least_loaded(view.by_role("decoder"))
        return Placement(p, d.index, f"turn 0: P->D once, decoder occupancy={occupancy(d):.3f}")


@register("conserve", ConserveConfig)
def make(cfg: ConserveConfig, ctx: PolicyContext) -> Conserve:
    if not 0 < cfg.kv_admit_frac <= 1:
        raise ValueError(f"scheduler.kv_admit_frac must be in (0, 1], got {cfg.kv_admit_frac!r}")
    if not cfg.max_prefill_queue_s > 0:
        raise ValueError(f"scheduler.max_prefill_queue_s must be > 0, got {cfg.max_prefill_queue_s!r}")
    if not cfg.recheck_s > 0:
        raise ValueError(f"scheduler.recheck_s must be > 0, got {cfg.recheck_s!r}")
    require_roles("conserve", ctx.cluster_roles, ("prefiller", "decoder"))
    return Conserve(cfg)
