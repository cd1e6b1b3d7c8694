"""Seed-level confidence intervals and the one verdict rule, shared by the sweep report (``harness.analysis.report``),
its figures and the claims table (``harness.analysis.claims``); the methods are documented in docs/metrics.md
("Intervals and verdicts").

The run (seed) is the independent unit: the conversations of one run share its queue (a collapse fails
many at once), so every interval is a two-sided 95 % Student-t interval over the per-seed values, on a
scale that keeps it inside the metric's range by construction:

* a proportion (SLO attainment, a ``_frac``): the t-interval of the per-seed logits, transformed back
  (a seed at exactly 0 or 1 is moved half a conversation inside, ``0.5 / m`` from the bound, ``m`` its
  conversations);
* a count (preemptions, ``num_*``): the t-interval of ``log(1 + x)``, transformed back and cut at 0;
* a positive quantity (times, tokens/J, throughput): the t-interval of ``log x`` (the geometric mean;
  never negative; a ratio's interval is symmetric in log space);
* a non-negative quantity with a zero among its seeds: a 95 % percentile bootstrap of the mean over the
  seeds (inside the values' range);
* anything else (can be negative): the mean with the plain t-interval.

The estimate is the interval's centre transformed back (inverse logit of the mean logit, geometric
mean, ...), so it always lies inside its interval. The Wilson interval of the conversations pooled over
the seeds (:func:`wilson`) is kept only as a descriptive column (``<metric>_pooled*`` in ``points.csv``):
it treats correlated conversations as independent trials and is far too narrow.

A claim of *zero* SLO violations is judged on :func:`violation_share` (the mean violated share over seeds,
its seed-level t-interval joined with the pooled conversations' Clopper-Pearson interval), not on the
logit interval; every verdict word comes from :func:`verdict`, which reads the interval only.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Iterable, Optional

import numpy as np


@lru_cache(maxsize=4096)
def t_quantile(n: int, alpha: float = 0.05) -> float:
    """Two-sided ``1 - alpha`` Student-t quantile ``t_{1 - alpha/2, n - 1}`` for ``n`` observations (95 % by
    default; a smaller ``alpha`` is a sequential design's nominal level, ``harness.analysis.seeds``); NaN for
    n < 2."""
    if n < 2:
        return math.nan
    from scipy import stats
    return float(stats.t.ppf(1 - alpha / 2, n - 1))


def mean_ci(values: Iterable[float], alpha: float = 0.05) -> tuple[float, float, int]:
    """``(mean, half-width, n)`` of the finite values, the half-width of the two-sided ``1 - alpha`` (95 %)
    t-interval ``t_quantile(n, alpha) sd / sqrt(n)``; NaN mean for n = 0, NaN half-width for n < 2."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    half = t_quantile(n, alpha) * float(np.std(x, ddof=1)) / math.sqrt(n) if n >= 2 else math.nan
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


PROPORTION_FALLBACK_TRIALS = 100  # conversations per seed assumed for the 0/1 correction when unknown
# The equivalence margin of the verdict rule (% of the ratio, or percentage points for a claimed zero): an
# interval inside +-3 % is "no difference". 3 % lies below half of the smallest effect the ConServe paper
# claims (C3, +7.51 % tokens/J: half is 3.76 %), so an interval inside it rules out every effect the rule
# would call reproduced, and above the seed-to-seed noise of a run that nothing queues in (about +-0.5 %,
# docs/metrics.md). Override: ``python -m harness.analysis.report --margin PCT`` or ``verdict(..., margin=...)``.
EQUIVALENCE_MARGIN_PCT = 3.0
VERDICTS = ("reproduced", "same direction, smaller", "opposite", "no difference", "inconclusive")


def is_proportion(metric: str) -> bool:
    """Summary keys that are fractions of conversations (SLO attainment, shares)."""
    return metric.startswith(("slo_attainment", "steady_slo_attainment")) or metric.endswith("_frac")


def is_count(metric: str) -> bool:
    """Summary keys that are counts (never negative)."""
    return metric in ("preemptions",) or metric.startswith("num_")


def _finite(values: Iterable[Any], trials: Iterable[Any] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The finite values and, aligned with them, their trials (NaN where unknown)."""
    vals = list(values)
    tr = list(trials)
    tr = tr + [math.nan] * (len(vals) - len(tr))
    keep = [(float(v), float(t) if t is not None and np.isfinite(t) and t > 0 else math.nan)
            for v, t in zip(vals, tr) if v is not None and np.isfinite(v)]
    return (np.array([k[0] for k in keep], dtype=float), np.array([k[1] for k in keep], dtype=float))


def _t_back(z: np.ndarray, back, alpha: float = 0.05) -> tuple[float, float, float, int]:
    """``(back(mean z), back(mean z - h), back(mean z + h), n)``: the ``1 - alpha`` t-interval of ``z`` (its
    mean +- the half-width of :func:`mean_ci`) through the monotone back-transform ``back``; no bounds for
    n < 2."""
    m, h, n = mean_ci(z, alpha)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    if not np.isfinite(h):
        return float(back(m)), math.nan, math.nan, n
    return float(back(m)), float(back(m - h)), float(back(m + h)), n


def logit_t_interval(values: Iterable[float], trials: Iterable[float] = ()) -> tuple[float, float, float, int]:
    """``(estimate, low, high, n)`` of a proportion over seeds: the 95 % t-interval of the per-seed logits
    ``log(p / (1 - p))``, transformed back with ``1 / (1 + exp(-z))``, so it lies in (0, 1). A seed at 0 or 1
    (no finite logit) is moved half a conversation inside its bound: ``p = 0.5 / m`` or ``1 - 0.5 / m`` with
    ``m`` its ``trials`` (conversations; :data:`PROPORTION_FALLBACK_TRIALS` where unknown) -- the
    continuity correction of the empirical logit (Cox & Snell, Analysis of Binary Data, 1989, sec. 2.1.6).
    When every seed has the same value the estimate is that value and the interval has zero width.

    Raises:
        ValueError: a value outside [0, 1].
    """
    p, m = _finite(values, trials)
    if len(p) == 0:
        return math.nan, math.nan, math.nan, 0
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"proportion outside [0, 1]: {p.tolist()}")
    if len(p) >= 2 and np.all(p == p[0]):
        return float(p[0]), float(p[0]), float(p[0]), len(p)
    m = np.where(np.isfinite(m), m, PROPORTION_FALLBACK_TRIALS)
    q = np.where(p == 0, 0.5 / m, np.where(p == 1, 1 - 0.5 / m, p))
    return _t_back(np.log(q / (1 - q)), lambda z: 1 / (1 + math.exp(-z)))


def log_t_interval(values: Iterable[float], shift: float = 0.0, alpha: float = 0.05) -> tuple[float, float, float, int]:
    """``(estimate, low, high, n)`` over seeds of a quantity ``x > -shift``: the ``1 - alpha`` (95 %)
    t-interval of ``log(x + shift)`` transformed back with ``exp(z) - shift``. ``shift = 0``: the geometric
    mean of a positive quantity (a time, a ratio); ``shift = 1``: a count (``log(1 + x)``), whose interval
    never goes below 0.

    Raises:
        ValueError: a value ``<= -shift`` (no logarithm).
    """
    x, _ = _finite(values)
    if (x + shift <= 0).any():
        raise ValueError(f"log interval of values <= {-shift:g}: {x.tolist()}")
    return _t_back(np.log(x + shift), lambda z: math.exp(z) - shift, alpha)


def interval_kind(metric: str, values: Iterable[float]) -> str:
    """Which seed-level interval :func:`point_interval` uses for ``metric`` with these per-seed values:
    ``proportion``, ``count``, ``positive`` (all > 0: log scale), ``nonnegative`` (>= 0 with a zero:
    bootstrap) or ``real`` (plain t)."""
    if is_proportion(metric):
        return "proportion"
    if is_count(metric):
        return "count"
    x, _ = _finite(values)
    if len(x) and (x > 0).all():
        return "positive"
    if len(x) and (x >= 0).all():
        return "nonnegative"
    return "real"


def point_interval(metric: str, values: Iterable[float], trials: Iterable[float] = ()) -> tuple[float, float, float, int]:
    """``(estimate, low, high, n)`` of one metric over a point's runs (seeds, the independent unit), 95 %,
    by :func:`interval_kind`: a proportion by :func:`logit_t_interval` (``trials``: each run's conversations,
    aligned with ``values``), a count by :func:`log_t_interval` with shift 1, a positive quantity by
    :func:`log_t_interval` (geometric mean), a non-negative one with zeros by :func:`bootstrap_mean_ci`
    (estimate: the mean), anything else the mean with :func:`mean_ci`. Bounds are NaN for n < 2 (one seed
    has no interval); every bound lies in the metric's range."""
    vals, tr = list(values), list(trials)
    kind = interval_kind(metric, vals)
    if kind == "proportion":
        return logit_t_interval(vals, tr)
    if kind == "count":  # log(1 + x) can reach below log 1 = 0: the interval is cut at 0, the range's
        est, lo, hi, n = log_t_interval(vals, 1.0)  # bound (intersecting with the parameter space keeps coverage)
        return est, (max(0.0, lo) if np.isfinite(lo) else lo), hi, n
    if kind == "positive":
        return log_t_interval(vals)
    mean, half, n = mean_ci(vals)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    if n < 2:
        return mean, math.nan, math.nan, n
    if kind == "nonnegative":
        lo, hi = bootstrap_mean_ci(vals)
        return mean, lo, hi, n
    return mean, mean - half, mean + half, n


def pooled_wilson(values: Iterable[float], trials: Iterable[float]) -> tuple[float, float, float]:
    """Descriptive only: ``(p, low, high)`` of a proportion pooled over the runs' conversations, with the
    :func:`wilson` interval (conversations as independent trials -- they are not, see the module
    docstring). NaN without trials."""
    p, m = _finite(values, trials)
    ok = np.isfinite(m)
    if not ok.any():
        return math.nan, math.nan, math.nan
    succ, tot = float((p[ok] * m[ok]).sum()), float(m[ok].sum())
    return (succ / tot, *wilson(succ, tot))


def ratio_interval(log_ratios: Iterable[float], alpha: float = 0.05) -> tuple[float, tuple[float, float], int, int]:
    """A paired ratio over seeds from the per-seed log ratios ``log(a_i / b_i)``, in % change:
    ``(geometric mean - 1, (low, high) of the 1 - alpha (95 %) t-interval of the mean log ratio - 1, n, k)``,
    all x 100 except ``n`` (seeds) and ``k`` (seeds whose ratio lies on the estimate's side of 1, the sign
    count; 0 when the estimate is exactly 0). The interval is NaN for n < 2. ``alpha`` below 0.05: the
    repeated confidence interval of a sequential design (``harness.analysis.seeds``)."""
    z, _ = _finite(log_ratios)
    est, lo, hi, n = log_t_interval(np.exp(z), 0.0, alpha) if len(z) else (math.nan, math.nan, math.nan, 0)
    if n == 0:
        return math.nan, (math.nan, math.nan), 0, 0
    k = int((np.sign(z) == np.sign(math.log(est))).sum()) if est != 1 else 0
    return (est - 1) * 100, ((lo - 1) * 100, (hi - 1) * 100), n, k


def violation_share(attainment: Iterable[float], trials: Iterable[float] = (),
                    alpha: float = 0.05) -> tuple[float, float, float, int, float]:
    """``(share, low, high, n, worst)`` of the violations ``1 - attainment`` over seeds, as fractions: the
    statistic of a claim of *zero* SLO violations (C2, ``harness.analysis.claims.claim_slo``).

    * ``share``: the mean over the ``n`` seeds of each seed's violated share (every seed weighs the same,
      so one collapsed seed counts as what it is: nine seeds at 0 and one at 0.5 read 0.05);
    * ``low``, ``high``: the union of two two-sided ``1 - alpha`` (95 %) intervals. (a) The seed-level
      Student-t interval of the mean share, ``share +- t_{1-alpha/2, n-1} sd / sqrt(n)`` (:func:`mean_ci`),
      cut to [0, 1]. (b) The Clopper-Pearson interval (Clopper & Pearson, Biometrika 26, 1934) of the
      violated conversations pooled over the seeds, ``x = sum (1 - a_i) m_i`` of ``N = sum m_i``:
      ``[Beta(alpha/2; x, N - x + 1), Beta(1 - alpha/2; x + 1, N - x)]``, the bounds 0 and 1 at ``x = 0``
      and ``x = N``. (a) sees the seed-to-seed spread (a collapse) but has zero width when every seed has
      the same share; (b) counts conversations, so when every seed is perfect its upper bound
      ``1 - (alpha/2)^(1/N)`` (about 3.69 / N at 95 %; the rule of three's 3 / N is its one-sided 95 %
      form, Hanley & Lippman-Hand, JAMA 249, 1983) keeps the interval from collapsing to zero width on a
      handful of seeds. The union is at least as wide as either, so its coverage is at least theirs;
    * ``worst``: the largest seed's share (shown beside the estimate).

    ``trials``: each seed's conversations ``m_i``, aligned with ``attainment``
    (:data:`PROPORTION_FALLBACK_TRIALS` where unknown). One seed: ``low`` / ``high`` NaN (no seed-level
    interval); no seeds: all NaN and ``n = 0``.

    Raises:
        ValueError: an attainment outside [0, 1].
    """
    a, m = _finite(attainment, trials)
    n = len(a)
    if n == 0:
        return math.nan, math.nan, math.nan, 0, math.nan
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"SLO attainment outside [0, 1]: {a.tolist()}")
    v = 1.0 - a
    share, worst = float(v.mean()), float(v.max())
    if n < 2:
        return share, math.nan, math.nan, n, worst
    _, half, _ = mean_ci(v, alpha)
    m = np.where(np.isfinite(m), m, PROPORTION_FALLBACK_TRIALS)
    x, tot = float((v * m).sum()), float(m.sum())
    from scipy import stats
    cp_lo = 0.0 if x <= 0 else float(stats.beta.ppf(alpha / 2, x, tot - x + 1))
    cp_hi = 1.0 if x >= tot else float(stats.beta.ppf(1 - alpha / 2, x + 1, tot - x))
    return share, min(max(0.0, share - half), cp_lo), max(min(1.0, share + half), cp_hi), n, worst


def verdict(estimate: float, ci: tuple[float, float], paper_effect: float,
            margin: float = EQUIVALENCE_MARGIN_PCT, min_effect: Optional[float] = None) -> str:
    """The one verdict rule (docs/metrics.md, "Intervals and verdicts"), decided by the interval alone, for a
    paper's effect against a measured one, both in the same unit (% change of a ratio; percentage points
    for a claimed zero).

    ``estimate``: the measured effect (shown beside the word; only checked to be finite); ``ci``: its
    interval (low, high) over seeds; ``paper_effect``: the paper's number (its sign is the claimed
    direction; 0 claims no effect); ``margin``: the equivalence margin (same unit, >= 0); ``min_effect``:
    the size that counts as the paper's (default half the paper's, ``|paper_effect| / 2``; 0 for a claim of
    direction only). Returns one of :data:`VERDICTS`, the first rule that applies:

    0. no finite interval (one seed, no data): ``inconclusive``;
    1. margin: the interval lies inside ``[-margin, +margin]`` (ends included): ``no difference`` whatever
       its sign and whether it excludes 0 -- for a claimed zero this is ``reproduced``;
    2. for a claimed zero: the interval lies wholly beyond the margin (``low > margin`` or
       ``high < -margin``): ``opposite``; else ``inconclusive``;
    3. direction: the interval excludes 0 (strictly) on the other side: ``opposite``; it does not exclude 0
       (a bound at 0 does not): ``inconclusive``;
    4. size, on the interval: it excludes 0 on the paper's side and its far end reaches ``min_effect`` in
       magnitude (``high >= min_effect`` for a claimed increase, ``low <= -min_effect`` for a decrease):
       ``reproduced``; the whole interval lies below ``min_effect`` in magnitude: ``same direction,
       smaller``.

    Raises:
        ValueError: a negative ``margin`` or ``min_effect``, or a ``paper_effect`` that is not a finite
            number (None: no claim to judge).
    """
    if margin < 0 or (min_effect is not None and min_effect < 0):
        raise ValueError(f"verdict: margin ({margin}) and min_effect ({min_effect}) must be >= 0")
    if paper_effect is None or not np.isfinite(paper_effect):
        raise ValueError(f"verdict: paper_effect must be a finite number (the paper's claim), got {paper_effect!r}")
    lo, hi = (float(ci[0]), float(ci[1])) if ci is not None else (math.nan, math.nan)
    if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(estimate)):
        return "inconclusive"
    if -margin <= lo and hi <= margin:
        return "reproduced" if paper_effect == 0 else "no difference"
    if paper_effect == 0:
        return "opposite" if lo > margin or hi < -margin else "inconclusive"
    need = abs(paper_effect) / 2 if min_effect is None else min_effect
    near, far = (lo, hi) if paper_effect > 0 else (-hi, -lo)   # the interval's magnitudes on the paper's side
    if far < 0:
        return "opposite"
    if near <= 0:
        return "inconclusive"
    return "reproduced" if far >= need else "same direction, smaller"
