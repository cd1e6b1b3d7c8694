"""The seeds audit: at least :data:`MIN_SEEDS` (10) seeds in every cell near capacity or where a seed collapses
(issue 53: with 5 seeds at 0.075 conv/s one AMPD seed collapsed and 4 of 5 C5 cells read "inconclusive" that 10
seeds decide), run on a shipped per-run table of a ConServe preset:

    python -m harness.analysis.seed_audit docs/data/conserve_sensitivity/runs.csv docs/data/ampd_robustness/runs.csv \\
        [--capacity a40_1p3d:conserve=0.07,0.08] [--near-frac 0.8] [--collapse-factor 10]
    python -m harness.analysis.seed_audit docs/data/conserve_sensitivity/runs.csv --preset conserve_energy   # a grid

A *cell* is every run that differs only in the seed (``workload.seed``): the variant, tier, load, error arm and
workload of :func:`harness.analysis.claims.workload_frame` (a closed population's load is its N). The cells one
verdict pairs (every variant and error arm at one load, tier and workload: a *comparison group*) share the need:

* **a seed collapses** in a group when, on that seed, some cell's p95 TTFET on a reading (first, visible,
  serving-only) is at least :data:`COLLAPSE_FACTOR` times the median of the same cell's other seeds (one seed's
  queue blows up while the others' do not: the case that leaves a paired interval wide at 3-5 seeds);
* **near capacity**: the load is at least :data:`NEAR_CAPACITY_FRAC` of the lower end of the capacity bracket of
  one of the group's variants, i.e. the table cannot rule out a load within 20 % of capacity. The bracket comes from
  ``capacity`` (e.g. the bisection of ``scripts/conserve_capacity.py``) where given, else from the table itself:
  the capacity criterion of ``harness.analysis.capacity`` (a load is *bounded* when the geometric mean over its
  seeds of the conversations' window growth ratio, column ``serving_growth_ratio``, is at most 1.25,
  :func:`harness.analysis.capacity.is_bounded`) on the variant's error-free base cells: capacity lies in
  ``[highest bounded load below the first unbounded one, first unbounded load)``. A variant bounded at every load
  of the table (or a table without the column) has no located capacity: said in the result, never guessed.

A cell *fires* when its group collapses or is near capacity and it has fewer than :data:`MIN_SEEDS` seeds. The
one-seed sensitivity arms (an uncalibrated constant or an AMPD threshold moved: ``_sens`` not ``base``) are exempt:
their words come from shifting the base cell's interval (:func:`harness.analysis.claims.shifted_verdict`), which is
itself audited. With ``--preset`` the same rule is applied to the runs a preset asks for (:func:`preset_audit`:
no metrics yet, so "near capacity" only, against the brackets of ``--capacity`` and of the tables given). Exit
status: 0 no cell fires, 1 a cell fires (listed), 2 bad input (a file missing or without the columns a cell needs,
a bad ``--capacity``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from harness.analysis.capacity import GROWTH_BOUND, is_bounded
from harness.analysis.seeds import MIN_DECIDE_SEEDS
from harness.core import cmdline

MIN_SEEDS = MIN_DECIDE_SEEDS
"""Seeds a near-capacity or collapsing cell needs: the sequential rule's floor before it decides a cell
(``harness.analysis.seeds.MIN_DECIDE_SEEDS``, 10: false directional verdicts on a skewed null 8.2 % -> 4.3 %,
docs/metrics.md "Adaptive seeds")."""
NEAR_CAPACITY_FRAC = 0.8
"""A load counts as near capacity from this fraction of it on (a choice: the second of the fractions 0.5 / 0.8 /
0.95 / 1.05 at which the claims are reported, ``scripts/conserve_capacity.py``; the 0.06 conv/s cells whose 3-seed
C1 interval straddled a verdict boundary sat at about 0.86 of ConServe's capacity, scripts/make_experiment_cells.py)."""
COLLAPSE_FACTOR = 10.0
"""A seed collapses when one of its p95 TTFETs is at least this multiple of the median of its cell's other seeds
(a choice: an order of magnitude; the collapsed AMPD seed of conserve_sensitivity at 0.09 conv/s read 21.2 s
against the others' 0.09-0.80 s, docs/notebook/2026-12-03_conserve_claims_sensitivity.md)."""
P95_KEYS = ("ttfet_first_p95_s", "ttfet_visible_p95_s", "ttfet_serving_p95_s")
CELL_KEYS = ["_workload", "_timing", "_tier", "_rate", "_sens", "_variant", "_error_label"]
GROUP_KEYS = CELL_KEYS[:5]
REQUIRED = ("scheduler.name", "cluster.name", "workload.seed")


def _frame(runs: pd.DataFrame) -> pd.DataFrame:
    from harness.analysis.claims import workload_frame
    missing = [c for c in REQUIRED if c not in runs.columns]
    if missing:
        raise ValueError(f"seed audit: the runs table has no column {', '.join(missing)}")
    return workload_frame(runs)


def capacity_brackets(runs: pd.DataFrame, bound: float = GROWTH_BOUND) -> dict[tuple, tuple[float, float]]:
    """The capacity bracket ``(low, high)`` per (workload, timing, tier, variant) of a runs table, in the load's unit
    (conv/s; N for a closed population), from the error-free base cells' ``serving_growth_ratio`` (module
    docstring): ``high`` the lowest load whose cell is unbounded (:func:`harness.analysis.capacity.is_bounded` over
    its seeds, ``bound`` 1.25), ``low`` the highest bounded load below it (``-inf`` when the lowest load is already
    unbounded). A variant bounded at every load, or a table without the column, is absent (not located)."""
    r = _frame(runs)
    if "serving_growth_ratio" not in r.columns:
        return {}
    b = r[(r._sens == "base") & (r._error_label == "none")]
    out = {}
    for key, g in b.groupby(["_workload", "_timing", "_tier", "_variant"], sort=True):
        low = -math.inf
        for load in sorted(g._rate.dropna().unique()):
            x = pd.to_numeric(g[g._rate == load].serving_growth_ratio, errors="coerce").dropna()
            x = x[x > 0]
            if x.empty:
                continue
            if is_bounded(x, bound):
                low = float(load)
            else:
                out[key] = (low, float(load))
                break
    return out


def _collapses(values: pd.Series, factor: float) -> list[tuple]:
    """``[(seed, value, multiple of the others' median)]`` of :func:`collapsed_seeds`, by position (a seed may repeat)."""
    x = pd.to_numeric(values, errors="coerce")
    x = x[np.isfinite(x.to_numpy(dtype=float))]
    vals = x.to_numpy(dtype=float)
    out = []
    for i, s in enumerate(x.index):
        rest = np.delete(vals, i)
        med = float(np.median(rest)) if len(rest) else math.nan
        if med > 0 and vals[i] >= factor * med:
            out.append((s, float(vals[i]), float(vals[i]) / med))
    return out


def collapsed_seeds(values: pd.Series, factor: float = COLLAPSE_FACTOR) -> list:
    """The seeds (index of ``values``: one p95 TTFET per seed, s) whose value is at least ``factor`` times the median
    of the other seeds' values; none with fewer than 2 finite values."""
    return [s for s, _, _ in _collapses(values, factor)]


def audit(runs: pd.DataFrame, capacity: Optional[dict[tuple[str, str], tuple[float, float]]] = None,
          near_frac: float = NEAR_CAPACITY_FRAC, factor: float = COLLAPSE_FACTOR,
          min_seeds: int = MIN_SEEDS) -> pd.DataFrame:
    """Every cell of a per-run table (a shipped ``docs/data/<preset>/runs.csv``) with why it needs
    ``min_seeds`` seeds, if it does (module docstring).

    ``capacity``: ``{(tier, variant): (low, high)}`` brackets in the load's unit (e.g. conv/s) that replace the
    table's own (:func:`capacity_brackets`) for that tier and variant. Returns one row per cell: ``workload``,
    ``timing``, ``tier``, ``load``, ``arm`` (``base`` or the sensitivity arm), ``variant``, ``error`` (the error
    label), ``seeds`` (how many), ``collapsed`` (the group's collapsed seeds, text: ``variant error seed s: reading
    x s = k x the median``), ``near`` (text: the bracket and the fraction, or ``not located``), ``needs`` (bool:
    collapses or near capacity, and not an exempt sensitivity arm) and ``fires`` (``needs`` and fewer than
    ``min_seeds`` seeds).

    Raises:
        ValueError: a table without a column a cell needs (:data:`REQUIRED`), ``near_frac`` not in (0, 1],
            ``factor`` <= 1 or ``min_seeds`` < 2.
    """
    if not (0 < near_frac <= 1) or not factor > 1 or min_seeds < 2:
        raise ValueError(f"seed audit: need 0 < near_frac <= 1, factor > 1, min_seeds >= 2; got {near_frac}, "
                         f"{factor}, {min_seeds}")
    r = _frame(runs)
    brackets = capacity_brackets(runs)
    capacity = capacity or {}
    rows = []
    for gkey, g in r.groupby(GROUP_KEYS, sort=True, dropna=False):
        workload, timing, tier, load, sens = gkey
        why_c = []
        for ckey, c in g.groupby(CELL_KEYS[5:], sort=True, dropna=False):
            for k in P95_KEYS:
                if k not in c.columns:
                    continue
                v = pd.Series(pd.to_numeric(c[k], errors="coerce").to_numpy(), index=c._seed.to_numpy())
                for s, x, mult in _collapses(v, factor):
                    why_c.append(f"{ckey[0]} {ckey[1]} seed {s:g}: {k} {x:.3g} s = {mult:.0f} x the median")
        near = []
        for variant in sorted(set(g._variant)):
            br = capacity.get((tier, variant)) or brackets.get((workload, timing, tier, variant))
            if br is None:
                near.append(f"{variant}: not located")
            elif load >= near_frac * br[0]:
                near.append(f"{variant}: {load:g} >= {near_frac:g} x {br[0]:g} (capacity in [{br[0]:g}, {br[1]:g}))"
                            if math.isfinite(br[0]) else   # the table's lowest load is already past capacity
                            f"{variant}: {load:g}, capacity below {br[1]:g} (unbounded at the table's lowest load)")
        near_hit = [x for x in near if "not located" not in x]
        for ckey, c in g.groupby(CELL_KEYS[5:], sort=True, dropna=False):
            n = int(c._seed.nunique())
            needs = bool((why_c or near_hit) and sens == "base")
            rows.append({"workload": workload, "timing": timing, "tier": tier, "load": float(load), "arm": sens,
                         "variant": ckey[0], "error": ckey[1], "seeds": n, "collapsed": "; ".join(why_c),
                         "near": "; ".join(near_hit) or "; ".join(near), "needs": needs,
                         "fires": needs and n < min_seeds})
    return pd.DataFrame(rows)


def audit_markdown(cells: pd.DataFrame, min_seeds: int = MIN_SEEDS) -> list[str]:
    """The cells that need ``min_seeds`` seeds as a markdown table (the firing ones marked), one row per comparison
    group and seed count."""
    need = cells[cells.needs]
    if need.empty:
        return ["No cell collapses or is near capacity."]
    lines = [f"| workload | tier | load | seeds | cells | why | fires (< {min_seeds} seeds) |",
             "|---|---|---|---|---|---|---|"]
    for (w, t, tier, load, n), g in need.groupby(["workload", "timing", "tier", "load", "seeds"], sort=True):
        why = "; ".join(x for x in (g.collapsed.iloc[0] and "collapse: " + g.collapsed.iloc[0],
                                    g.near.iloc[0] and "near capacity: " + g.near.iloc[0]) if x)
        lines.append(f"| {w} ({t}) | {tier} | {load:g} | {n} | "
                     f"{', '.join(sorted({f'{v} {e}' for v, e in zip(g.variant, g.error)}))} | {why} | "
                     f"{'**yes**' if (g.fires).any() else 'no'} |")
    return lines


# ---- the presets' grids: the same audit on the runs a preset asks for, before any runs ----------------------------

CONF = Path(__file__).resolve().parents[2] / "conf"
CONSERVE_PRESETS = ("conserve_sensitivity", "conserve_rate_sweep", "ampd_robustness", "claude_code_claims",
                    "conserve_kvbound", "conserve_energy")
"""The ConServe presets the audit covers (issue 53, "Seeds")."""
_BASE = {"scheduler.name": "conserve", "cluster.name": "a40_1p3d", "workload.name": "swebench"}   # conf/config.yaml


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _load_yaml(text: str):
    """``yaml.safe_load`` with libyaml's C loader where PyYAML has it (the same result, several times faster)."""
    import yaml
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _settings(path: Path) -> dict:
    """One override-only config file (a preset, a cell, a variant) as flat ``key: value`` settings: its
    ``override /scheduler|cluster|workload`` defaults as ``<group>.name`` and its keys (``hydra`` left out)."""
    y = _load_yaml(path.read_text()) or {}
    out = {}
    for d in y.get("defaults", []) or []:
        if isinstance(d, dict):
            for k, v in d.items():
                group = k.replace("override ", "").strip().lstrip("/")
                if group in ("scheduler", "cluster", "workload"):
                    out[f"{group}.name"] = v
    body = {k: v for k, v in y.items() if k not in ("defaults", "hydra")}
    out.update(_flat(body))
    return out


def preset_jobs(name: str, conf: Path = CONF) -> pd.DataFrame:
    """The runs ``python run.py -m +experiment=<name>`` asks for, one row each, with the columns :func:`audit` reads
    (``scheduler.name``, ``scheduler.mode``, ``cluster.name``, ``workload.*``, predictor and misroute keys, swept
    ``hardware.*`` constants): the product of the preset's ``hydra.sweeper.params`` (each value parsed by Hydra's
    override parser; ``+experiment/cell`` and ``+experiment/variant`` values read from their files,
    ``conf/experiment/{cell,variant}/``; ``scheduler=`` / ``cluster=`` as the group's name), on top of the preset's
    own settings, the workload file's ``name`` / ``arrival`` / ``rate_per_s`` / ``concurrency`` and the main config's
    defaults. Reads YAML only (no composition).

    Raises:
        FileNotFoundError: no such preset, cell or variant file."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    path = conf / "experiment" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such preset")
    preset = _settings(path)
    hydra = (_load_yaml(path.read_text()) or {}).get("hydra") or {}
    params = (hydra.get("sweeper") or {}).get("params") or {}
    parser = OverridesParser.create()
    axes = []
    for key, value in params.items():
        (ov,) = parser.parse_overrides([f"{key}={value}"])
        vals = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        axes.append((key.lstrip("+"), vals))
    rows = []
    for combo in itertools.product(*[v for _, v in axes]):
        job = {**_BASE, **preset}
        for (key, _), val in zip(axes, combo):
            if key in ("experiment/cell", "experiment/variant"):
                job.update(_settings(conf / "experiment" / key.split("/")[1] / f"{val}.yaml"))
            elif key in ("scheduler", "cluster", "workload"):
                job[f"{key}.name"] = val
            else:
                job[key] = _load_yaml(val)
        wl = conf / "workload" / f"{job['workload.name']}.yaml"
        if wl.is_file():
            w = _load_yaml(wl.read_text()) or {}
            for k in ("arrival", "rate_per_s", "concurrency"):
                job.setdefault(f"workload.{k}", w.get(k))
        rows.append(job)
    return pd.DataFrame(rows)


def preset_audit(name: str, capacity: dict[tuple[str, str], tuple[float, float]], conf: Path = CONF,
                 near_frac: float = NEAR_CAPACITY_FRAC, min_seeds: int = MIN_SEEDS) -> pd.DataFrame:
    """:func:`audit` on the grid of preset ``name`` (:func:`preset_jobs`): the runs it asks for have no metrics, so
    only "near capacity" can fire, from the brackets ``capacity`` (``{(tier, variant): (low, high)}`` in the preset's
    load unit, e.g. :func:`capacity_brackets` of a shipped table of the same setting)."""
    return audit(preset_jobs(name, conf), capacity, near_frac, min_seeds=min_seeds)


def _capacity_arg(text: str) -> tuple[tuple[str, str], tuple[float, float]]:
    """An argparse ``type=``: ``TIER:VARIANT=LOW[,HIGH]`` -> ``((tier, variant), (low, high))`` (finite numbers >= 0,
    ``HIGH`` >= ``LOW``, default ``inf``). Raises ``argparse.ArgumentTypeError`` naming what is wrong."""
    import argparse
    key, sep, vals = text.partition("=")
    tier, colon, variant = key.partition(":")
    try:
        nums = [cmdline.parse_number(v, 0) for v in vals.split(",")] if sep else []
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    if not colon or not tier or not variant or len(nums) not in (1, 2) or (len(nums) == 2 and nums[1] < nums[0]):
        raise argparse.ArgumentTypeError(f"expected TIER:VARIANT=LOW[,HIGH] with HIGH >= LOW, got {text!r}")
    return (tier, variant), (float(nums[0]), float(nums[1]) if len(nums) == 2 else math.inf)


def main(argv: Optional[list[str]] = None) -> int:
    """Command line (module docstring): print each table's cells that need :data:`MIN_SEEDS` seeds; exit 1 when a
    cell fires, 2 for bad input (before any table is judged)."""
    ap = cmdline.ArgumentParser(prog="python -m harness.analysis.seed_audit", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 no cell fires; 1 a cell fires; 2 bad input.")
    ap.add_argument("tables", nargs="*", type=Path, help="per-run tables (runs.csv) of ConServe presets")
    ap.add_argument("--preset", action="append", default=[], choices=CONSERVE_PRESETS,
                    help="also audit this preset's grid (the runs it asks for) against the capacity brackets of "
                         "--capacity and of the tables given")
    ap.add_argument("--capacity", action="append", default=[], type=_capacity_arg, metavar="TIER:VARIANT=LOW[,HIGH]",
                    help="a located capacity bracket (in the load's unit) replacing the table's own")
    ap.add_argument("--near-frac", type=cmdline.number(0, 1, lo_open=True), default=NEAR_CAPACITY_FRAC,
                    help=f"near capacity from this fraction of its bracket's low end, in (0, 1] (default "
                         f"{NEAR_CAPACITY_FRAC:g})")
    ap.add_argument("--collapse-factor", type=cmdline.number(1, lo_open=True), default=COLLAPSE_FACTOR,
                    help=f"a collapsed seed's p95 TTFET multiple of its cell's other seeds' median, > 1 (default "
                         f"{COLLAPSE_FACTOR:g})")
    a = ap.parse_args(argv)
    if not a.tables and not a.preset:
        ap.error("give a runs table or --preset")
    missing = [str(p) for p in a.tables if not p.is_file()]
    if missing:
        ap.error(f"no such table: {', '.join(missing)}")
    tables = {}
    for p in a.tables:
        try:
            tables[p] = audit(pd.read_csv(p), dict(a.capacity), a.near_frac, a.collapse_factor)
        except (ValueError, pd.errors.ParserError) as e:
            ap.error(f"{p}: {e}")
    brackets = {}
    for p in a.tables:
        for (_, _, tier, variant), br in capacity_brackets(pd.read_csv(p)).items():
            brackets.setdefault((tier, variant), br)
    brackets.update(dict(a.capacity))
    for name in a.preset:
        try:
            tables[f"preset {name}"] = preset_audit(name, brackets, near_frac=a.near_frac)
        except (ValueError, FileNotFoundError) as e:
            ap.error(f"--preset {name}: {e}")
    fired = 0
    for p, cells in tables.items():
        n = int(cells.fires.sum())
        fired += n
        print(f"## {p}: {len(cells)} cells, {int(cells.needs.sum())} need {MIN_SEEDS} seeds, {n} fire\n")
        print("\n".join(audit_markdown(cells)) + "\n")
    return 1 if fired else 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
