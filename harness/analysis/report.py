"""Turn a sweep directory into a tidy table, a markdown summary with confidence intervals, and figures.

    python -m harness.analysis.report SWEEP_DIR [--out DIR] [--no-figures] [--allow-mixed]

Reads every run directory under ``SWEEP_DIR`` (any directory holding a ``summary.json``, at any depth)
with its ``config.yaml`` and, for the figures, ``conversations.parquet`` and ``instances.parquet``
(``turns.parquet`` is summarised per run into a few columns). Writes into ``--out`` (default
``SWEEP_DIR/report``):

* ``runs.parquet`` / ``runs.csv``: the tidy table, one row per run: ``run`` (its directory, relative
  to the sweep), the swept config keys as dotted columns (``workload.rate_per_s``, ``scheduler.name``,
  ...; the usual identity keys even when they do not vary), ``variant`` (label of the non-axis swept
  settings), then every scalar of ``summary.json``;
* ``points.parquet`` / ``points.csv``: one row per sweep point (the runs that differ only in their
  seeds), with ``<metric>_mean`` (the estimate), ``<metric>_lo`` / ``<metric>_hi`` (its 95 % interval),
  ``<metric>_ci95`` (the larger distance from the estimate to a bound) and ``<metric>_n`` per metric; for
  a proportion also ``<metric>_pooled`` / ``_pooled_lo`` / ``_pooled_hi`` (descriptive only: the
  conversations pooled over the seeds with a Wilson interval);
* ``report.md``: what was swept and, per point, the estimate with its 95 % interval over the seeds
  (``harness.analysis.stats.point_interval``; the seed is the independent unit): a proportion on the logit scale,
  a count on ``log(1 + x)``, a positive quantity on the log scale (geometric mean), each transformed back
  so it stays in the metric's range (docs/metrics.md, "Intervals and verdicts"); no interval for n = 1;
* ``claims.md`` (also appended to ``report.md``) when the sweep runs ConServe against AMPD: ConServe's
  claims with paired ratios and their sensitivity (``harness.analysis.claims``); a sweep whose cells were run by
  ``python -m harness.analysis.seeds`` also gets its ``seeds.csv`` there (seeds per cell and why each stopped);
* ``twin.md`` (also appended to ``report.md``; no ``claims.md`` then) when the sweep holds runs on both
  ``backend=vllm`` and ``backend=sim`` (``+experiment=twin_conserve`` / ``twin_wait``): per claim (C1, C3, W2)
  the real and the simulated verdict with their estimates and intervals and whether they agree, the
  inputs check (same conversations and arrival times) and the real side's spread over repeated identical
  runs (``harness.analysis.twin``);
* ``figures/*.png`` and ``*.pdf`` (seaborn, Agg backend), only those whose inputs vary in the sweep:
  TTFET CDFs; p95 TTFET and SLO attainment (both TTFET readings, where the runs report them),
  conversation latency and preemptions vs arrival rate; for single-turn workloads the mean E2E over the
  central half by arrival and preemptions per turn vs arrival rate; tokens per joule per variant and tier
  (cluster); metrics vs prediction error; KV occupancy over time.

Runs that are not comparable are flagged, never silently mixed: when the runs' ``meta.json`` fingerprints
(``harness.analysis.provenance``) differ in code, or one trace file has two contents, ``report.md`` starts with a warning,
``runs.csv`` marks each run outside the majority in its ``mixed`` column, and the exit status is 3 unless
``--allow-mixed``.

Which config keys are "swept" is read from the configs, not the command line: a key is swept when its
value differs between runs. Keys whose last part contains ``seed`` are the repetition keys. A key that
is fixed by a swept group's ``name`` (e.g. ``cluster.instances`` by ``cluster.name``) is kept in the
table but is not a separate sweep dimension. Of the sweep dimensions, the arrival rate (else the
prediction error) is the x axis; ``workload.name``, ``cluster.name`` and ``model.name`` are facets;
the rest (the scheduler and e.g. ``engine.max_num_batched_tokens``) make up the ``variant``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from harness.core import cmdline
from harness.analysis.catalog import BY_KEY, REPORT, REPORT_TABLE
from harness.analysis.validity import FLAGS
from harness.analysis.stats import is_proportion, mean_ci, point_interval, pooled_wilson, t_quantile  # noqa: F401  (re-exported)
from harness.analysis.plotting import FIGURE_FORMATS, _plt, _save, seed_bars, seed_frame, seeds_note  # noqa: F401  (shared with harness.analysis.claims)

# Sweep dimensions that can serve as the x axis, in order of preference, with axis labels.
X_AXES = {
    "workload.rate_per_s": "arrival rate",
    "scheduler.predictor.sigma": "prediction error sigma (log-normal, 0 = oracle)",
    "scheduler.predictor.error_rate": "prediction error rate (fraction of predictions off)",
}
FACETS = ("workload.name", "cluster.name", "model.name")
IDENTITY = ("scheduler.name", "cluster.name", "model.name", "workload.name", "workload.kind", "workload.rate_per_s",
            "workload.seed", "logger.metrics_interval_s")
SHORT = {"max_num_batched_tokens": "mnbt"}
# The metrics the report aggregates and plots, with their labels: the metric catalog (harness.analysis.catalog).
METRICS = {k: BY_KEY[k].axis_label for k in REPORT}
MD_METRICS = REPORT_TABLE
LOG_Y = {k for k in REPORT if BY_KEY[k].log_y}
MAX_CDF_PANELS = 4
# how report.md marks a point with runs a named validity flag raised (harness.analysis.validity.FLAGS)
FLAG_MARKS = {"fluid_plan_infeasible": "⚠"}
# The ``[report]`` extra (pyproject.toml): scipy for the Student-t quantile of every interval over seeds
# (harness.analysis.stats.t_quantile), matplotlib and seaborn for the figures (not needed with --no-figures).
REPORT_EXTRA = "pip install -e '.[report]'"
EXTRA_FOR_TABLES = ("scipy",)
EXTRA_FOR_FIGURES = ("matplotlib", "seaborn")
MAX_SERIES_POINTS = 1500
SMOOTH_FRACTION = 200  # KV series: moving mean over 1/200 of the run


# ---- reading a sweep ---------------------------------------------------------------------------------


def find_runs(sweep_dir: Path) -> list[Path]:
    """Run directories under ``sweep_dir`` (those with a ``summary.json``), in job order."""
    def order(p: Path):
        rel = p.relative_to(sweep_dir)
        head = rel.parts[0].split("_")[0] if rel.parts else ""
        return (int(head) if head.isdigit() else math.inf, str(rel))
    return sorted((p.parent for p in sweep_dir.rglob("summary.json")), key=order)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"a.b.c": value}``; lists become JSON strings (hashable, comparable)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    key = prefix[:-1]
    out[key] = json.dumps(d, sort_keys=True) if isinstance(d, (list, tuple)) else d
    return out


def load_config(run_dir: Path) -> dict:
    """The run's resolved ``config.yaml`` as a flat dict (empty when missing; an interpolation that needs Hydra kept
    unresolved: ``harness.core.yamlfile.read_yaml_container``)."""
    p = run_dir / "config.yaml"
    if not p.is_file():
        return {}
    from harness.core.yamlfile import read_yaml_container
    return flatten(read_yaml_container(p))


def turn_columns(run_dir: Path) -> dict:
    """A few per-run columns from ``turns.parquet``: turns, mean queueing (s), preempted turns."""
    p = run_dir / "turns.parquet"
    if not p.is_file():
        return {}
    t = pd.read_parquet(p, columns=["queue_s", "preemptions", "status"])
    ok = t[t.status == "ok"]
    return {"turns_ok": int(len(ok)), "queue_mean_s": float(ok.queue_s.mean()) if len(ok) else math.nan,
            "turns_preempted": int((t.preemptions > 0).sum())}


def _norm(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


@dataclass
class Sweep:
    """A loaded sweep: the tidy table and the roles of its swept keys.

    swept: every config key that varies; seeds: the repetition keys among them; dims: the sweep
    dimensions (swept, not seeds, not fixed by a swept group name); x: the x-axis key (or None);
    facets: facet keys; variant_keys: the keys that make up ``variant``; mixed: what the runs mix that breaks a
    comparison (``harness.analysis.provenance.mixed_components``: ``{"code" | "trace" | "fingerprint": count}``).
    """

    root: Path
    runs: pd.DataFrame
    swept: list[str]
    seeds: list[str]
    dims: list[str]
    x: Optional[str]
    facets: list[str]
    variant_keys: list[str]
    run_dirs: dict[str, Path] = field(default_factory=dict)
    mixed: dict[str, int] = field(default_factory=dict)

    @property
    def point_keys(self) -> list[str]:
        """The columns that identify a sweep point (facets, x, variant)."""
        return [*self.facets, *([self.x] if self.x else []), "variant"]


def explained(key: str, configs: list[dict], swept: set[str]) -> bool:
    """True when ``key`` is a function of its group's swept ``name`` (e.g. ``cluster.instances``)."""
    group = key.split(".")[0]
    name = f"{group}.name"
    if key == name or name not in swept:
        return False
    seen: dict[Any, Any] = {}
    for c in configs:
        n, v = _norm(c.get(name)), _norm(c.get(key))
        if seen.setdefault(n, v) != v:
            return False
    return True


