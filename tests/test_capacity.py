"""The capacity criterion (``harness.analysis.capacity``) on hand-made latency series: bounded and growing."""

import math

import numpy as np
import pytest

from harness.analysis.capacity import GROWTH_BOUND, bisect_capacity, growth_ratio, is_bounded


def test_growth_ratio_by_hand():
    # bounded: 80 latencies alternating 1, 2 s; the central window is 20..59, each quarter 10 values of mean 1.5
    assert growth_ratio([1.0, 2.0] * 40) == pytest.approx(1.0)
    # growing: latency 1 + 0.1 i s; quarters 20-29 and 50-59 have means 1 + 0.1 * 24.5 = 3.45 and 1 + 0.1 * 54.5
    x = [1 + 0.1 * i for i in range(80)]
    assert growth_ratio(x) == pytest.approx(6.45 / 3.45)
    assert not is_bounded([growth_ratio(x)])
    assert is_bounded([growth_ratio([1.0, 2.0] * 40)])


def _lindley(rho: float, n: int = 4000, seed: int = 1) -> np.ndarray:
    """Sojourn times of an M/M/1 queue (service rate 1) at utilisation ``rho``, by Lindley's recursion."""
    rng = np.random.default_rng(seed)
    a, s = rng.exponential(1 / rho, n), rng.exponential(1.0, n)
    w = np.zeros(n)
    for i in range(1, n):
        w[i] = max(0.0, w[i - 1] + s[i - 1] - a[i])
    return w + s


def test_queue_below_and_above_capacity():
    # below capacity (rho 0.7: mean sojourn 1 / (1 - rho) = 3.3 service times) the window does not grow;
    # above (rho 1.2) the wait grows by 1 - 1 / rho = 0.17 per arrival, so the quarters' mean waits stand
    # near 0.17 x 0.6875 n / (0.17 x 0.3125 n) = 2.2 (the mean-index ratio), well above the bound
    assert is_bounded([growth_ratio(_lindley(0.7, seed=s)) for s in range(3)])
    grow = [growth_ratio(_lindley(1.2, seed=s)) for s in range(3)]
    assert not is_bounded(grow)
    assert min(grow) > 1.5


def test_is_bounded_geometric_mean_at_the_bound():
    assert is_bounded([GROWTH_BOUND])                   # the bound itself counts as bounded
    assert is_bounded([1.1, 1.4])                       # sqrt(1.54) = 1.241
    assert not is_bounded([1.2, 1.4])                   # sqrt(1.68) = 1.296
    with pytest.raises(ValueError):
        is_bounded([])
    with pytest.raises(ValueError):
        is_bounded([1.0, math.nan])
    with pytest.raises(ValueError):
        growth_ratio([1.0] * 7)


def test_bisect_capacity_brackets_the_threshold():
    lo, hi, tried = bisect_capacity(lambda r: r < 21.3, 16.0, 28.0, 0.375)
    assert lo < 21.3 <= hi and hi - lo <= 0.375
    assert tried[16.0] and not tried[28.0] and tried[22.0] is False   # the first midpoint
    assert len(tried) == 2 + 5                          # 12 / 2^5 = 0.375
    assert bisect_capacity(lambda r: r < 10, 16.0, 28.0, 1.0)[:2] == (-math.inf, 16.0)
    assert bisect_capacity(lambda r: r < 40, 16.0, 28.0, 1.0)[:2] == (28.0, math.inf)
    with pytest.raises(ValueError):
        bisect_capacity(lambda r: True, 28.0, 16.0, 1.0)
