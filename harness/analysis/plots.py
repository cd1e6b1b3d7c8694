"""User-chosen sweep figures for ``python -m harness.analysis.report``: any metric against any other (the
throughput-latency curve of ``vllm bench sweep plot`` / AIPerf's TTFT-vs-throughput plot), faceted and
filtered on the command line, and Pareto fronts.

    python -m harness.analysis.report SWEEP --x output_token_throughput_per_s --y ttft_p99_s
    python -m harness.analysis.report SWEEP --x request_goodput_per_s --y ttfet_p95_s --pareto --facet cluster.name
    python -m harness.analysis.report SWEEP --x total_token_throughput_per_s --y e2e_p50_s --filter 'scheduler.name!=wait'

Keys: any numeric column of the report's ``runs.csv`` (every ``summary.json`` scalar -- throughput,
TTFT/TPOT/E2E/ITL percentiles, TTFET readings, goodputs -- and every config key such as
``workload.rate_per_s``). One point per sweep point: the mean over its runs (seeds) of x and of y; the
runs themselves are drawn faint behind. A curve per variant (``harness.analysis.report`` ``variant``) and value of
the sweep's facets that are not panels (e.g. ``cluster.name``), its points joined in the order of the
sweep's x axis (the arrival rate, ...) when there is one, each point labelled with its value on that axis
when it is not an axis of the figure (a throughput-latency curve need not be monotone in throughput).
The title states the seeds behind each point (``n = k seeds per point``).

Pareto front (``--pareto``): the points no other point dominates, per variant and over all variants,
where "better" is larger for throughput, goodput, attainment and tokens/J and smaller for latencies
(:func:`better`), or as ``--x-better`` / ``--y-better`` say. A point dominates another when it is at
least as good on both axes and better on one.
"""

from __future__ import annotations

import argparse
import operator
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

_OPS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_HIGH = re.compile(r"(throughput|goodput|attainment|per_joule|_frac$|good_request)")


def better(key: str) -> str:
    """``high`` for throughputs, goodputs, attainments, tokens/J and fractions; ``low`` for the rest
    (latencies in s, energy, preemptions)."""
    return "high" if _HIGH.search(key) else "low"


def parse_filter(expr: str) -> tuple[str, str, Any]:
    """``"key==value"`` (ops ``== != <= >= < >``) -> ``(key, op, value)``; the value is a float when it
    parses as one. Raises ``ValueError`` naming the expression."""
    for op in ("==", "!=", "<=", ">=", "<", ">"):  # longest first
        if op in expr:
            key, _, val = expr.partition(op)
            key, val = key.strip(), val.strip()
            if not key or not val:
                break
            try:
                v: Any = float(val)
            except ValueError:
                v = val
            return key, op, v
    raise ValueError(f"--filter {expr!r}: expected KEY OP VALUE with OP one of {', '.join(_OPS)}")


def apply_filters(df: pd.DataFrame, filters: Sequence[str]) -> pd.DataFrame:
    """The rows of ``df`` meeting every filter. Raises ``ValueError`` for a key ``df`` has not."""
    for expr in filters:
        key, op, v = parse_filter(expr)
        if key not in df.columns:
            raise ValueError(f"--filter {expr!r}: no column {key!r} in the sweep's runs (see runs.csv)")
        col = df[key]
        if isinstance(v, float) and not pd.api.types.is_numeric_dtype(col):
            v = str(v if not v.is_integer() else int(v))
        if isinstance(v, str) and pd.api.types.is_numeric_dtype(col):
            raise ValueError(f"--filter {expr!r}: {key!r} is numeric, {v!r} is not")
        df = df[_OPS[op](col.astype(str) if isinstance(v, str) else col, v)]
    return df


def pareto_mask(x: np.ndarray, y: np.ndarray, x_better: str = "high", y_better: str = "low") -> np.ndarray:
    """Which of the points ``(x[i], y[i])`` no other point dominates (module docstring); NaN points are
    never on the front. Shape ``(n,)`` bool."""
    sx = 1.0 if x_better == "high" else -1.0
    sy = 1.0 if y_better == "high" else -1.0
    a, b = sx * np.asarray(x, float), sy * np.asarray(y, float)
    ok = np.isfinite(a) & np.isfinite(b)
    out = np.zeros(len(a), dtype=bool)
    for i in np.flatnonzero(ok):
        dom = ok & (a >= a[i]) & (b >= b[i]) & ((a > a[i]) | (b > b[i]))
        out[i] = not dom.any()
    return out


