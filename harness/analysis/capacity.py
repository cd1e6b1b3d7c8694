"""Capacity of an arm: the highest arrival rate whose latency stays bounded, found by bisection on rate.

The criterion (its first use: docs/notebook/2026-12-01_wait_measurements.md, "Capacity row"): the **window growth
ratio** of one run,

    g = mean(latency of the central window's last quarter) / mean(latency of its first quarter),

the central window being the prompts 25-75 % by arrival (the window of ``e2e_central_mean_s``) and its
quarters taken by arrival index. A stationary queue has the same latency distribution across the window,
so ``E[g] ~ 1``; an overloaded one (utilisation ``rho > 1``) adds a wait that grows linearly with the
arrival index, ``(rho - 1) i / lambda``, so ``g`` rises towards the ratio of the quarters' mean indices,
``0.6875 / 0.3125 = 2.2``, as the wait comes to dominate. A rate is **bounded** when the geometric mean of
``g`` over the seeds is at most :data:`GROWTH_BOUND` (1.25: the extra wait across the window is at most a
quarter of the early-window latency). The bound is a choice; an overload too small to add a quarter
within one run's length is read as bounded, so the capacity found depends on the run length (prompts
per run), which a report must state.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

GROWTH_BOUND = 1.25


def growth_ratio(latencies: Sequence[float]) -> float:
    """The window growth ratio of one run (dimensionless).

    ``latencies``: per-request latencies (any one unit, e.g. E2E in s) in **arrival order**, the whole run;
    the central window is ``latencies[k // 4 : 3 k // 4]`` (``k`` requests, as ``e2e_central_mean_s``), split
    into four equal parts by index (``numpy.array_split``). Returns the mean of the last part over the
    mean of the first.

    Raises:
        ValueError: fewer than 8 latencies (a central window of fewer than 4), a non-finite latency, or a
            first quarter whose mean is not positive.
    """
    x = np.asarray(latencies, dtype=float)
    if x.ndim != 1 or len(x) < 8:
        raise ValueError(f"growth_ratio: need >= 8 latencies in arrival order, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("growth_ratio: latencies must be finite")
    k = len(x)
    parts = np.array_split(x[k // 4: 3 * k // 4], 4)
    first, last = float(parts[0].mean()), float(parts[-1].mean())
    if first <= 0:
        raise ValueError(f"growth_ratio: the first quarter's mean latency must be > 0, got {first}")
    return last / first


def is_bounded(ratios: Iterable[float], bound: float = GROWTH_BOUND) -> bool:
    """Whether a rate is bounded: the geometric mean of the seeds' growth ratios ``ratios`` (one per seed,
    from :func:`growth_ratio`) is at most ``bound`` (default :data:`GROWTH_BOUND`).

    Raises:
        ValueError: no ratio, a ratio that is not finite and positive, or ``bound`` <= 0.
    """
    r = np.asarray(list(ratios), dtype=float)
    if len(r) == 0 or not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"is_bounded: need >= 1 finite positive growth ratio, got {r.tolist()}")
    if bound <= 0:
        raise ValueError(f"is_bounded: bound must be > 0, got {bound}")
    return float(np.exp(np.log(r).mean())) <= bound


def bisect_capacity(bounded_at: Callable[[float], bool], lo: float, hi: float,
                    tol: float) -> tuple[float, float, dict[float, bool]]:
    """Bisection on the arrival rate (prompts/s) for the highest bounded rate.

    ``bounded_at(rate)`` says whether ``rate`` is bounded (e.g. :func:`is_bounded` of its seeds' runs);
    ``lo < hi`` bracket the search and ``tol`` (> 0, prompts/s) is the bracket width at which it stops.
    Both ends are evaluated first. Returns ``(low, high, tried)``: ``low`` the highest rate found bounded
    and ``high`` the lowest rate above it found unbounded, so the capacity lies in ``[low, high)``, with
    ``high - low <= tol`` after bisection; ``low = -inf`` when ``lo`` itself is unbounded (capacity below
    the bracket), ``high = +inf`` when ``hi`` is bounded (above it). ``tried`` maps every evaluated rate to
    its answer. Bisection assumes boundedness falls once with the rate; a noisy criterion near capacity
    may break that, which ``tried`` shows.

    Raises:
        ValueError: ``lo >= hi`` or ``tol <= 0``.
    """
    if not (lo < hi) or not (tol > 0):
        raise ValueError(f"bisect_capacity: need lo < hi and tol > 0, got lo={lo}, hi={hi}, tol={tol}")
    tried: dict[float, bool] = {}

    def ask(r: float) -> bool:
        tried[r] = bool(bounded_at(r))
        return tried[r]

    if not ask(lo):
        return -math.inf, lo, tried
    if ask(hi):
        return hi, math.inf, tried
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if ask(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, tried


def seed_capacities(bounded_at: Callable[[float, int], bool], seeds: Iterable[int], lo: float, hi: float,
                    tol: float) -> dict[int, tuple[float, float]]:
    """The capacity of each seed alone: :func:`bisect_capacity` with ``bounded_at(rate, seed)`` (e.g. that seed's
    window growth ratio <= :data:`GROWTH_BOUND`), one bisection per seed on ``[lo, hi]`` to width ``tol``
    (prompts/s). Returns ``{seed: (low, high)}``, each the bracket ``[low, high)`` of that seed (``-inf`` /
    ``+inf`` ends when the seed's capacity lies outside ``[lo, hi]``).

    This is the WAIT table's capacity estimator (docs/wait.md, "Capacity with its uncertainty"): the spread of
    the per-seed capacities is the estimate's uncertainty (:func:`capacity_summary`), where one bisection on the
    seeds' geometric-mean growth ratio gives a single bracket with none.

    Raises:
        ValueError: as :func:`bisect_capacity`.
    """
    return {s: bisect_capacity(lambda r, s=s: bounded_at(r, s), lo, hi, tol)[:2] for s in seeds}


def capacity_summary(brackets: dict[int, tuple[float, float]]) -> dict:
    """Per-seed capacity brackets (:func:`seed_capacities`) summarised: each seed's point estimate is its
    bracket's midpoint (prompts/s; error at most half the bracket width); returns ``{"points": {seed: mid},
    "mean", "half" (the 95 % t-interval half-width over seeds, ``harness.analysis.stats.mean_ci``), "min",
    "max", "n", "outside"}`` (``outside``: the seeds whose capacity fell outside the bisection bracket; they
    have no midpoint and are left out of the mean, which is then NaN-free but biased: a report must name
    them)."""
    from harness.analysis.stats import mean_ci
    pts = {s: (lo + hi) / 2 for s, (lo, hi) in brackets.items() if math.isfinite(lo) and math.isfinite(hi)}
    mean, half, n = mean_ci(pts.values())
    vals = list(pts.values())
    return {"points": pts, "mean": mean, "half": half, "n": n, "min": min(vals) if vals else math.nan,
            "max": max(vals) if vals else math.nan,
            "outside": sorted(s for s in brackets if s not in pts)}


def capacity_text(summary: dict) -> str:
    """One capacity cell: ``mean [low, high] (min-max, n seeds)`` prompts/s from :func:`capacity_summary` (``, k
    outside`` when seeds fell outside the bisection bracket)."""
    m, h = summary["mean"], summary["half"]
    if not math.isfinite(m):
        return "outside the bracket"
    ci = f" [{m - h:.2f}, {m + h:.2f}]" if math.isfinite(h) else ""
    out = f", {len(summary['outside'])} outside" if summary["outside"] else ""
    return f"{m:.2f}{ci} ({summary['min']:.2f}-{summary['max']:.2f}, n={summary['n']}{out})"


def capacity_margin(a: dict[int, tuple[float, float]], b: dict[int, tuple[float, float]], paper_pct: float
                    ) -> tuple[float, tuple[float, float], int, int, str]:
    """Arm ``a``'s capacity over arm ``b``'s, paired on the seed: the per-seed ratio of the bracket midpoints
    (:func:`seed_capacities`; seeds outside either bracket left out), as
    :func:`harness.analysis.stats.ratio_interval` gives it (% change, 95 % interval, n, sign count), and
    :func:`harness.analysis.stats.verdict`'s word against the paper's margin ``paper_pct`` (%)."""
    from harness.analysis.stats import ratio_interval, verdict
    pa, pb = capacity_summary(a)["points"], capacity_summary(b)["points"]
    seeds = sorted(set(pa) & set(pb))
    est, ci, n, k = ratio_interval(np.log([pa[s] / pb[s] for s in seeds])) if seeds else \
        (math.nan, (math.nan, math.nan), 0, 0)
    return est, ci, n, k, verdict(est, ci, paper_pct)


def conversation_growth_ratio(turns, conv) -> float:
    """The window growth ratio (:func:`growth_ratio`) of one agentic run: each conversation's time in the serving
    system (the sum of its completed turns' E2E, ``finish_s - submit_s``, s: its latency less the replayed tool and
    think time, which no load changes) in arrival order (``conv.arrival_s``). ``turns``, ``conv``: the run's
    ``turns.parquet`` and ``conversations.parquet`` frames. NaN with fewer than 8 conversations or when one has no
    completed turn (a failed conversation)."""
    ok = turns[turns.status == "ok"]
    serv = (ok.finish_s - ok.submit_s).groupby(ok.conversation_id).sum()
    x = conv.sort_values("arrival_s", kind="stable").conversation_id.map(serv).to_numpy(dtype=float)
    if len(x) < 8 or not np.all(np.isfinite(x)):
        return math.nan
    return growth_ratio(x)

