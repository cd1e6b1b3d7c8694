"""Plotting helpers shared by the sweep report (``harness.analysis.report``) and the claims figures
(``harness.analysis.claims``): the seed-level estimate and interval of a metric per group of runs, the matplotlib /
seaborn set-up, and saving a figure in every format. One module both import, so neither imports the other
for them."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from harness.analysis.stats import point_interval

FIGURE_FORMATS = ("png", "pdf")
"""The formats :func:`_save` writes by default: PNG for screens, PDF (Type 42 fonts) for papers."""
_formats: tuple[str, ...] = FIGURE_FORMATS


@contextmanager
def figure_formats(formats: Sequence[str]) -> Iterator[None]:
    """Within the block, :func:`_save` writes only ``formats`` (e.g. ``("png",)`` for an experiment logger, which
    shows images and has no use for a PDF; rendering a PDF subsets its fonts through fontTools, the slow part).

    Raises:
        ValueError: an empty ``formats`` or one not in :data:`FIGURE_FORMATS`.
    """
    global _formats
    formats = tuple(formats)
    if not formats or not set(formats) <= set(FIGURE_FORMATS):
        raise ValueError(f"figure formats must be a non-empty subset of {FIGURE_FORMATS}, got {formats!r}")
    before, _formats = _formats, formats
    try:
        yield
    finally:
        _formats = before


def seed_bars(metric: str):
    """seaborn ``(estimator, errorbar)`` callables of ``metric`` over a point's seeds: the estimate and
    95 % interval of :func:`harness.analysis.stats.point_interval` (the interval collapses to the estimate for
    n = 1). Proportions get no trials here (the 0/1 correction assumes
    ``harness.analysis.stats.PROPORTION_FALLBACK_TRIALS``); :func:`seed_frame` passes them."""
    def est(x):
        return point_interval(metric, x)[0]

    def bar(x):
        e, lo, hi, _ = point_interval(metric, x)
        return (lo, hi) if np.isfinite(lo) else (e, e)
    return est, bar


def seed_frame(df: pd.DataFrame, keys: Sequence[str], metric: str) -> pd.DataFrame:
    """Per group of ``keys``: ``est``, ``lo``, ``hi``, ``n`` of ``metric`` over the group's runs by
    :func:`harness.analysis.stats.point_interval` (with each run's ``num_conversations`` as a proportion's trials);
    ``lo`` / ``hi`` equal ``est`` where there is no interval (n = 1)."""
    rows = []
    for vals, g in df.groupby(list(keys), sort=True, dropna=False):
        vals = vals if isinstance(vals, tuple) else (vals,)
        trials = pd.to_numeric(g["num_conversations"], errors="coerce") if "num_conversations" in g else []
        e, lo, hi, n = point_interval(metric, pd.to_numeric(g[metric], errors="coerce"), trials)
        if n:
            rows.append({**dict(zip(keys, vals)), "est": e, "lo": lo if np.isfinite(lo) else e,
                         "hi": hi if np.isfinite(hi) else e, "n": n})
    return pd.DataFrame(rows, columns=[*keys, "est", "lo", "hi", "n"])


def seeds_note(counts: Sequence[int]) -> str:
    """``n = 3 seeds`` (or ``n = 3-10 seeds`` when the points differ) for the runs behind each point of a
    figure; ``counts``: seeds (runs) per point. Every figure with seed bands or bars states it."""
    c = sorted({int(k) for k in counts if k == k and k > 0})
    if not c:
        return "n = 0 seeds"
    k = f"{c[0]}" if len(c) == 1 else f"{c[0]}–{c[-1]}"
    return f"n = {k} seed{'' if c == [1] else 's'} per point"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)
    # embed TrueType (Type 42) fonts in PDF/PS, never Type 3 (journals and arXiv reject Type 3)
    matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42})
    return plt, sns


def _save(fig, out: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``<out>/<name>.<fmt>`` in each format in force (:data:`FIGURE_FORMATS`, or those of an
    enclosing :func:`figure_formats`), close it, and return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in _formats:
        p = out / f"{name}.{fmt}"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        paths.append(p)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return paths
