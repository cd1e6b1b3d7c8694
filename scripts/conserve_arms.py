"""AMPD's baseline arms beside ConServe's claims (issue 53: AMPD's knobs decide C1/C3, so vary them):

    nice -n 10 python scripts/conserve_arms.py --out DIR [--arms tuned,layout] [--rates 0.06,0.09] [--seeds 0-9] \\
        [--tuning-seeds 100-109] [--grid shipped,step10ms,...] [--objective ttfet_first_p95_s] \\
        [--reuse docs/data/conserve_sensitivity/runs.csv] [--layout-variants ampd_rd,ampd_cost] [--jobs N]

Both arms run in ``conserve_sensitivity``'s setting (``scripts/conserve_capacity.py``'s :data:`SETTING` without its
cluster), so the results page pairs them on the seed with ConServe's runs of the shipped
``docs/data/conserve_sensitivity/runs.csv`` (a40_1p3d, the same rates and seeds):

* ``tuned``: AMPD ``remote_default`` with its best thresholds per load, chosen on seeds the verdict does not use.
  At each rate every setting of :data:`TUNE_GRID` (the shipped thresholds and each one moved alone to the
  sensitivity matrix's ends: decode-step budget 10 / 30 ms, local TTFT 0.5 / 2 s, KV watermark 85 / 99 %; not the
  full 27-point grid; ``--grid`` picks some of them) runs on ``--tuning-seeds`` into ``<out>/tune/r<rate>/``; the setting with the lowest
  geometric mean of ``--objective`` over them (``harness.analysis.claims.tuned_choice``) then runs on the verdict
  ``--seeds`` into ``<out>/tuned/r<rate>/``, unless it is the shipped setting and a ``--reuse`` table holds it on
  every verdict seed (the page then reads it there). ``<out>/tuned.json`` records each rate's scores and choice.
* ``layout``: AMPD (``--layout-variants``) on ``a40_2p2d``, the same four A40s as ``a40_1p3d`` laid out 2
  prefillers + 2 decoders, on the verdict seeds into ``<out>/layout/r<rate>/``.

Then ``scripts/conserve_tables.py <out>/tune <out>/tuned <out>/layout --out docs/data/conserve_arms`` makes the
table the results page reads (``harness.analysis.results.arms_rows``). Complete runs are skipped (a rerun resumes).

Exit status: 0 done, 1 a run failed, 2 bad arguments (one ``error:`` line naming the flag, before any run), 130
interrupted.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conserve_capacity import SETTING  # noqa: E402

BASE = [o for o in SETTING if not o.startswith("cluster=")]
ARMS = ("tuned", "layout")
LAYOUT_CLUSTER = "a40_2p2d"
LAYOUT_VARIANTS = {"ampd_rd": ["scheduler=ampd", "scheduler.mode=remote_default"],
                   "ampd_cost": ["scheduler=ampd", "scheduler.mode=cost"], "conserve": ["scheduler=conserve"]}
# AMPD's thresholds (baselines/ampd.py AmpdConfig: shipped 15 ms, 1 s, 0.95; the ends the sensitivity matrix moves
# them to, conf/experiment/conserve_sensitivity.yaml "knob"), one at a time: {name: overrides}
TUNE_GRID = {"shipped": [], "step10ms": ["scheduler.tpot_slo_s=0.01"], "step30ms": ["scheduler.tpot_slo_s=0.03"],
             "ttft0.5s": ["scheduler.ttft_slo_s=0.5"], "ttft2s": ["scheduler.ttft_slo_s=2"],
             "kv0.85": ["scheduler.kv_high_frac=0.85"], "kv0.99": ["scheduler.kv_high_frac=0.99"]}
TUNE_KEYS = ("scheduler.tpot_slo_s", "scheduler.ttft_slo_s", "scheduler.kv_high_frac")


def grid_rows(cells: dict[str, Path], rate: float, seeds: Sequence[int], objective: str) -> list[dict]:
    """The tuning runs as rows for :func:`harness.analysis.claims.tuned_choice`: per grid setting (``cells``:
    ``{name: its run directory prefix}``) and seed, the AMPD thresholds (:data:`TUNE_KEYS`, from the run's
    ``config.yaml``) and ``objective`` (from ``summary.json``; NaN where missing)."""
    import yaml
    rows = []
    for name, prefix in cells.items():
        for s in seeds:
            d = prefix.parent / f"{prefix.name}_seed{s}"
            cfg = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").is_file() else {}
            summ = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
            sch = cfg.get("scheduler", {}) if isinstance(cfg, dict) else {}
            rows.append({"setting": name, "scheduler.name": "ampd", "scheduler.mode": "remote_default",
                         **{k: sch.get(k.split(".", 1)[1], math.nan) for k in TUNE_KEYS},
                         "workload.rate_per_s": rate, "workload.seed": s,
                         objective: float(summ[objective]) if isinstance(summ.get(objective), (int, float)) else math.nan})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Bad arguments: one ``error:`` line naming the flag, exit 2, before any run."""
    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python scripts/conserve_arms.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"from {', '.join(ARMS)} (default both)")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default=[0.06, 0.09],
                    help="arrival rates, conv/s (default 0.06,0.09: conserve_sensitivity's 10-seed rates)")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True, ranges=True), default=list(range(10)),
                    help="the verdict's seeds (default 0-9)")
    ap.add_argument("--tuning-seeds", type=cmdline.number_list(0, integer=True, ranges=True),
                    default=list(range(100, 110)), help="the seeds the tuned arm's thresholds are chosen on "
                    "(default 100-109: the 10 seeds harness.analysis.seed_audit asks of a near-capacity cell; none "
                    "of them a verdict seed)")
    ap.add_argument("--grid", default=",".join(TUNE_GRID), help=f"the tuned arm's settings, from {', '.join(TUNE_GRID)} "
                    "(default all; shipped always)")
    ap.add_argument("--objective", default="ttfet_first_p95_s",
                    help="the summary key the tuned arm minimises (geometric mean over the tuning seeds; default "
                         "ttfet_first_p95_s, the reading C1's reproduced cells are on)")
    ap.add_argument("--reuse", type=Path, action="append", default=[],
                    help="a runs table of this setting (scripts/conserve_tables.py's runs.csv) holding the shipped "
                         "AMPD setting's verdict runs (repeatable)")
    ap.add_argument("--layout-variants", default="ampd_rd,ampd_cost",
                    help=f"variants run on {LAYOUT_CLUSTER} (from {', '.join(LAYOUT_VARIANTS)}; default ampd_rd,ampd_cost)")
    ap.add_argument("--jobs", type=cmdline.number(1, integer=True), default=None,
                    help="worker processes per run.py sweep (hydra.launcher.n_jobs; default: run.py's, the cores)")
    a = ap.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ARMS for x in arms):
        ap.error(f"--arms: from {', '.join(ARMS)}; got {a.arms!r}")
    lay = [x for x in a.layout_variants.split(",") if x]
    if "layout" in arms and (not lay or any(x not in LAYOUT_VARIANTS for x in lay)):
        ap.error(f"--layout-variants: from {', '.join(LAYOUT_VARIANTS)}; got {a.layout_variants!r}")
    grid = ["shipped", *[g for g in a.grid.split(",") if g and g != "shipped"]]
    if any(g not in TUNE_GRID for g in grid):
        ap.error(f"--grid: from {', '.join(TUNE_GRID)}; got {a.grid!r}")
    if set(a.seeds) & set(a.tuning_seeds):
        ap.error(f"--tuning-seeds: must not share a seed with --seeds (the verdict's), got "
                 f"{sorted(set(a.seeds) & set(a.tuning_seeds))}")
    for p in a.reuse:
        if not p.is_file():
            ap.error(f"--reuse: no file {p}")
    import pandas as pd

    from harness.analysis.claims import AMPD_KNOB_DEFAULTS, classify, tuned_choice
    from harness.analysis.seeds import RunFailed, _label, run_arm
    jobs = [] if a.jobs is None else [f"hydra.launcher.n_jobs={a.jobs}"]
    reuse = [classify(pd.read_csv(p)) for p in a.reuse]
    record: dict = {"objective": a.objective, "tuning_seeds": a.tuning_seeds, "seeds": a.seeds,
                    "grid": {g: TUNE_GRID[g] for g in grid}, "rates": {}}
    try:
        for arm_name, rate in [(x, r) for x in arms for r in a.rates]:
            if arm_name == "tuned":
                cells = {}
                for name, ov in ((g, TUNE_GRID[g]) for g in grid):
                    arm = [*LAYOUT_VARIANTS["ampd_rd"], *ov]   # names the runs (BASE, cluster and rate common)
                    cell = a.out / "tune" / f"r{rate:g}"
                    run_arm(cell, arm, [*jobs, *BASE, "cluster=a40_1p3d", f"workload.rate_per_s={rate:g}"],
                            a.tuning_seeds)
                    cells[name] = cell / _label(arm)
                    print(f"tune r{rate:g} {name}: {len(a.tuning_seeds)} seeds done", flush=True)
                choice = tuned_choice(pd.DataFrame(grid_rows(cells, rate, a.tuning_seeds, a.objective)), a.objective,
                                      a.tuning_seeds)[float(rate)]
                moved = [f"scheduler.{k}={v:g}" for (k, d), v in zip(AMPD_KNOB_DEFAULTS.items(), choice["setting"])
                         if not math.isclose(v, d)]
                shipped_there = not moved and any(
                    len(set(r[(r._variant == "ampd_rd") & (r._tier == "a40_1p3d") & (r._sens == "base")
                              & (r._error_label == "none") & (abs(r._rate - rate) < 1e-9)]._seed) & set(a.seeds))
                    == len(a.seeds) for r in reuse)
                if not shipped_there:
                    run_arm(a.out / "tuned" / f"r{rate:g}", [*LAYOUT_VARIANTS["ampd_rd"], *moved],
                            [*jobs, *BASE, "cluster=a40_1p3d", f"workload.rate_per_s={rate:g}"], a.seeds)
                record["rates"][f"{rate:g}"] = {**choice, "verdict_runs": "a --reuse table" if shipped_there
                                                else str(a.out / "tuned" / f"r{rate:g}")}
                print(f"tuned r{rate:g}: {choice['label']} (scores {choice['scores']})", flush=True)
            if arm_name == "layout":
                for v in lay:
                    run_arm(a.out / "layout" / f"r{rate:g}", LAYOUT_VARIANTS[v],
                            [*jobs, *BASE, f"cluster={LAYOUT_CLUSTER}", f"workload.rate_per_s={rate:g}"], a.seeds)
                    print(f"layout r{rate:g} {v}: {len(a.seeds)} seeds done", flush=True)
    except RunFailed as e:
        print(f"conserve_arms: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if "tuned" in arms:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "tuned.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    from harness.core import cmdline
    sys.exit(cmdline.run(main))
