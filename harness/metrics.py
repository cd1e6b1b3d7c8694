"""Metrics: per-turn and per-conversation tables, SLO attainment, goodput, energy, the summary.

Definitions (docs/metrics.md):
  * TTFT = first output token - submission (turn ready); TPOT = (last - first token) / (output - 1)
    (NaN for 1-token outputs); E2E = last token - submission; queue = admission - submission; ITL =
    the gaps between a turn's successive tokens (per turn: p50, p99, max in ``turns.parquet``).
  * TTFET = first token of the first user-visible turn - conversation arrival (``ttfet_definition``:
    ``visible`` (default; SWE-bench: the final submission turn), ``first`` or ``last`` turn).
  * Conversation latency = last token of the last turn - arrival.
  * SLO: TTFET <= threshold, where the threshold is ``ttfet_s`` (absolute) or ``ttfet_multiple`` x the
    conversation's *unloaded* TTFET (the conversation replayed alone on the idle cluster under the
    reference scheduler, ``reference_scheduler``, the same for every variant); optionally last-turn
    TPOT <= ``tbt_s``. Denominator: every conversation of the workload; failed conversations count as
    violations.
  * Goodput = conversations meeting the SLO / measured window (first arrival to last finish), conv/s.
  * Energy: sum over GPUs of energy over the measured window, J (idle power included);
    tokens_per_joule = tokens served / J, where tokens served = prompt tokens + generated tokens of the
    completed turns (a prefix-cache hit serves its tokens without recomputing them, so reuse raises
    tokens/J; recomputation after preemption or eviction does not add to the numerator);
    output_tokens_per_joule = generated tokens / J; ``prefill_tokens_computed`` reports the prefill work
    actually done (recompute included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd


@dataclass
class SloConfig:
    """Hydra schema of the ``slo`` group (see module docstring)."""

    name: str = "relative"
    ttfet_mode: str = "relative"
    ttfet_multiple: float = 1.5
    ttfet_s: Optional[float] = None
    tbt_s: Optional[float] = None
    ttfet_definition: str = "visible"
    reference_scheduler: str = "collocated"

    def validate(self, where: str = "slo") -> None:
        """Raise ``ValueError`` naming ``slo.<field>`` for the first invalid value."""
        if self.ttfet_mode not in ("relative", "absolute"):
            raise ValueError(f"{where}.ttfet_mode must be 'relative' or 'absolute', got {self.ttfet_mode!r}")
        if self.ttfet_mode == "relative" and not (self.ttfet_multiple and self.ttfet_multiple >= 1):
            raise ValueError(f"{where}.ttfet_multiple must be >= 1, got {self.ttfet_multiple!r}")
        if self.ttfet_mode == "absolute" and not (self.ttfet_s and self.ttfet_s > 0):
            raise ValueError(f"{where}.ttfet_s must be > 0 (s) when ttfet_mode=absolute, got {self.ttfet_s!r}")
        if self.tbt_s is not None and not self.tbt_s > 0:
            raise ValueError(f"{where}.tbt_s must be > 0 (s) or null, got {self.tbt_s!r}")
        if self.ttfet_definition not in ("visible", "first", "last"):
            raise ValueError(f"{where}.ttfet_definition must be visible, first or last, got {self.ttfet_definition!r}")


def ttfet_turn_index(visible: list[bool], definition: str) -> int:
    """Index of the turn whose first token defines TTFET (first visible, first, or last turn)."""
    if definition == "first":
        return 0
    if definition == "last":
        return len(visible) - 1
    return visible.index(True) if True in visible else len(visible) - 1


CONVERSATION_COLUMNS = ["conversation_id", "arrival_s", "num_turns", "turns_done", "ttfet_s", "latency_s", "finish_s",
                        "last_turn_tpot_s", "failed", "completed"]


def conversation_table(turns: pd.DataFrame, convs: list, definition: str) -> pd.DataFrame:
    """Per-conversation metrics (``conversations.parquet`` without SLO columns).

    ``convs``: the controller's ``ConversationState`` objects. Columns: conversation_id, arrival_s,
    num_turns, turns_done, ttfet_s, latency_s, finish_s, last_turn_tpot_s, failed, completed.
    turns_done: the conversation's ``ok`` turns; ttfet_s: first token of its TTFET turn
    (:func:`ttfet_turn_index`) minus its arrival, s; latency_s / last_turn_tpot_s: finish (minus arrival)
    and TPOT of its last turn, s; NaN where that turn has no ``ok`` row (the first such row counts).
    Computed column-wise (one pass over the turns table).
    """
    n = len(convs)
    arrival = np.array([c.arrival_s for c in convs], dtype=float)
    num_turns = np.array([len(c.record.turns) for c in convs], dtype=np.int64)
    k_turn = np.array([ttfet_turn_index([t.visible for t in c.record.turns], definition) for c in convs],
                      dtype=np.int64)
    done = np.zeros(n, dtype=np.int64)
    ttfet, latency, last_tpot = np.full(n, math.nan), np.full(n, math.nan), np.full(n, math.nan)
    if len(turns) and n:
        idx = pd.Index([c.record.conversation_id for c in convs]).get_indexer(turns["conversation_id"])
        ok = (turns["status"] == "ok").to_numpy() & (idx >= 0)
        rows = np.flatnonzero(ok)
        ci = idx[rows]
        done = np.bincount(ci, minlength=n).astype(np.int64)
        turn = turns["turn"].to_numpy()[rows]
        for mask, cols in ((turn == k_turn[ci], "ttfet"), (turn == num_turns[ci] - 1, "last")):
            c_hit, first = np.unique(ci[mask], return_index=True)   # the first such row per conversation
            r = rows[mask][first]
            if cols == "ttfet":
                ttfet[c_hit] = turns["first_token_s"].to_numpy(dtype=float)[r] - arrival[c_hit]
            else:
                latency[c_hit] = turns["finish_s"].to_numpy(dtype=float)[r] - arrival[c_hit]
                last_tpot[c_hit] = turns["tpot_s"].to_numpy(dtype=float)[r]
    return pd.DataFrame({
        "conversation_id": [c.record.conversation_id for c in convs], "arrival_s": arrival,
        "num_turns": num_turns, "turns_done": done, "ttfet_s": ttfet, "latency_s": latency,
        "finish_s": np.array([c.finish_s for c in convs], dtype=float), "last_turn_tpot_s": last_tpot,
        "failed": np.array([bool(c.failed) for c in convs], dtype=bool),
        "completed": np.array([bool(c.done and not c.failed) for c in convs], dtype=bool)},
        columns=CONVERSATION_COLUMNS)


def apply_slo(conv: pd.DataFrame, slo: SloConfig, unloaded_ttfet_s: Optional[dict]) -> pd.DataFrame:
    """Add ``unloaded_ttfet_s``, ``slo_ttfet_s`` (threshold, s) and ``slo_met`` columns (in place)."""
    if slo.ttfet_mode == "relative":
        conv["unloaded_ttfet_s"] = conv.conversation_id.map(unloaded_ttfet_s).astype(float)
        conv["slo_ttfet_s"] = conv.unloaded_ttfet_s * slo.ttfet_multiple
    else:
        conv["unloaded_ttfet_s"] = math.nan
        conv["slo_ttfet_s"] = float(slo.ttfet_s)
    met = conv.completed & (conv.ttfet_s <= conv.slo_ttfet_s)
    if slo.tbt_s is not None:
        met &= conv.last_turn_tpot_s.fillna(0.0) <= slo.tbt_s
    conv["slo_met"] = met.astype(bool)
    return conv


def _pct(x: pd.Series, q: float) -> float:
    x = x.dropna()
    return float(np.percentile(x, q)) if len(x) else math.nan


def summarize(turns: pd.DataFrame, conv: pd.DataFrame, energy_j_per_instance: list[float],
              window_s: float, preemptions: int) -> dict:
    """The headline metrics (``summary.json``); NaN where there is no data, never 0 for missing."""
    ok = turns[turns.status == "ok"] if len(turns) else turns
    n_conv = len(conv)
    met = int(conv.slo_met.sum()) if n_conv else 0
    energy = float(sum(energy_j_per_instance))
    gen = int(ok.output_tokens.sum()) if len(ok) else 0
    pre = int(turns.prefill_computed_tokens.sum()) if len(turns) else 0
    served = int(ok.prompt_tokens.sum()) + gen if len(ok) else 0
    return {
        "num_conversations": n_conv,
        "num_conversations_completed": int(conv.completed.sum()) if n_conv else 0,
        "num_conversations_failed": int(conv.failed.sum()) if n_conv else 0,
        "num_turns": int(len(ok)),
        "num_turns_failed": int((turns.status == "failed").sum()) if len(turns) else 0,
        "ttfet_p50_s": _pct(conv.ttfet_s, 50), "ttfet_p95_s": _pct(conv.ttfet_s, 95),
        "ttfet_mean_s": float(conv.ttfet_s.mean()) if n_conv else math.nan,
        "latency_p50_s": _pct(conv.latency_s, 50), "latency_p95_s": _pct(conv.latency_s, 95),
        "ttft_p50_s": _pct(ok.ttft_s, 50), "ttft_p95_s": _pct(ok.ttft_s, 95), "ttft_p99_s": _pct(ok.ttft_s, 99),
        "tpot_p50_s": _pct(ok.tpot_s, 50), "tpot_p95_s": _pct(ok.tpot_s, 95),
        "e2e_p50_s": _pct(ok.e2e_s, 50), "queue_p95_s": _pct(ok.queue_s, 95),
        "slo_attainment": met / n_conv if n_conv else math.nan,
        "slo_denominator": "all conversations of the workload (failed count as violations)",
        "goodput_conv_per_s": met / window_s if window_s > 0 else math.nan,
        "window_s": window_s,
        "preemptions": int(preemptions),
        "prefix_hit_frac": float(ok.cached_tokens.sum() / ok.prompt_tokens.sum()) if len(ok) else math.nan,
        "kv_transfer_tokens": float(turns.transfer_tokens.sum(min_count=1)) if len(turns) else math.nan,
        "disaggregated_turn_frac": float(ok.disaggregated.mean()) if len(ok) else math.nan,
        "energy_j": energy,
        "energy_j_per_instance": [float(e) for e in energy_j_per_instance],
        "prefill_tokens_computed": pre, "output_tokens": gen, "tokens_served": served,
        "tokens_per_joule": served / energy if energy > 0 else math.nan,
        "tokens_per_joule_counts": "prompt + generated tokens of completed turns (tokens served)",
        "output_tokens_per_joule": gen / energy if energy > 0 else math.nan,
    }
