"""Workloads: conversations sampled from a trace with a seed, and their arrival times.

Arrival processes (``arrival``):
  * ``poisson``: exponential inter-arrival gaps with mean ``1 / rate_per_s``;
  * ``gamma``: Gamma gaps with mean ``1 / rate_per_s`` and coefficient of variation ``burstiness``
    (shape ``k = 1 / burstiness**2``, scale ``1 / (rate_per_s * k)``; burstiness 1 is Poisson, > 1
    burstier);
  * ``fixed``: every conversation arrives at t = 0 (a closed batch).
Sampling (``sample``): ``shuffle`` (a seeded permutation of the trace, then the first
``num_conversations``), ``first`` (the trace's order), ``with_replacement`` (ids get ``#k`` suffixes).
Randomness comes from ``numpy.random.default_rng([seed, stream])`` with a fixed stream per purpose,
so the same seed gives the same workload whatever else changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from harness.trace import ConversationRecord

_STREAM_SAMPLE, _STREAM_ARRIVAL = 1, 2


@dataclass
class WorkloadConfig:
    """Hydra schema of the ``workload`` group.

    trace: path of a trace file (relative paths are relative to the project root).
    num_conversations: how many conversations (``None``: the whole trace).
    sample: ``shuffle`` | ``first`` | ``with_replacement``.
    arrival: ``poisson`` | ``gamma`` | ``fixed``. rate_per_s: conversations/s (> 0 unless fixed).
    burstiness: coefficient of variation of Gamma gaps (> 0). seed: workload seed.
    max_turns: keep at most this many turns per conversation (``None``: all; the last kept turn
        becomes the visible one).
    """

    name: str = "swebench"
    trace: str = "traces/swebench_verified_mini_gemini3pro.jsonl.gz"
    num_conversations: Optional[int] = None
    sample: str = "shuffle"
    arrival: str = "poisson"
    rate_per_s: float = 0.05
    burstiness: float = 1.0
    seed: int = 0
    max_turns: Optional[int] = None

    def validate(self, where: str = "workload") -> None:
        """Raise ``ValueError`` naming ``workload.<field>`` for the first invalid value."""
        if self.sample not in ("shuffle", "first", "with_replacement"):
            raise ValueError(f"{where}.sample must be one of shuffle, first, with_replacement, got {self.sample!r}")
        if self.arrival not in ("poisson", "gamma", "fixed"):
            raise ValueError(f"{where}.arrival must be one of poisson, gamma, fixed, got {self.arrival!r}")
        if self.arrival != "fixed" and not (isinstance(self.rate_per_s, (int, float))
                                            and math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"{where}.rate_per_s must be a finite number > 0 (conversations/s), "
                             f"got {self.rate_per_s!r}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"{where}.burstiness must be a finite number > 0, got {self.burstiness!r}")
        if self.num_conversations is not None and self.num_conversations < 1:
            raise ValueError(f"{where}.num_conversations must be >= 1 or null, got {self.num_conversations!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"{where}.max_turns must be >= 1 or null, got {self.max_turns!r}")


@dataclass(frozen=True)
class WorkloadStats:
    """Aggregate statistics of a workload, for planners (fluid model, admission).

    rate_per_s: conversation arrival rate (conversations/s; ``inf`` for fixed arrivals);
    mean_turns: turns per conversation; turn_prompt_tokens, turn_new_tokens, turn_output_tokens,
    tool_time_s: per-turn arrays (tokens, s), one entry per turn of the workload.
    """

    rate_per_s: float
    mean_turns: float
    turn_prompt_tokens: np.ndarray = field(repr=False)
    turn_new_tokens: np.ndarray = field(repr=False)
    turn_output_tokens: np.ndarray = field(repr=False)
    tool_time_s: np.ndarray = field(repr=False)


def truncate_turns(rec: ConversationRecord, max_turns: int) -> ConversationRecord:
    """Keep the first ``max_turns`` turns; the last kept turn becomes the (only) visible one, with no
    tool time after it."""
    if len(rec.turns) <= max_turns:
        return rec
    turns = list(rec.turns[:max_turns])
    turns = [replace(t, visible=False) for t in turns[:-1]] + [replace(turns[-1], visible=True, tool_time_s=0.0)]
    return replace(rec, turns=tuple(turns))


def build_workload(records: Sequence[ConversationRecord], cfg: WorkloadConfig
                   ) -> tuple[list[tuple[float, ConversationRecord]], WorkloadStats]:
    """Sample conversations and draw arrival times.

    Returns:
        ``[(arrival_s, record), ...]`` sorted by arrival time (ties keep sampling order), and stats.
    Raises:
        ValueError: invalid config, or ``num_conversations`` > trace size without replacement.
    """
    cfg.validate()
    n = len(records) if cfg.num_conversations is None else cfg.num_conversations
    rng_s = np.random.default_rng([cfg.seed, _STREAM_SAMPLE])
    if cfg.sample == "with_replacement":
        idx = rng_s.integers(0, len(records), size=n)
        seen: dict[str, int] = {}
        chosen = []
        for i in idx:
            r = records[int(i)]
            k = seen.get(r.conversation_id, 0)
            seen[r.conversation_id] = k + 1
            chosen.append(r if k == 0 else replace(r, conversation_id=f"{r.conversation_id}#{k}"))
    else:
        if n > len(records):
            raise ValueError(f"workload.num_conversations={n} exceeds the trace's {len(records)} "
                             f"conversations (use workload.sample=with_replacement)")
        order = rng_s.permutation(len(records)) if cfg.sample == "shuffle" else np.arange(len(records))
        chosen = [records[int(i)] for i in order[:n]]
    if cfg.max_turns is not None:
        chosen = [truncate_turns(r, cfg.max_turns) for r in chosen]
    rng_a = np.random.default_rng([cfg.seed, _STREAM_ARRIVAL])
    if cfg.arrival == "fixed":
        times = np.zeros(n)
        rate = math.inf
    else:
        if cfg.arrival == "poisson":
            gaps = rng_a.exponential(1.0 / cfg.rate_per_s, size=n)
        else:
            k = 1.0 / cfg.burstiness ** 2
            gaps = rng_a.gamma(k, 1.0 / (cfg.rate_per_s * k), size=n)
        gaps[0] = 0.0  # the first conversation arrives at t = 0
        times = np.cumsum(gaps)
        rate = cfg.rate_per_s
    turns = [t for r in chosen for t in r.turns]
    stats = WorkloadStats(
        rate_per_s=rate, mean_turns=len(turns) / max(1, n),
        turn_prompt_tokens=np.array([t.prompt_tokens for t in turns], dtype=np.int64),
        turn_new_tokens=np.array([t.new_input_tokens for t in turns], dtype=np.int64),
        turn_output_tokens=np.array([t.output_tokens for t in turns], dtype=np.int64),
        tool_time_s=np.array([t.tool_time_s for t in turns], dtype=np.float64))
    return [(float(t), r) for t, r in zip(times, chosen)], stats
