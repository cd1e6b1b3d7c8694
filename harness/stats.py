"""Confidence intervals shared by the sweep report (``harness.report``) and the claims table
(``harness.claims``): the two-sided 95 % Student-t interval over seeds."""

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
