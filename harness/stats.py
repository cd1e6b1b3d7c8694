"""Confidence intervals shared by the sweep report (``harness.report``) and the claims table
(``harness.claims``): the two-sided 95 % Student-t interval over seeds, the Wilson interval of a proportion,
and a percentile bootstrap for counts -- each interval stays in its metric's range."""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np


def t_quantile(n: int) -> float:
    """Two-sided 95 % Student-t quantile for ``n`` observations (n - 1 degrees of freedom); NaN for n < 2."""
    if n < 2:
        return math.nan
    from scipy import stats
    return float(stats.t.ppf(0.975, n - 1))


def mean_ci(values: Iterable[float]) -> tuple[float, float, int]:
    """``(mean, 95 % CI half-width, n)`` of the finite values; NaN mean for n = 0, NaN half-width for n < 2."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    half = t_quantile(n) * float(np.std(x, ddof=1)) / math.sqrt(n) if n >= 2 else math.nan
    return float(np.mean(x)), half, n


def wilson(successes: float, trials: float, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (Wilson 1927; Agresti & Coull 1998), 95 % by default:
    ``(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``p = successes / trials``. It stays in
    [0, 1] (a mean +- t interval of a proportion does not). ``(nan, nan)`` for no trials."""
    if not trials > 0:
        return math.nan, math.nan
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_ci(values: Iterable[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of the finite values (Efron & Tibshirani 1993, ch. 13),
    from ``n_boot`` resamples drawn with a fixed seed (reproducible). The interval lies within the values'
    range, so a count's interval is never negative. ``(nan, nan)`` for fewer than 2 values."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def is_proportion(metric: str) -> bool:
    """Summary keys that are fractions of conversations (SLO attainment, shares)."""
    return metric.startswith(("slo_attainment", "steady_slo_attainment")) or metric.endswith("_frac")


def is_count(metric: str) -> bool:
    """Summary keys that are counts (never negative)."""
    return metric in ("preemptions",) or metric.startswith("num_")


def point_interval(metric: str, values: Iterable[float], trials: Iterable[float] = ()) -> tuple[float, float, float, int]:
    """``(estimate, low, high, n)`` of one metric over a point's runs (seeds), 95 %: a proportion pooled over
    the runs' conversations with a Wilson interval; a count with a bootstrap interval of the mean; anything
    else the mean with the Student-t interval (:func:`mean_ci`). Bounds are NaN where there is no interval."""
    vals = [v for v in values]
    mean, half, n = mean_ci(vals)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    if is_proportion(metric):
        pairs = [(v, t) for v, t in zip(vals, trials) if v is not None and np.isfinite(v) and t and t > 0]
        if pairs:
            succ, tot = sum(v * t for v, t in pairs), sum(t for _, t in pairs)
            lo, hi = wilson(succ, tot)
            return succ / tot, lo, hi, n
    if is_count(metric):
        lo, hi = bootstrap_mean_ci(vals)
        return mean, lo, hi, n
    if not np.isfinite(half):
        return mean, math.nan, math.nan, n
    return mean, mean - half, mean + half, n
