"""Serving metrics as ``vllm bench serve`` and AIPerf report them, steady-state metrics, and a validity
verdict per run (as MLPerf LoadGen marks a run VALID/INVALID with its reasons).

Definitions (``docs/metrics.md``):

* Throughput over the measured window (first arrival to last finish, s): completed turns (requests) per
  s; prompt, generated and total tokens per s.
* Means and percentiles (``logger.percentiles``, default 50/90/95/99) of TTFT, TPOT, E2E and ITL (over every
  inter-token gap of every completed turn, as ``vllm bench serve`` pools them), in s; percentiles use
  numpy's linear interpolation.
* Steady state: the conversations that arrive after the first ``warmup_frac`` and before the last
  ``cooldown_frac`` of the arrival span (the span from the first to the last arrival) -- the run's ramp-up
  and drain are excluded; their TTFET p50/p95 and SLO attainment.
* Valid when: the run finished (not partial); at least ``min_conversations`` conversations are in the
  steady state; the failed conversations are at most ``max_failed_frac`` of all; the real backend counted
  no token-count mismatch. Otherwise invalid, with every reason.
* Size-scaled floor (``min_conversations_frac``, off by default): the steady-state floor becomes
  ``min(min_conversations, max(1, ceil(min_conversations_frac x n x (1 - warmup_frac - cooldown_frac))))``
  for a run of ``n`` conversations -- ``n x (1 - warmup - cooldown)`` is the steady share a uniform spread
  of arrivals would give, so ``0.5`` asks for half of it. A run of >= ``min_conversations / (frac x (1 -
  warmup - cooldown))`` conversations (250 at the defaults and 0.5) keeps the fixed floor; a tiny run
  (a smoke test) is judged on its own size, and is still INVALID when it fails, drops or mis-counts.
* Dropped conversations (``max_dropped_frac``, off by default): conversations the workload dropped before
  the run (``workload.context_overflow=drop``) at most this fraction of those sampled.
* Flags (``validity_flags``): named conditions that do not make a run INVALID but qualify what it measures,
  each a boolean key of the summary (:data:`FLAGS`): ``fluid_plan_infeasible`` -- WAIT's / Nested WAIT's
  fluid plan is infeasible for the run's workload (``d1 S + d2 P >= 1`` or ``M* > C``, docs/wait.md
  "Thresholds"), so the policy ran on its fallback thresholds, a regime the paper's analysis does not cover
  (the reason in ``fluid_plan_infeasible_reason``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from harness import LazyModule

np = LazyModule("numpy", globals(), "np")   # imported on first use (a config error, --help: never), then bound here

if TYPE_CHECKING:   # harness.run.config imports this module for ValidityConfig: pandas only when a table is read
    import pandas as pd


# The named validity flags (module docstring): summary keys that qualify a run without invalidating it.
FLAGS: tuple[str, ...] = ("fluid_plan_infeasible",)


@dataclass
class ValidityConfig:
    """The ``validity`` node: the rules of a run's verdict (module docstring).

    warmup_frac, cooldown_frac: fractions of the arrival span excluded at the start and at the end,
    [0, 1) with their sum < 1. min_conversations: steady-state conversations needed (int >= 1).
    max_failed_frac: failed conversations allowed, a fraction of all, [0, 1].
    min_conversations_frac: None (the fixed floor) or (0, 1]: the size-scaled floor (module docstring).
    max_dropped_frac: None (no rule) or [0, 1]: conversations dropped for the context, a fraction of the
    sampled ones (run + dropped).
    """

    warmup_frac: float = 0.1
    cooldown_frac: float = 0.1
    min_conversations: int = 100
    max_failed_frac: float = 0.01
    min_conversations_frac: Optional[float] = None
    max_dropped_frac: Optional[float] = None

    def steady_floor(self, num_conversations: int) -> int:
        """The steady-state conversations a valid run of ``num_conversations`` needs (module docstring)."""
        if self.min_conversations_frac is None:
            return self.min_conversations
        share = num_conversations * (1 - self.warmup_frac - self.cooldown_frac)
        return min(self.min_conversations, max(1, math.ceil(self.min_conversations_frac * share - 1e-9)))

    def validate(self, where: str = "validity") -> None:
        """Raise ``ValueError`` naming ``validity.<field>`` for the first invalid value."""
        for key in ("warmup_frac", "cooldown_frac"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and 0 <= v < 1):
                raise ValueError(f"{where}.{key} must be in [0, 1), got {v!r}")
        if not self.warmup_frac + self.cooldown_frac < 1:
            raise ValueError(f"{where}.warmup_frac + {where}.cooldown_frac must be < 1, got "
                             f"{self.warmup_frac + self.cooldown_frac}")
        if not (isinstance(self.min_conversations, int) and self.min_conversations >= 1):
            raise ValueError(f"{where}.min_conversations must be an int >= 1, got {self.min_conversations!r}")
        if not (isinstance(self.max_failed_frac, (int, float)) and 0 <= self.max_failed_frac <= 1):
            raise ValueError(f"{where}.max_failed_frac must be in [0, 1], got {self.max_failed_frac!r}")
        f = self.min_conversations_frac
        if f is not None and not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise ValueError(f"{where}.min_conversations_frac must be null or in (0, 1], got {f!r}")
        d = self.max_dropped_frac
        if d is not None and not (isinstance(d, (int, float)) and 0 <= d <= 1):
            raise ValueError(f"{where}.max_dropped_frac must be null or in [0, 1], got {d!r}")


def _pct(values: np.ndarray, q: float) -> float:
    v = values[np.isfinite(values)] if len(values) else values
    return float(np.percentile(v, q)) if len(v) else math.nan


def _pcts(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """Each ``q`` of ``qs`` (0-100) as the percentile of the finite ``values`` (numpy's linear rule; NaN
    without any): one copy and one partition for every ``q``, the same floats as one
    ``numpy.percentile(finite, q)`` per ``q``."""
    v = values[np.isfinite(values)] if len(values) else values
    if not len(v) or not len(qs):
        return [math.nan] * len(qs)
    return [float(x) for x in np.percentile(v, [float(q) for q in qs], overwrite_input=True)]


def pname(q: float) -> str:
    """The key part of a percentile: 50 -> ``p50``, 99.9 -> ``p99.9``."""
    return f"p{q:g}"


def serving_metrics(turns: pd.DataFrame, window_s: float, percentiles: Sequence[float],
                    itl_gaps: Any) -> dict:
    """Throughput and latency percentiles of the completed turns (module docstring); units in the keys.

    ``itl_gaps``: the pooled inter-token gaps of every completed turn, s: a ``harness.core.recorder.ItlPool``
    (its mean and percentiles in one pass over its buffer, no copy), an array, or None (no gaps).
    """
    ok = turns[turns.status == "ok"] if len(turns) else turns
    prompt = int(ok.prompt_tokens.sum()) if len(ok) else 0
    gen = int(ok.output_tokens.sum()) if len(ok) else 0
    per_s = (lambda x: x / window_s) if window_s > 0 else (lambda x: math.nan)
    out = {"request_throughput_per_s": per_s(len(ok)), "prompt_token_throughput_per_s": per_s(prompt),
           "output_token_throughput_per_s": per_s(gen), "total_token_throughput_per_s": per_s(prompt + gen)}
    cols = {"ttft": ok.ttft_s, "tpot": ok.tpot_s, "e2e": ok.e2e_s} if len(ok) else {}
    for name in ("ttft", "tpot", "e2e"):
        v = cols[name].to_numpy(dtype=float) if name in cols else np.empty(0)
        finite = v[np.isfinite(v)]
        out[f"{name}_mean_s"] = float(finite.mean()) if len(finite) else math.nan
        for q, x in zip(percentiles, _pcts(finite, percentiles)):
            out[f"{name}_{pname(q)}_s"] = x
    if hasattr(itl_gaps, "stats"):   # a harness.core.recorder.ItlPool
        mean, pct = itl_gaps.stats(percentiles)
        out["itl_mean_s"] = mean
        for q in percentiles:
            out[f"itl_{pname(q)}_s"] = pct[float(q)]
        return out
    gaps = np.asarray(itl_gaps, dtype=float) if itl_gaps is not None else np.empty(0)
    out["itl_mean_s"] = float(gaps.mean()) if len(gaps) else math.nan
    for q, x in zip(percentiles, _pcts(gaps, percentiles)):
        out[f"itl_{pname(q)}_s"] = x
    return out


def steady_state(conv: pd.DataFrame, cfg: ValidityConfig) -> tuple[pd.DataFrame, float, float]:
    """The steady-state conversations and the window of arrivals they come from, ``(rows, from_s, to_s)``."""
    if not len(conv):
        return conv, math.nan, math.nan
    t0, t1 = float(conv.arrival_s.min()), float(conv.arrival_s.max())
    lo, hi = t0 + cfg.warmup_frac * (t1 - t0), t1 - cfg.cooldown_frac * (t1 - t0)
    return conv[(conv.arrival_s >= lo) & (conv.arrival_s <= hi)], lo, hi


def verdict(summary: dict, conv: pd.DataFrame, cfg: ValidityConfig) -> dict:
    """Steady-state metrics and the run's verdict: ``valid``, ``invalid_reasons`` and ``validity_flags`` (the
    keys of :data:`FLAGS` that ``summary`` sets true; module docstring)."""
    steady, lo, hi = steady_state(conv, cfg)
    n = len(steady)
    out = {"steady_from_s": lo, "steady_to_s": hi, "steady_conversations": n,
           "steady_ttfet_p50_s": _pct(steady.ttfet_s.to_numpy(dtype=float), 50) if n else math.nan,
           "steady_ttfet_p95_s": _pct(steady.ttfet_s.to_numpy(dtype=float), 95) if n else math.nan,
           "steady_slo_attainment": float(steady.slo_met.mean()) if n and "slo_met" in steady else math.nan}
    reasons = []
    if summary.get("partial"):
        reasons.append(f"the run did not finish: {summary.get('error', '')}")
    total = summary.get("num_conversations") or 0
    floor = cfg.steady_floor(total)
    if cfg.min_conversations_frac is not None:
        out["steady_conversations_needed"] = floor
    if n < floor:
        reasons.append(f"{n} steady-state conversations < validity.min_conversations={cfg.min_conversations}"
                       if cfg.min_conversations_frac is None else
                       f"{n} steady-state conversations < {floor} (validity.min_conversations_frac="
                       f"{cfg.min_conversations_frac} of the {total} conversations' steady share, at most "
                       f"validity.min_conversations={cfg.min_conversations})")
    failed = summary.get("num_conversations_failed") or 0
    if total and failed / total > cfg.max_failed_frac:
        reasons.append(f"{failed} of {total} conversations failed (> validity.max_failed_frac={cfg.max_failed_frac})")
    dropped = summary.get("num_conversations_context_dropped") or 0
    if cfg.max_dropped_frac is not None and dropped and dropped / (total + dropped) > cfg.max_dropped_frac:
        reasons.append(f"{dropped} of {total + dropped} conversations dropped for the context "
                       f"(> validity.max_dropped_frac={cfg.max_dropped_frac}; see workload.token_scale / "
                       f"workload.context_overflow)")
    if summary.get("token_count_mismatches"):
        reasons.append(f"{summary['token_count_mismatches']} responses had the wrong token count")
    out.update(valid=not reasons, invalid_reasons=reasons, validity_flags=[f for f in FLAGS if summary.get(f)])
    return out


def failures_by_reason(turns: pd.DataFrame) -> dict[str, int]:
    """Failed turns counted by the reason's first word (e.g. ``context_length``, ``needs``, ``decode``)."""
    failed = turns[turns.status == "failed"] if len(turns) else turns
    out: dict[str, int] = {}
    for err in failed.error if len(failed) else []:
        key = (str(err).split(":")[0].split(" ")[0] or "unknown")[:40]
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def partial_run(run_dir: Path) -> str:
    """``""`` when ``run_dir/summary.json`` says the run completed, else why not (its ``error``, or that
    the summary is missing or unreadable: a run without one never finished).

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except OSError:
        return "no summary.json"
    except ValueError:
        return "summary.json is not JSON"
    if s.get("partial"):
        return f"partial: {s.get('error') or 'no error recorded'}"
    return ""
