"""ConServe: conversation-level disaggregation by observation, not prediction.

(Ding et al., "Observation, Not Prediction: Conversation-Level Disaggregated Scheduling for Agentic
Serving", arXiv 2606.01839; docs/schedulers.md "conserve".)
  * Turn 0: prefill on a prefiller (least queued prefill work), KV moved once to the decoder with the
    lowest observed KV occupancy (ties: fewest pinned conversations); the conversation is pinned there.
  * Turns >= 1: append-prefill and decode locally on the pinned decoder (prefix cache hit), no migration.
  * Reactive admission of *new* conversations only: admitted while the prefiller's queued prefill time
    (queued tokens / prefill throughput) is under ``max_prefill_queue_s`` and the decoder pool's KV
    occupancy (sum used / sum capacity; ``kv_gate=max_decoder``: the fullest decoder's) is under
    ``kv_admit_frac``; otherwise they wait in FIFO order
    (re-checked every ``recheck_s``). Later turns of admitted conversations are never held.
The paper leaves the thresholds open: they are knobs here with the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from harness.core.policy import (Admission, ClusterView, Placement, PolicyBase, PolicyContext, TurnView, least_loaded,
                            occupancy, pick_prefiller, pool_occupancy, prefill_queue_s, register)


KV_GATES = ("pool", "max_decoder")   # ConserveConfig.kv_gate


@dataclass
class ConserveConfig:
    """kv_admit_frac: decoder KV occupancy under which new conversations are admitted, (0, 1].
    kv_gate: which occupancy the gate reads. ``pool`` (default, the paper's "total KV occupancy under
    decoder-pool capacity", docs/schedulers.md): summed tokens over summed capacity of all decoders
    (:func:`~harness.core.policy.pool_occupancy`); ``max_decoder``: the fullest decoder's own
    :func:`~harness.core.policy.occupancy`, so no single decoder is filled past ``kv_admit_frac`` by new
    admissions while the others have room (a choice the paper leaves open; a pool gate lets one decoder
    reach ~1.0 where KV binds, docs/notebook/2026-12-03_conserve_claims_sensitivity.md, "Where KV capacity binds").
    max_prefill_queue_s: prefiller queue (s of prefill work) under which they are admitted.
    recheck_s: re-poll interval while a new conversation is held, s."""

    name: str = "conserve"
    kv_admit_frac: float = 0.9
    kv_gate: str = "pool"
    max_prefill_queue_s: float = 2.0
    recheck_s: float = 0.05


class Conserve(PolicyBase):
    """ConServe admission + placement."""

    name = "conserve"

    def __init__(self, cfg: ConserveConfig):
        self.cfg = cfg
        self._pool_gate = cfg.kv_gate == "pool"
        # the turns this policy held at its last call: (first, last, count). Held turns are all turn-0 ones
        # (later turns are never held), and the controller's queue keeps them in FIFO order with new turns
        # appended, so a queue that starts with them needs scanning only from where they end.
        self._held: tuple = (None, None, 0)

    def admit(self, queue: Sequence[TurnView], view: ClusterView, now: float) -> Admission:
        decoders = view.by_role("decoder")
        kv = pool_occupancy(decoders) if self._pool_gate else max(occupancy(d) for d in decoders)
        pf = pick_prefiller(view)
        queue_s = prefill_queue_s(pf)
        open_ = kv < self.cfg.kv_admit_frac and queue_s < self.cfg.max_prefill_queue_s
        first, last, known = self._held
        n = len(queue)
        if not (known and n >= known and queue[0] is first and queue[known - 1] is last):
            known = 0                       # not the queue this policy saw: scan it all
        admit = []
        i = 0
        while i < n and open_:              # FIFO admission of new conversations while the gates are open
            t = queue[i]
            if t.turn == 0:
                queue_s += t.prompt_tokens / pf.prefill_tokens_per_s
                open_ = queue_s < self.cfg.max_prefill_queue_s
            admit.append(i)
            i += 1
        if i < known:                       # the rest of the previously held prefix: turn 0, still held
            i = known
        for j in range(i, n):               # held from here on: only later turns pass
            if queue[j].turn > 0:
                admit.append(j)
        held = n - len(admit)
        if held:
            lo, hi = 0, n - 1               # first and last held index (admit is ascending)
            for a in admit:
                if a != lo:
                    break
                lo += 1
            for a in reversed(admit):
                if a != hi:
                    break
                hi -= 1
            self._held = (queue[lo], queue[hi], held)
        else:
            self._held = (None, None, 0)
        reason = f"{'pool' if self._pool_gate else 'max decoder'} kv={kv:.3f} prefill queue={queue_s:.2f}s"
        return Admission(tuple(admit), reason, now + self.cfg.recheck_s if held else None)

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        if turn.prev_decode_instance >= 0:
            d = turn.prev_decode_instance
            return Placement(d, d, "pinned: local append-prefill")
        p = pick_prefiller(view).index
        decoders = view.by_role("decoder")
        d = least_loaded(decoders)
        return Placement(p, d.index, f"turn 0: P->D once, decoder occupancy={occupancy(d):.3f}",
                         tuple((i.index, occupancy(i)) for i in decoders))


@register("conserve", ConserveConfig, roles=("prefiller", "decoder"))
def make(cfg: ConserveConfig, ctx: PolicyContext) -> Conserve:
    if not 0 < cfg.kv_admit_frac <= 1:
        raise ValueError(f"scheduler.kv_admit_frac must be in (0, 1], got {cfg.kv_admit_frac!r}")
    if cfg.kv_gate not in KV_GATES:
        raise ValueError(f"scheduler.kv_gate must be one of {', '.join(KV_GATES)}, got {cfg.kv_gate!r}")
    if not cfg.max_prefill_queue_s > 0:
        raise ValueError(f"scheduler.max_prefill_queue_s must be > 0, got {cfg.max_prefill_queue_s!r}")
    if not cfg.recheck_s > 0:
        raise ValueError(f"scheduler.recheck_s must be > 0, got {cfg.recheck_s!r}")
    return Conserve(cfg)
