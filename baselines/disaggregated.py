"""Fully disaggregated serving (vLLM's P/D proxy): every turn's prompt is prefilled on a prefiller and its
KV moved to a decoder, which pulls only the blocks it does not already hold in its prefix cache.

Prefiller: the one with the fewest queued prefill tokens. Decoder (``decoder_choice``):
``least_kv`` (lowest KV occupancy each turn, so a conversation may move and re-pull its whole context)
or ``sticky`` (turn 0 least-loaded, then the same decoder, so only new blocks move).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.policy import (AdmitAll, ClusterView, Placement, PolicyContext, TurnView, least_loaded, register,
                            require_roles)


@dataclass
class DisaggregatedConfig:
    """decoder_choice: ``least_kv`` | ``sticky``."""

    name: str = "disaggregated"
    decoder_choice: str = "least_kv"


def pick_prefiller(view: ClusterView) -> int:
    """The prefiller with the fewest queued prefill tokens (then lowest index)."""
    return min(view.by_role("prefiller"), key=lambda i: (i.queued_prefill_tokens, i.index)).index


class Disaggregated(AdmitAll):
    """Per-turn P/D disaggregation."""

    name = "disaggregated"

    def __init__(self, decoder_choice: str):
        self.decoder_choice = decoder_choice

    def place(self, turn: TurnView, view: ClusterView, now: float) -> Placement:
        p = pick_prefiller(view)
        if self.decoder_choice == "sticky" and turn.prev_decode_instance >= 0:
            return Placement(p, turn.prev_decode_instance, "sticky decoder")
        d = least_loaded(view.by_role("decoder"))
        return Placement(p, d.index, f"least-kv decoder kv={d.kv_used_frac:.3f}")


@register("disaggregated", DisaggregatedConfig)
def make(cfg: DisaggregatedConfig, ctx: PolicyContext) -> Disaggregated:
    if cfg.decoder_choice not in ("least_kv", "sticky"):
        raise ValueError(f"scheduler.decoder_choice must be 'least_kv' or 'sticky', got {cfg.decoder_choice!r}")
    require_roles("disaggregated", ctx.cluster_roles, ("prefiller", "decoder"))
    return Disaggregated(cfg.decoder_choice)