def variant_label(row: dict, keys: list[str]) -> str:
    parts = []
    for k in keys:
        v = _norm(row.get(k))
        if v is None:
            continue
        if k == "scheduler.name":
            parts.insert(0, str(v))
        else:
            last = k.split(".")[-1]
            parts.append(f"{SHORT.get(last, last)}={v:g}" if isinstance(v, float) else f"{SHORT.get(last, last)}={v}")
    return ", ".join(parts) if parts else "all runs"


def used_hardware(configs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The hardware profiles some run's cluster uses (``cluster.instances[*].hardware``). A profile no
    instance runs on (``hardware.cpu`` in an A100 sweep, say) changes no result, so a difference in it
    between runs (the profile was recalibrated between two parts of a sweep) is not a sweep dimension."""
    used: set[str] = set()
    for c in configs:
        inst = c.get("cluster.instances")
        try:
            inst = json.loads(inst) if isinstance(inst, str) else (inst or [])
        except ValueError:
            inst = []
        used |= {str(i.get("hardware")) for i in inst if isinstance(i, Mapping)}
    return used


def load_sweep(sweep_dir: Path) -> Sweep:
    """Read every run of ``sweep_dir``.

    Raises:
        FileNotFoundError: no run directory (no ``summary.json``) under ``sweep_dir``.
        ValueError: a ``summary.json`` is not JSON (naming it).
    """
    sweep_dir = Path(sweep_dir)
    dirs = find_runs(sweep_dir)
    if not dirs:
        raise FileNotFoundError(f"{sweep_dir}: no run directories (no summary.json below it)")
    configs = [load_config(d) for d in dirs]
    summaries = []
    for d in dirs:
        try:
            summaries.append(json.loads((d / "summary.json").read_text()))
        except ValueError as e:
            raise ValueError(f"{d / 'summary.json'}: not JSON ({e}); delete or re-run that job") from None
    keys: list[str] = []
    for c in configs:
        keys += [k for k in c if k not in keys]
    used = used_hardware(configs)
    swept = [k for k in keys if len({json.dumps(_norm(c.get(k)), sort_keys=True, default=str) for c in configs}) > 1
             and not (k.startswith("hardware.") and k.split(".")[1] not in used)]
    swept_set = set(swept)
    fixed = {k for k in swept if explained(k, configs, swept_set)}
    seeds = [k for k in swept if "seed" in k.split(".")[-1] and k not in fixed]
    dims = [k for k in swept if k not in seeds and k not in fixed]
    x = next((k for k in X_AXES if k in dims
              and len({_norm(c.get(k)) for c in configs} - {None}) >= 2), None)
    facets = [k for k in FACETS if k in dims]
    variant_keys = [k for k in dims if k != x and k not in facets]
    if "scheduler.name" in variant_keys:
        variant_keys.remove("scheduler.name")
        variant_keys.insert(0, "scheduler.name")
    rows = []
    run_dirs = {}
    for d, c, s in zip(dirs, configs, summaries):
        rel = str(d.relative_to(sweep_dir)) or "."
        run_dirs[rel] = d
        row: dict[str, Any] = {"run": rel}
        for k in [*IDENTITY, *swept]:
            row[k] = _norm(c.get(k))
        row["variant"] = variant_label(row, variant_keys)
        for k, v in s.items():
            if isinstance(v, (bool, int, float, str)) or v is None:
                row[k if k not in row else f"summary.{k}"] = v
        row.update(turn_columns(d))
        rows.append(row)
    mixed = _mark_mixed(rows, dirs)
    runs = pd.DataFrame(rows)
    for k in runs.columns:  # numeric config columns stay numeric (None -> NaN)
        if runs[k].dtype == object and runs[k].map(lambda v: v is None or isinstance(v, (int, float))
                                                   and not isinstance(v, bool)).all():
            runs[k] = pd.to_numeric(runs[k])
    return Sweep(sweep_dir, runs, swept, seeds, dims, x, facets, variant_keys, run_dirs, mixed)


def _mark_mixed(rows: list[dict], dirs: Sequence[Path]) -> dict[str, int]:
    """Add ``code_fingerprint``, ``trace_fingerprint`` (12 hex characters of ``meta.json``'s fingerprint, None
    when absent) and ``mixed`` (True for a run outside the most common code digest, or outside the most common
    content of its trace file, or without a fingerprint among runs that have one) to each row; returns
    ``harness.analysis.provenance.mixed_components`` of the runs."""
    from collections import Counter

    from harness.analysis.provenance import mixed_components, read_fingerprint
    fps = [read_fingerprint(d) for d in dirs]
    comp = [(f or {}).get("components") or {} for f in fps]
    code_major = Counter(c.get("code") for c in comp if c).most_common(1)
    trace_major: dict = {}
    for f, c in zip(fps, comp):
        if c:
            trace_major.setdefault(f.get("trace_path"), Counter())[c.get("trace")] += 1
    any_fp = any(comp)
    for row, f, c in zip(rows, fps, comp):
        row["code_fingerprint"] = str(c["code"])[:12] if c.get("code") else None
        row["trace_fingerprint"] = str(c["trace"])[:12] if c.get("trace") else None
        row["mixed"] = bool(any_fp and (not c or c.get("code") != code_major[0][0]
                                        or c.get("trace") != trace_major[f.get("trace_path")].most_common(1)[0][0]))
    return mixed_components(fps)


def points_table(sw: Sweep, metrics: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per sweep point: the point keys, ``runs`` (n), and per metric the seed-level estimate, its
    95 % interval (``_lo``, ``_hi``), the larger distance to a bound (``_ci95``) and n
    (:func:`harness.analysis.stats.point_interval`); for proportions also the pooled Wilson columns (descriptive)."""
    metrics = [m for m in (metrics or METRICS) if m in sw.runs.columns]
    keys = sw.point_keys
    rows = []
    for key_vals, g in sw.runs.groupby(keys, dropna=False, sort=False):
        key_vals = key_vals if isinstance(key_vals, tuple) else (key_vals,)
        row = dict(zip(keys, key_vals))
        row["runs"] = len(g)
        row["invalid_runs"] = int((g["valid"] == False).sum()) if "valid" in g else 0  # noqa: E712
        for flag in FLAGS:   # the named validity flags (harness.analysis.validity), counted per point
            row[f"{flag}_runs"] = int((g[flag] == True).sum()) if flag in g else 0  # noqa: E712
        trials = pd.to_numeric(g["num_conversations"], errors="coerce") if "num_conversations" in g else []
        for m in metrics:
            est, lo, hi, n = point_interval(m, pd.to_numeric(g[m], errors="coerce"), trials)
            half = max(est - lo, hi - est) if np.isfinite(lo) and np.isfinite(hi) else math.nan
            row[f"{m}_mean"], row[f"{m}_ci95"], row[f"{m}_n"] = est, half, n
            row[f"{m}_lo"], row[f"{m}_hi"] = lo, hi
            if is_proportion(m) and len(trials):
                row[f"{m}_pooled"], row[f"{m}_pooled_lo"], row[f"{m}_pooled_hi"] = pooled_wilson(
                    pd.to_numeric(g[m], errors="coerce"), trials)
        rows.append(row)
    return pd.DataFrame(rows)


# ---- markdown ----------------------------------------------------------------------------------------


def _fmt(mean: float, lo: float, hi: float, n: int) -> str:
    """One number format for every cell: estimate, then the 95 % interval in brackets, then n."""
    if n == 0 or not np.isfinite(mean):
        return "nan"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{mean:.4g} (n={n})"
    return f"{mean:.4g} [{lo:.4g}, {hi:.4g}] (n={n})"


def markdown(sw: Sweep, points: pd.DataFrame, figures: Sequence[Path] = ()) -> str:
    """The markdown summary: what varied, then the estimate [95 % interval] per point and metric."""
    r = sw.runs
    lines = [f"# Sweep report: `{sw.root}`", "",
             f"{len(r)} runs. Cells: estimate [95 % interval] over the seeds, the run being the independent unit "
             f"(n = runs with a value): Student-t on the logit scale for proportions, on log(1 + x) for counts, on "
             f"the log scale for positive quantities (geometric mean), each transformed back into the metric's "
             f"range (docs/metrics.md, \"Intervals and verdicts\"). All metrics, with their bounds (and the pooled "
             f"Wilson interval of proportions, descriptive only): `points.csv`; one row per run: `runs.csv`.", ""]
    if "partial" in r.columns and r.partial.fillna(False).astype(bool).any():
        lines += [f"**{int(r.partial.fillna(False).astype(bool).sum())} partial (failed) runs are included.**", ""]
    if "valid" in r.columns and (r.valid == False).any():  # noqa: E712 -- missing (older runs) is not invalid
        bad = r[r.valid == False]  # noqa: E712
        lines += [f"**{len(bad)} runs are INVALID** (`summary.json` `invalid_reasons`; marked ✗ below): "
                  + "; ".join(f"`{row.run}`" for row in bad.itertuples()) + ".", ""]
    lines.append("| swept key | role | values |")
    lines.append("|---|---|---|")
    fixed: dict[str, list[str]] = {}
    for k in sw.swept:
        if k not in sw.dims and k not in sw.seeds:
            fixed.setdefault(f"{k.split('.')[0]}.name", []).append(f"`{k}`")
            continue
        role = ("repetition (seed)" if k in sw.seeds else "x axis" if k == sw.x else "facet" if k in sw.facets
                else "variant")
        vals = r[k].dropna().unique().tolist() if k in r.columns else []
        shown = ", ".join(_num(v) for v in vals[:12]) + (", …" if len(vals) > 12 else "")
        lines.append(f"| `{k}` | {role} | {shown} |")
    lines.append("")
    for name, ks in fixed.items():
        lines.append(f"Set by `{name}` (not separate dimensions): {', '.join(ks)}.")
    if fixed:
        lines.append("")
    metrics = [m for m in MD_METRICS if f"{m}_mean" in points.columns]
    head = sw.point_keys
    lines.append("| " + " | ".join(head) + " | " + " | ".join(METRICS[m] for m in metrics) + " |")
    lines.append("|" + "---|" * (len(head) + len(metrics)))
    for _, p in points.iterrows():
        cells = ["" if _norm(p[k]) is None else _num(p[k]) for k in head]
        if p.get("invalid_runs", 0):
            cells[-1] = f"{cells[-1]} ✗{int(p['invalid_runs'])}"
        for flag, mark in FLAG_MARKS.items():
            if p.get(f"{flag}_runs", 0):
                cells[-1] = f"{cells[-1]} {mark}{int(p[f'{flag}_runs'])}"
        cells += [_fmt(p[f"{m}_mean"], p[f"{m}_lo"], p[f"{m}_hi"], int(p[f"{m}_n"])) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    for flag, mark in FLAG_MARKS.items():
        if flag in r.columns and (r[flag] == True).any():  # noqa: E712
            flagged = r[r[flag] == True]  # noqa: E712
            why = flagged[f"{flag}_reason"].dropna().iloc[0] if f"{flag}_reason" in flagged else ""
            lines += ["", f"{mark}n: n runs of the point are flagged `{flag}` ({len(flagged)} runs in all; "
                      f"`summary.json` `validity_flags`, docs/metrics.md \"Validity\"), e.g. `{flagged.iloc[0].run}`: "
                      f"{why}"]
    from harness.analysis.cost import cost_table
    cost = cost_table((row["variant"], row) for row in r.to_dict("records"))
    if cost:
        lines += ["", "## Cost per variant", "",
                  f"The runs of each variant pooled over {', '.join([*([sw.x] if sw.x else []), *sw.seeds, *sw.facets]) or 'nothing'}.",
                  "", cost]
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{f.stem}]({f.relative_to(f.parents[1]).as_posix()})" for f in figures if f.suffix == ".png"]
    return "\n".join(lines) + "\n"


# ---- figures -----------------------------------------------------------------------------------------


def rate_label(sw: Sweep) -> str:
    single = "workload.kind" in sw.runs.columns and (sw.runs["workload.kind"] == "synthetic").all()
    return "arrival rate (prompts/s)" if single else "arrival rate (conversations/s)"


def x_label(sw: Sweep) -> str:
    return rate_label(sw) if sw.x == "workload.rate_per_s" else X_AXES.get(sw.x or "", sw.x or "")


def _log_x(values: pd.Series) -> bool:
    """Log scale for an axis of positive values spanning at least a factor of 8."""
    v = values.dropna()
    return len(v) >= 2 and v.min() > 0 and v.max() / v.min() >= 8


def _plain_log_ticks(ax, axis: str = "x", ticks: Optional[Sequence[float]] = None) -> None:
    """Plain numbers (1, 2, 10, 0.5) instead of powers of ten on a log axis; ``ticks``: put the major
    ticks there (e.g. the swept values)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
    a = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(a.get_view_interval())
    decades = math.log10(hi / lo) if lo > 0 and hi > 0 else math.inf
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    a.set_major_locator(FixedLocator(list(ticks)) if ticks is not None else LogLocator(10, subs=subs))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def _styles(variants: Sequence[str]):
    """Colour, dash pattern and marker per variant, so that variants with identical results (drawn on
    top of each other) stay visible."""
    import seaborn as sns
    colors = sns.color_palette("tab10" if len(variants) <= 10 else "husl", len(variants))
    dashes = ["", (4, 1.5), (1, 1), (3, 1, 1, 1), (6, 2), (2, 2, 6, 2), (1, 2), (5, 1, 1, 1, 1, 1)]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    return ({v: colors[i] for i, v in enumerate(variants)}, {v: dashes[i % len(dashes)] for i, v in enumerate(variants)},
            {v: markers[i % len(markers)] for i, v in enumerate(variants)})


def _dash_to_ls(d):
    return "-" if d == "" else (0, d)


def _x_value_title(sw: Sweep, v: Any) -> str:
    if sw.x == "workload.rate_per_s":
        unit = "prompts/s" if rate_label(sw).endswith("(prompts/s)") else "conv/s"
        return f"rate = {v:g} {unit}"
    return f"{sw.x.split('.')[-1] if sw.x else ''} = {v:g}"


def _facet_title(keys: Sequence[str], vals: Sequence[Any]) -> str:
    return ", ".join(f"{k.split('.')[0]}: {v}" for k, v in zip(keys, vals))


def _facet_groups(sw: Sweep, df: pd.DataFrame):
    if not sw.facets:
        yield "", df
        return
    for vals, g in df.groupby(sw.facets, sort=False, dropna=False):
        vals = vals if isinstance(vals, tuple) else (vals,)
        yield _facet_title(sw.facets, vals), g


def metric_vs_x(sw: Sweep, metrics: Sequence[str], out: Path, name: str) -> list[Path]:
    """Lines of the seed-level estimate of each metric vs the x key with its 95 % interval as a band
    (:func:`seed_frame`, inside the metric's range), one colour per variant, one column per facet; variants without an x value (e.g. ConServe on a prediction-error axis) are drawn as a flat
    reference line with its band."""
    plt, sns = _plt()
    df = sw.runs
    metrics = [m for m in metrics if m in df.columns and df[m].notna().any()]
    if not metrics:
        return []
    facets = list(_facet_groups(sw, df))
    variants = list(dict.fromkeys(df["variant"]))
    palette, dashes, markers = _styles(variants)
    # one row per metric and one column per facet; a single facet lays its metrics out in a row
    across = len(facets) == 1
    rows, cols = (1, len(metrics)) if across else (len(metrics), len(facets))
    fig, grid = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.5, 3.2 * rows), squeeze=False)
    axes = [[grid[0][i]] for i in range(len(metrics))] if across else grid
    for j, (title, g) in enumerate(facets):
        with_x = g[g[sw.x].notna()]
        ref = g[g[sw.x].isna()]
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            if len(with_x):
                present = [v for v in variants if v in set(with_x["variant"])]
                agg = seed_frame(with_x, ["variant", sw.x], m)
                for v in present:
                    a = agg[agg["variant"] == v]
                    ax.plot(a[sw.x], a["est"], color=palette[v], ls=_dash_to_ls(dashes[v]), marker=markers[v],
                            label=v)
                    ax.fill_between(a[sw.x], a["lo"], a["hi"], color=palette[v], alpha=0.2, lw=0)
            for _, a in seed_frame(ref, ["variant"], m).iterrows():
                v = a["variant"]
                ax.axhline(a["est"], color=palette[v], ls="--", label=f"{v} (no {sw.x.split('.')[-1]})")
                ax.axhspan(a["lo"], a["hi"], color=palette[v], alpha=0.15)
            if _log_x(g[sw.x]):
                ax.set_xscale("log")
                xs = sorted(g[sw.x].dropna().unique())
                _plain_log_ticks(ax, "x", xs if len(xs) <= 10 else None)
            ax.set_xlabel(x_label(sw))
            ax.set_ylabel(METRICS.get(m, m))
            if is_proportion(m):
                ax.set_ylim(-0.03, 1.03)
            elif m in LOG_Y and _log_x(g[m]):
                ax.set_yscale("log")
                _plain_log_ticks(ax, "y")
            if title and i == 0:
                ax.set_title(title)
    handles, labels = [], []
    for ax in fig.axes:
        h, l = ax.get_legend_handles_labels()
        for hh, ll in zip(h, l):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
        if ax.get_legend():
            ax.get_legend().remove()
    fig.legend(handles, labels, title=f"variant\n(bands: 95 % interval,\n{seeds_note(_seeds_per_point(sw, df))})",
               loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return _save(fig, out, name)


def _seeds_per_point(sw: Sweep, df: pd.DataFrame) -> list[int]:
    """Runs (seeds) behind each sweep point of ``df``: the ``n`` of its seed-level intervals."""
    keys = [k for k in sw.point_keys if k in df.columns]
    return df.groupby(keys, dropna=False).size().tolist() if keys else [len(df)]


def conversations_frame(sw: Sweep, runs: pd.DataFrame) -> pd.DataFrame:
    """``conversations.parquet`` of ``runs`` concatenated, with the point keys attached."""
    frames = []
    for _, r in runs.iterrows():
        p = sw.run_dirs[r["run"]] / "conversations.parquet"
        if not p.is_file():
            continue
        c = pd.read_parquet(p, columns=["conversation_id", "ttfet_s", "latency_s"])
        for k in sw.point_keys:
            c[k] = r[k]
        frames.append(c)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def pick_values(values: Sequence[Any], k: int) -> list[Any]:
    """At most ``k`` of the sorted distinct ``values``, evenly spaced, first and last included."""
    v = sorted(set(values))
    if len(v) <= k:
        return v
    return [v[int(i)] for i in sorted(set(np.linspace(0, len(v) - 1, k).round().astype(int)))]


def ttfet_cdf(sw: Sweep, out: Path) -> list[Path]:
    """Empirical CDF of TTFET over all conversations of all seeds of a point; one colour per variant;
    columns: up to four x values; rows: facets. Unfinished conversations (no TTFET) are left out."""
    plt, sns = _plt()
    runs = sw.runs
    xs = pick_values(runs[sw.x].dropna().tolist(), MAX_CDF_PANELS) if sw.x else []
    if sw.x:
        runs = runs[runs[sw.x].isin(xs) | runs[sw.x].isna()]
    conv = conversations_frame(sw, runs)
    if conv.empty or conv.ttfet_s.notna().sum() == 0:
        return []
    conv = conv[conv.ttfet_s.notna() & (conv.ttfet_s > 0)]
    facet_rows = list(_facet_groups(sw, conv))
    cols = xs if xs else [None]
    fig, axes = plt.subplots(len(facet_rows), len(cols), figsize=(3.8 * len(cols) + 1.5, 3.0 * len(facet_rows)),
                             squeeze=False)
    variants = list(dict.fromkeys(sw.runs["variant"]))
    palette, dashes, _ = _styles(variants)
    for i, (title, g) in enumerate(facet_rows):
        for j, xv in enumerate(cols):
            ax = axes[i][j]
            sub = g if xv is None else g[(g[sw.x] == xv) | g[sw.x].isna()]
            if sub.empty:   # facets with their own x grids (e.g. a rate grid per workload): nothing here
                ax.set_visible(False)
                continue
            for v in variants:
                sv = sub[sub["variant"] == v]
                if len(sv):
                    sns.ecdfplot(data=sv, x="ttfet_s", color=palette[v], linestyle=_dash_to_ls(dashes[v]), ax=ax,
                                 log_scale=True)
            _plain_log_ticks(ax)
            ax.set_xlabel("TTFET (s)")
            ax.set_ylabel("fraction of conversations")
            head = [] if xv is None else [_x_value_title(sw, xv)]
            ax.set_title(", ".join([t for t in [title, *head] if t]))
    from matplotlib.lines import Line2D
    fig.legend([Line2D([], [], color=palette[v], linestyle=_dash_to_ls(dashes[v])) for v in variants], variants,
               title="variant", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return _save(fig, out, "ttfet_cdf")


def tokens_per_joule(sw: Sweep, out: Path) -> list[Path]:
    """Bars of tokens/J (seed-level estimate and 95 % interval, :func:`seed_bars`) per variant and tier
    (cluster), one panel per x value."""
    plt, sns = _plt()
    df = sw.runs[sw.runs["tokens_per_joule"].notna()]
    if df.empty:
        return []
    col = sw.x if sw.x else None
    g = sns.catplot(data=df, kind="bar", x="variant", y="tokens_per_joule", hue="cluster.name", col=col,
                    estimator=seed_bars("tokens_per_joule")[0], errorbar=seed_bars("tokens_per_joule")[1],
                    capsize=0.1, height=3.4, aspect=1.0,
                    sharey=True)
    g.set_axis_labels("variant", "tokens per joule (tokens/J)")
    if col:
        g.set_titles(col_template=("rate = {col_name} " + ("conv/s" if "conv" in x_label(sw) else "prompts/s"))
                     if sw.x == "workload.rate_per_s" else f"{sw.x.split('.')[-1]} = {{col_name}}")
    if g._legend:
        g._legend.set_title(f"tier (cluster)\n(bars: 95 % interval,\n{seeds_note(_seeds_per_point(sw, df))})")
    return _save(g.figure, out, "tokens_per_joule")


def slo_scale_curves(sw: Sweep, out: Path) -> list[Path]:
    """SLO attainment vs SLO scale (DistServe-style), one line per variant: one column per sweep point
    (facet and x value; all runs when the sweep has neither) and one row per TTFET reading, each value the
    mean over the point's seeds of the runs' ``slo_attainment_<reading>_x<scale>`` (``summary.json``,
    harness.analysis.metrics.slo_scale_curve: the same per-conversation TTFETs against one threshold per
    conversation and reading for every variant, x the scale). Nothing is drawn without those keys."""
    import re
    df = sw.runs
    pat = re.compile(r"^slo_attainment_(first|visible)_x([0-9.eE+-]+)$")
    cols = {}
    for c in df.columns:
        m = pat.match(c)
        if m and df[c].notna().any():
            cols.setdefault(m.group(1), []).append((float(m.group(2)), c))
    if not cols:
        return []
    readings = [r for r in ("first", "visible") if r in cols]
    keys = [*sw.facets, *([sw.x] if sw.x else [])]
    points = list(df.groupby(keys, sort=True, dropna=False)) if keys else [((), df)]
    variants = list(dict.fromkeys(df["variant"]))
    palette, dashes, markers = _styles(variants)
    plt, _ = _plt()
    fig, grid = plt.subplots(len(readings), len(points), figsize=(3.6 * len(points) + 1.5, 3.0 * len(readings)),
                             squeeze=False, sharey=True)
    ref = ""
    if "slo_scale_reference" in df.columns and df["slo_scale_reference"].notna().any():
        ref = str(df["slo_scale_reference"].dropna().iloc[0])
    for j, (vals, g) in enumerate(points):
        vals = vals if isinstance(vals, tuple) else (vals,)
        title = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, vals))
        for i, r in enumerate(readings):
            ax = grid[i][j]
            scales = sorted(cols[r])
            for v, vg in g.groupby("variant", sort=False):
                ys = [pd.to_numeric(vg[c], errors="coerce").mean() for _, c in scales]
                ax.plot([x for x, _ in scales], ys, color=palette[v], marker=markers[v],
                        linestyle=(0, dashes[v]) if dashes[v] else "-", label=f"{v} (n={len(vg)})")
            ax.set_xscale("log")
            ticks = []
            for x, _ in scales:   # label the scales, skipping one too close to the last labelled (log axis)
                if not ticks or x / ticks[-1] >= 1.4:
                    ticks.append(x)
            _plain_log_ticks(ax, "x", ticks)
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("SLO scale (x the base threshold)")
            if j == 0:
                ax.set_ylabel(f"SLO attainment, {r}-turn TTFET")
            if i == 0 and title:
                ax.set_title(title)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.suptitle("SLO attainment vs SLO scale" + (f" (base: {ref})" if ref else ""), y=1.02)
    fig.tight_layout()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return _save(fig, out, "slo_attainment_vs_scale")


def kv_occupancy(sw: Sweep, out: Path) -> list[Path]:
    """KV-cache occupancy of every instance over time, one panel per variant, for one run per variant:
    the first seed, the median x value, the first facet value."""
    plt, sns = _plt()
    runs = sw.runs
    if sw.facets:
        first = runs[sw.facets].iloc[0]
        runs = runs[(runs[sw.facets] == first).all(axis=1)]
    if sw.x:
        xs = sorted(runs[sw.x].dropna().unique())
        if xs:
            mid = xs[(len(xs) - 1) // 2]
            runs = runs[(runs[sw.x] == mid) | runs[sw.x].isna()]
    chosen = runs.drop_duplicates("variant", keep="first")
    frames, windows, orders = [], [], []
    for _, r in chosen.iterrows():
        p = sw.run_dirs[r["run"]] / "instances.parquet"
        if not p.is_file():
            continue
        s = pd.read_parquet(p, columns=["t_s", "instance", "kv_used_frac"])
        if s.empty:
            continue
        order = list(dict.fromkeys(s["instance"]))
        s = s.sort_values(["instance", "t_s"])
        n = int(s.groupby("instance").size().max())
        window = max(1, n // SMOOTH_FRACTION)
        s["kv_used_frac"] = (s.groupby("instance")["kv_used_frac"]
                             .transform(lambda x: x.rolling(window, min_periods=1, center=True).mean()))
        step = max(1, int(math.ceil(n / MAX_SERIES_POINTS)))
        s = s[s.groupby("instance").cumcount() % step == 0].copy()
        windows.append(window)
        orders.append(order)
        s["variant"] = r["variant"]
        frames.append(s)
    if not frames:
        return []
    df = pd.concat(frames, ignore_index=True)
    n = df.variant.nunique()
    hue_order = list(dict.fromkeys(i for o in orders for i in o))
    g = sns.relplot(data=df, kind="line", x="t_s", y="kv_used_frac", hue="instance", hue_order=hue_order,
                    col="variant",
                    col_wrap=min(3, n), height=2.8, aspect=1.4, linewidth=0.8, facet_kws={"sharex": False})
    g.set_axis_labels("simulated time (s)", "KV occupancy (fraction)")
    where = []
    if sw.facets:
        where += [f"{k.split('.')[0]}: {chosen.iloc[0][k]}" for k in sw.facets]
    if sw.x and len(chosen) and np.isfinite(chosen[sw.x].dropna().iloc[0] if chosen[sw.x].notna().any() else np.nan):
        where.append(_x_value_title(sw, chosen[sw.x].dropna().iloc[0]))
    if sw.seeds:
        where.append(", ".join(f"{k} = {_num(chosen.iloc[0][k])}" for k in sw.seeds if k in chosen.columns))
    g.set_titles(col_template="{col_name}")
    interval = sw.runs.get("logger.metrics_interval_s")
    step_s = float(interval.dropna().iloc[0]) if interval is not None and interval.notna().any() else None
    if max(windows) > 1:
        where.append(f"moving mean over {max(windows)} samples"
                     + (f" ({max(windows) * step_s:g} s)" if step_s else ""))
    if where:
        g.figure.suptitle("; ".join(where), y=1.02)
    return _save(g.figure, out, "kv_occupancy")


def figures(sw: Sweep, out: Path) -> list[Path]:
    """Draw every figure whose inputs vary in the sweep; returns the written files."""
    made: list[Path] = []
    r = sw.runs
    made += ttfet_cdf(sw, out)
    # both TTFET readings and their SLO attainments where the runs have them (older runs: the headline)
    ttfet = [k for k in ("ttfet_first_p95_s", "ttfet_visible_p95_s") if k in r.columns] or ["ttfet_p95_s"]
    slo = [k for k in ("slo_attainment_first", "slo_attainment_visible") if k in r.columns and r[k].notna().any()]
    slo = slo or ["slo_attainment"]
    if sw.x == "workload.rate_per_s":
        made += metric_vs_x(sw, ttfet, out, "p95_ttfet_vs_rate")
        made += metric_vs_x(sw, slo, out, "slo_attainment_vs_rate")
        made += metric_vs_x(sw, ["latency_p50_s", "latency_p95_s"], out, "latency_vs_rate")
        if "preemptions" in r.columns and (r.preemptions.fillna(0) > 0).any():
            made += metric_vs_x(sw, ["preemptions"], out, "preemptions_vs_rate")
        # the steady-state readings of the WAIT paper's experiments (single-turn workloads: turn = prompt)
        if "e2e_central_mean_s" in r.columns and r.get("num_turns", r.num_conversations).equals(r.num_conversations):
            made += metric_vs_x(sw, ["e2e_central_mean_s", "preemptions_per_turn"], out, "e2e_central_vs_rate")
    if sw.x in ("scheduler.predictor.sigma", "scheduler.predictor.error_rate"):
        made += metric_vs_x(sw, [*ttfet, *slo, "tokens_per_joule"], out, "metrics_vs_prediction_error")
    if "cluster.name" in sw.dims:
        made += tokens_per_joule(sw, out)
    made += slo_scale_curves(sw, out)
    made += kv_occupancy(sw, out)
    return made


# ---- entry point -------------------------------------------------------------------------------------


def report(sweep_dir: Path, out: Optional[Path] = None, draw: bool = True,
           margin: Optional[float] = None) -> dict[str, Any]:
    """Write the tidy table, points table, markdown summary and figures; returns their paths. ``margin``:
    the verdicts' equivalence margin in % (default ``harness.analysis.stats.EQUIVALENCE_MARGIN_PCT``)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    sw = load_sweep(sweep_dir)
    sw.runs.to_parquet(out / "runs.parquet", index=False)
    sw.runs.to_csv(out / "runs.csv", index=False)
    pts = points_table(sw)
    pts.to_parquet(out / "points.parquet", index=False)
    pts.to_csv(out / "points.csv", index=False)
    figs = figures(sw, out / "figures") if draw else []
    md = markdown(sw, pts, figs)
    from harness.analysis.provenance import mixed_warning
    if sw.mixed:  # first thing in report.md (runs.csv: column `mixed`)
        md = f"> **{mixed_warning(sw.mixed)}**\n\n" + md
    from harness.analysis.claims import write_claims
    from harness.analysis.stats import EQUIVALENCE_MARGIN_PCT
    from harness.analysis.twin import is_twin, write_twin
    margin = EQUIVALENCE_MARGIN_PCT if margin is None else margin
    if is_twin(sw.runs):   # runs on real vLLM and on the simulator: each side judged alone, in twin.md
        claims = None
        twin = write_twin(sw.runs, sw.run_dirs, out, margin)
        md += "\n" + twin.replace("# The twin:", "## The twin (twin.md):", 1)
    else:
        claims = write_claims(sw.runs, out, draw, margin)
    if claims:
        md += "\n" + claims.replace("# ConServe's claims vs AMPD", "## ConServe's claims vs AMPD (claims.md)", 1)
    from harness.analysis.seeds import seeds_markdown
    seeds_md = seeds_markdown(sweep_dir)  # cells run by python -m harness.analysis.seeds: why each stopped
    if seeds_md:
        md += "\n" + seeds_md
        claims = (claims or "# ConServe's claims vs AMPD\n\n") + "\n" + seeds_md
        (out / "claims.md").write_text(claims)
    (out / "report.md").write_text(md)
    return {"sweep": sw, "points": pts, "figures": figs, "out": out, "claims": claims}


def missing_extra(modules: Sequence[str]) -> list[str]:
    """The modules of ``modules`` (top-level names) that cannot be imported, in order; each one that can is
    imported here (they are imported by the report anyway)."""
    import importlib
    missing = []
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError:
            missing.append(m)
    return missing


def _extra_line(missing: Sequence[str], draw: bool) -> str:
    return (f"error: python -m harness.analysis.report needs {', '.join(missing)} (the [report] extra: scipy for "
            f"the intervals{', matplotlib and seaborn for the figures' if draw else ''}); install it with "
            f"{REPORT_EXTRA}" + ("" if not draw or set(missing) & set(EXTRA_FOR_TABLES) else
                                 ", or pass --no-figures for the tables and report.md only"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = cmdline.ArgumentParser(prog="python -m harness.analysis.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path, help="a sweep directory (results/sweeps/<time>...)")
    ap.add_argument("--out", type=cmdline.writable(directory=True), default=None,
                    help="output directory (default: SWEEP_DIR/report)")
    ap.add_argument("--no-figures", action="store_true", help="write the tables and markdown only")
    ap.add_argument("--margin", type=cmdline.number(0), default=None, metavar="PCT",
                    help="equivalence margin of the claims' verdicts, in %% of the ratio (percentage points for a "
                         "claimed zero); default 3 (harness.analysis.stats.EQUIVALENCE_MARGIN_PCT, docs/metrics.md)")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="exit 0 even when the runs mix code versions or trace contents (still flagged)")
    ap.epilog = ("Exit status: 0 written; 2 bad input (an argument not finite or out of range, an --out that cannot "
                 "be written), no run directory or an unreadable summary.json, or the [report] extra "
                 f"missing ({REPORT_EXTRA}; --no-figures needs only its scipy); 3 written, but the runs mix code "
                 "versions or contents of one trace file (meta.json fingerprints; report.md starts with a warning, "
                 "runs.csv has a `mixed` column) and --allow-mixed was not given; 130 interrupted.")
    from harness.analysis import plots  # user-chosen x/y, facets, filters, Pareto fronts (harness/analysis/plots.py)
    plots.add_arguments(ap)
    args = ap.parse_args(argv)
    draw = not args.no_figures or bool(args.x or args.y)   # --x/--y draw their figure even with --no-figures
    missing = missing_extra([*EXTRA_FOR_TABLES, *(EXTRA_FOR_FIGURES if draw else ())])
    if missing:   # before anything is read or written
        print(_extra_line(missing, draw), file=sys.stderr)
        return 2
    try:
        res = report(args.sweep_dir, args.out, draw=not args.no_figures, margin=args.margin)
        res["figures"] += plots.from_args(res["sweep"], args, res["out"] / "figures")
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:   # a module of the extra imported deeper than checked above
        if (e.name or "").partition(".")[0] not in (*EXTRA_FOR_TABLES, *EXTRA_FOR_FIGURES):
            raise
        print(_extra_line([e.name.partition(".")[0]], draw), file=sys.stderr)
        return 2
    sw = res["sweep"]
    if sw.mixed:
        from harness.analysis.provenance import mixed_warning
        print(mixed_warning(sw.mixed), file=sys.stderr)
        if not args.allow_mixed:
            print(f"-> {res['out'] / 'report.md'} (flagged); exit status 3 (pass --allow-mixed to accept)",
                  file=sys.stderr)
            return 3
    print(f"{len(sw.runs)} runs, {len(res['points'])} points; swept: {', '.join(sw.dims) or 'nothing'}"
          f"{'; repetitions: ' + ', '.join(sw.seeds) if sw.seeds else ''}")
    print(f"-> {res['out'] / 'report.md'}")
    for f in res["figures"]:
        if f.suffix == ".png":
            print(f"   {f}")
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