def points(sw: Any, x: str, y: str, facet: Optional[str] = None, filters: Sequence[str] = ()) -> pd.DataFrame:
    """One row per sweep point (and facet): ``variant``, the facet, the sweep's x axis, ``x``, ``y`` (means
    over the point's runs), ``runs``. Raises ``ValueError`` for an unknown or non-numeric key."""
    df = apply_filters(sw.runs, filters)
    for k in (x, y):
        if k not in df.columns:
            raise ValueError(f"--x/--y {k!r}: no such column in the sweep's runs (see report/runs.csv)")
        if not pd.api.types.is_numeric_dtype(df[k]):
            raise ValueError(f"--x/--y {k!r} is not numeric")
    if facet and facet not in df.columns:
        raise ValueError(f"--facet {facet!r}: no such column in the sweep's runs")
    keys = list(dict.fromkeys([*([facet] if facet else []), *sw.point_keys]))
    g = df.groupby(keys, dropna=False, sort=False)
    pts = g[[x, y]].mean().reset_index()
    pts["runs"] = g.size().to_numpy()
    return pts


def xy_figure(sw: Any, x: str, y: str, out: Path, *, facet: Optional[str] = None, filters: Sequence[str] = (),
              pareto: bool = False, x_better: Optional[str] = None, y_better: Optional[str] = None,
              name: Optional[str] = None) -> list[Path]:
    """Draw ``y`` against ``x`` for the sweep ``sw`` (``harness.analysis.report.load_sweep``) into ``out``
    (png + pdf) and write the plotted points as ``<name>.csv``; returns the files.
    ``pareto``: mark each variant's front (open circles) and the overall front (a thick grey staircase
    bounding the dominated region, its points black-edged stars); points off the overall front are faded."""
    from harness.analysis.catalog import BY_KEY
    from harness.analysis.plotting import _plt, _save, seeds_note
    pts = points(sw, x, y, facet, filters)
    # a curve per variant and per value of the sweep's other facets (e.g. cluster.name when not a panel)
    others = [k for k in sw.facets if k != facet and k in pts.columns]
    runs = apply_filters(sw.runs, filters).copy()
    for df in (pts, runs):
        df["curve"] = [", ".join([*(f"{k}={r[k]}" for k in others), *([] if r["variant"] == "all runs" and others
                                                                       else [str(r["variant"])])])
                       for _, r in df.iterrows()]
    xb, yb = x_better or better(x), y_better or better(y)
    if pareto:
        pts["pareto_variant"] = False
        for _, idx in pts.groupby([c for c in ([facet] if facet else [])] + ["curve"], sort=False).groups.items():
            sub = pts.loc[idx]
            pts.loc[idx, "pareto_variant"] = pareto_mask(sub[x].to_numpy(), sub[y].to_numpy(), xb, yb)
        pts["pareto_all"] = False
        for _, idx in (pts.groupby(facet, sort=False).groups.items() if facet else [(None, pts.index)]):
            sub = pts.loc[idx]
            pts.loc[idx, "pareto_all"] = pareto_mask(sub[x].to_numpy(), sub[y].to_numpy(), xb, yb)
    name = name or f"{'pareto' if pareto else 'xy'}_{y}_vs_{x}" + (f"_by_{facet}" if facet else "")
    name = re.sub(r"[^A-Za-z0-9_.=-]", "_", name)
    out.mkdir(parents=True, exist_ok=True)
    pts.to_csv(out / f"{name}.csv", index=False)
    plt, sns = _plt()
    facets = list(dict.fromkeys(pts[facet])) if facet else [None]
    fig, axes = plt.subplots(1, len(facets), figsize=(5.2 * len(facets), 4.0), squeeze=False)
    variants = list(dict.fromkeys(pts.curve))
    colors = dict(zip(variants, sns.color_palette("colorblind", len(variants))))
    label = (lambda k: BY_KEY[k].axis_label if k in BY_KEY else k)
    # each point labelled with its value on the sweep's own axis (e.g. the arrival rate) when that is not
    # an axis of the figure: the line joins a curve's points in that order, which need not be monotone in x
    tag = sw.x if sw.x and sw.x in pts.columns and sw.x not in (x, y) else None
    for ax, fv in zip(axes[0], facets):
        p = pts if fv is None else pts[pts[facet] == fv]
        r = runs if fv is None else runs[runs[facet] == fv]
        if pareto:
            f = p[p.pareto_all].sort_values(x)
            # the staircase bounding the dominated region: a point with x higher-is-better covers every x
            # up to its own ("pre"), with x lower-is-better every x from its own on ("post")
            ax.step(f[x], f[y], where="pre" if xb == "high" else "post", color="black", lw=2.2, alpha=0.55,
                    zorder=1, label="Pareto front (all variants)")
            # its points marked apart (black-edged stars), the dominated points faded (below)
            ax.scatter(f[x], f[y], marker="*", s=140, facecolors="gold", edgecolors="black", linewidths=0.8,
                       zorder=4, label="on the Pareto front (all variants)")
        for v in variants:
            pv = p[p.curve == v]
            if not len(pv):
                continue
            pv = pv.sort_values(tag or x)
            rv = r[r.curve == v]
            ax.scatter(rv[x], rv[y], color=colors[v], alpha=0.25, s=12, linewidths=0)
            ax.plot(pv[x], pv[y], marker="o", color=colors[v], label=v, lw=1.0 if tag else 1.4, ms=4,
                    alpha=(0.35 if pareto and not pv.pareto_all.any() else 0.8 if tag else 1.0), zorder=2)
            if pareto and (~pv.pareto_all).any():   # dominated points faded
                d_ = pv[~pv.pareto_all]
                ax.scatter(d_[x], d_[y], color=colors[v], alpha=0.3, s=18, zorder=2.5)
            if pareto:
                f = pv[pv.pareto_variant]
                ax.scatter(f[x], f[y], facecolors="none", edgecolors=colors[v], s=80, linewidths=1.4, zorder=3)
            if tag:
                for _, q in pv.iterrows():
                    ax.annotate(f"{q[tag]:g}", (q[x], q[y]), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color=colors[v])
        if pareto:
            ax.scatter([], [], facecolors="none", edgecolors="grey", s=80, linewidths=1.4,
                       label="open circle: on its curve's own front")
        ax.set_xlabel(label(x))
        ax.set_ylabel(label(y))
        if fv is not None:
            ax.set_title(f"{facet} = {fv}")
        ax.legend(fontsize=7)
    head = [f"points: mean over runs, {seeds_note(pts['runs'])}; faint dots: single runs"]
    if tag:
        head.append(f"labels: {label(tag)}")
    fig.suptitle("; ".join(head + list(filters)), y=1.02, fontsize=8)
    return [out / f"{name}.csv", *_save(fig, out, name)]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The figure options of ``python -m harness.analysis.report`` (module docstring)."""
    ap.add_argument("--x", default=None, help="x-axis key of the custom figure (a runs.csv column, e.g. "
                    "output_token_throughput_per_s)")
    ap.add_argument("--y", default=None, help="y-axis key (e.g. ttft_p99_s, tpot_p50_s, ttfet_p95_s)")
    ap.add_argument("--facet", default=None, help="one panel per value of this key (e.g. cluster.name)")
    ap.add_argument("--filter", action="append", default=[], metavar="KEY OP VALUE",
                    help="keep runs with KEY OP VALUE (OP: == != <= >= < >); repeatable")
    ap.add_argument("--pareto", action="store_true", help="mark the Pareto fronts (per variant and overall)")
    ap.add_argument("--x-better", choices=("high", "low"), default=None, help="the Pareto direction of x "
                    "(default: high for throughput/goodput/attainment, else low)")
    ap.add_argument("--y-better", choices=("high", "low"), default=None, help="the Pareto direction of y")


def from_args(sw: Any, args: argparse.Namespace, out: Path) -> list[Path]:
    """The custom figure the command line asks for (none without ``--x`` and ``--y``).

    Raises:
        ValueError: only one of ``--x``/``--y``, or a bad key or filter.
    """
    if not (args.x or args.y):
        if args.pareto or args.facet or args.filter:
            raise ValueError("--pareto/--facet/--filter need --x and --y")
        return []
    if not (args.x and args.y):
        raise ValueError("give both --x and --y")
    return xy_figure(sw, args.x, args.y, out, facet=args.facet, filters=args.filter, pareto=args.pareto,
                     x_better=args.x_better, y_better=args.y_better)
