"""ConServe's claims at fractions of located capacity (C2's "including saturation points" located, not asserted):

    nice -n 10 python scripts/conserve_capacity.py --out results/sweeps/conserve_capacity \\
        [--variants conserve,ampd_rd,ampd_cost] [--locate conserve,ampd_rd,ampd_cost] [--range 0.03,0.15] \\
        [--tol 0.01] [--cap-seeds 10] [--reuse docs/data/conserve_sensitivity/runs.csv] \\
        [--fractions 0.5,0.8,0.95,1.05] [--seeds 10] [--near 0.9] [--far-seeds 10] [--locate-tol T] \\
        [--skip-fractions] [--jobs N]

1. Capacity per variant on the claims cluster (:data:`SETTING`: the setting of ``conserve_sensitivity`` on
   a40_1p3d): ``harness.analysis.capacity.bisect_capacity`` on the arrival rate
   (conv/s) in ``--range`` down to a bracket of ``--tol`` conv/s; a rate is bounded when the geometric mean over
   ``--cap-seeds`` seeds of the window growth ratio of each conversation's time in the serving system
   (``harness.analysis.capacity.conversation_growth_ratio``) is at most ``GROWTH_BOUND`` (1.25). The capacity lies
   in ``[low, high)``; the run length (200 conversations) is part of the criterion (an overload too small to add
   a quarter within one run reads as bounded), as the capacity module states. ``--locate`` names the variants
   bisected (ConServe always: its capacity places the claims' rates), ``--locate-tol`` their bracket width apart
   from ConServe's. ``--reuse`` takes a probe's growth ratios
   from a compact runs table of the same setting (``scripts/conserve_tables.py``'s, e.g. the shipped
   ``docs/data/conserve_sensitivity/runs.csv``: its base runs on a40_1p3d, :func:`reused_ratios`) when the table
   holds every seed of that variant and rate, instead of running it again (the simulator is deterministic;
   ``capacity.json`` names the source of every probe).
2. Every variant at the rates ``f x low(ConServe)`` for each ``--fractions`` f (one rate per fraction for all
   variants, so the claims stay paired on the seed and rate): ``--seeds`` seeds at the fractions from ``--near``
   up (near capacity: 0.95 and 1.05 straddle ConServe's capacity), ``--far-seeds`` below it; the claims' cells,
   with ConServe's held conversations (``admission_held_conversations``: where its admission gate acts). Run in
   the order of ``--variants`` for each fraction, nearest-capacity fractions first, right after ConServe's
   capacity (the other variants' are located after them); ``--skip-fractions`` locates and records only.

Runs go to ``<out>/cap/<variant>_r<rate>/`` and ``<out>/claims/f<f>/`` through ``run.py -m`` (complete runs are
skipped: a rerun resumes, e.g. with more ``--locate`` variants); ``<out>/capacity.json`` records each located
variant's bracket, the rates tried with their geometric-mean growth ratio (under ``probes``: each probe's per-seed
ratios, the 95 % t-interval of their geometric mean and where they came from), the fraction rates and the seeds of
each fraction. Then ``scripts/conserve_tables.py <out>/claims --out docs/data/conserve_capacity`` makes the table
the results page reads (copy ``capacity.json`` beside it).

Exit status: 0 done, 1 a run failed or ConServe's capacity lies outside ``--range``, 2 bad arguments (one
``error:`` line naming the flag, before any run), 130 interrupted.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.analysis.capacity import GROWTH_BOUND, bisect_capacity, conversation_growth_ratio, is_bounded  # noqa: E402

VARIANTS = {"conserve": ["scheduler=conserve"], "ampd_rd": ["scheduler=ampd", "scheduler.mode=remote_default"],
            "ampd_cost": ["scheduler=ampd", "scheduler.mode=cost"]}
# conserve_sensitivity's setting (its preset's body, conf/experiment/conserve_sensitivity.yaml) on the homogeneous
# tier, without its sweep (tests/test_conserve_capacity.py checks they compose to the same model, workload and SLO)
SETTING = ["model=qwen3_0_6b", "workload=swebench", "cluster=a40_1p3d", "workload.num_conversations=200",
           "slo.ttfet_mode=relative", "slo.ttfet_multiple=1.5", "slo.reference_scheduler=same",
           "slo.ttfet_first_multiple=3.0", "slo.scale_reference=collocated", "logger.progress=false",
           "logger.log_decisions=false"]
CLUSTER, NUM_CONVERSATIONS = "a40_1p3d", 200     # SETTING's, for matching a reused table's rows


def growth_of(run_dir: Path) -> float:
    """The conversation growth ratio of one finished run directory (its parquet files)."""
    import pandas as pd
    return conversation_growth_ratio(pd.read_parquet(run_dir / "turns.parquet"),
                                     pd.read_parquet(run_dir / "conversations.parquet"))


def probe_record(ratios: Sequence[float], source: str) -> dict:
    """One probe's record for ``capacity.json``: the per-seed growth ratios, their geometric mean with the 95 %
    t-interval of the mean log ratio transformed back (``harness.analysis.stats.log_t_interval``; NaN for fewer
    than two finite ratios or any ratio that is not finite and positive) and ``source`` (``run`` or a table)."""
    from harness.analysis.stats import log_t_interval
    g = [float(x) for x in ratios]
    ok = len(g) > 0 and all(np.isfinite(g)) and min(g) > 0
    est, lo, hi, _ = log_t_interval(g) if ok else (math.nan, math.nan, math.nan, 0)
    return {"ratios": [round(x, 6) for x in g], "gmean": est, "interval": [lo, hi], "source": source}


def reused_ratios(tables: Sequence[tuple[str, "object"]], variant: str, rate: float,
                  seeds: int) -> Optional[tuple[list[float], str]]:
    """A probe's growth ratios from a compact runs table of this setting, or None to run it: the first of
    ``tables`` (``[(name, runs frame)]``, frames as ``scripts/conserve_tables.py`` writes them) whose base runs
    (``harness.analysis.claims.classify``: no constant moved, no AMPD threshold moved, no error arm) of ``variant``
    on :data:`CLUSTER` with :data:`NUM_CONVERSATIONS` conversations at ``rate`` (conv/s, to 1e-9) hold every seed
    0..``seeds``-1 with a finite ``serving_growth_ratio``. Returns ``(ratios in seed order, name)``."""
    import pandas as pd

    from harness.analysis.claims import classify
    for name, runs in tables:
        if "serving_growth_ratio" not in runs.columns:
            continue
        r = classify(runs)
        n = pd.to_numeric(r.get("workload.num_conversations", pd.Series(np.nan, index=r.index)), errors="coerce")
        g = r[(r._variant == variant) & (r._tier == CLUSTER) & (r._sens == "base") & (r._error_label == "none")
              & (n == NUM_CONVERSATIONS) & np.isclose(r._rate, rate, rtol=0, atol=1e-9)]
        by_seed = dict(zip(g._seed.astype(float), pd.to_numeric(g.serving_growth_ratio, errors="coerce")))
        x = [by_seed.get(float(s), math.nan) for s in range(seeds)]
        if all(np.isfinite(x)):
            return [float(v) for v in x], name
    return None


def locate(variant: str, bounded_at_seeds: Callable[[str, float], list[float]], lo: float, hi: float,
           tol: float) -> dict:
    """One variant's capacity: ``{"low", "high", "tried": {rate: geometric-mean growth ratio}}`` from
    :func:`harness.analysis.capacity.bisect_capacity`, each probe's growth ratios from ``bounded_at_seeds(variant,
    rate)`` (one per seed) judged by :func:`harness.analysis.capacity.is_bounded`. A probe with a NaN ratio (a
    failed conversation) counts as unbounded."""
    ratios: dict[float, float] = {}

    def bounded(rate: float) -> bool:
        g = bounded_at_seeds(variant, rate)
        ratios[rate] = float(np.exp(np.mean(np.log(g)))) if g and all(np.isfinite(g)) and min(g) > 0 else math.inf
        return math.isfinite(ratios[rate]) and is_bounded(g)
    low, high, _ = bisect_capacity(bounded, lo, hi, tol)
    return {"low": low, "high": high, "tried": {f"{r:g}": ratios[r] for r in sorted(ratios)}}


def fraction_rates(cap_low: float, fractions: Sequence[float]) -> dict[str, float]:
    """``{"f<f>": f x cap_low}`` (conv/s, rounded to 1e-4): the claims' rates at fixed fractions of the reference
    capacity's low end.

    Raises:
        ValueError: a capacity that is not a finite number > 0 (below or above the bisection's range)."""
    if not (math.isfinite(cap_low) and cap_low > 0):
        raise ValueError(f"the reference capacity must be a finite rate > 0 (widen --range), got {cap_low}")
    return {f"f{f:g}": round(f * cap_low, 4) for f in fractions}


def cell_arm(variant: str, rate: float) -> list[str]:
    """The overrides that name a cell's runs (``<label>_seed<k>`` directories: :data:`SETTING`, common to all, is
    passed apart so the names stay short): the variant's and the rate (conv/s)."""
    return [*VARIANTS[variant], f"workload.rate_per_s={rate:g}"]


def fraction_seeds(fractions: Sequence[float], near: float, seeds: int, far_seeds: int) -> dict[str, int]:
    """``{"f<f>": seeds}``: ``seeds`` for the fractions at or above ``near`` (near capacity), ``far_seeds`` below."""
    return {f"f{f:g}": seeds if f >= near else far_seeds for f in fractions}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Bad arguments: one ``error:`` line naming the flag, exit 2, before any run."""
    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python scripts/conserve_capacity.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="from conserve, ampd_rd, ampd_cost (conserve "
                    "included: its capacity is the reference)")
    ap.add_argument("--locate", default=None, help="the variants whose capacity is bisected (default: every "
                    "--variants; conserve always)")
    ap.add_argument("--range", type=cmdline.number_list(0, lo_open=True, min_len=2, max_len=2), default=[0.03, 0.15],
                    help="bisection bracket lo,hi, conv/s (default 0.03,0.15)")
    ap.add_argument("--tol", type=cmdline.number(0, lo_open=True), default=0.01,
                    help="bracket width to stop at, conv/s (default 0.01)")
    # 10: one run's growth ratio of 200 SWE-bench conversations spreads 0.75-2.1 at 0.06-0.09 conv/s (the
    # geometric mean over 10 seeds 1.21-1.22 at 0.06, 1.26-1.39 at 0.09, 1.21 over 3 seeds at 0.03 where nothing
    # queues: docs/data/conserve_sensitivity), so 3 seeds cannot place a rate against the 1.25 bound
    ap.add_argument("--cap-seeds", type=cmdline.number(1, integer=True), default=10,
                    help="seeds per bisection probe (default 10)")
    ap.add_argument("--reuse", type=Path, action="append", default=[],
                    help="a runs table of this setting (scripts/conserve_tables.py's runs.csv) to read a probe's "
                         "growth ratios from when it holds all its seeds (repeatable)")
    ap.add_argument("--fractions", type=cmdline.number_list(0, lo_open=True), default=[0.5, 0.8, 0.95, 1.05],
                    help="fractions of ConServe's capacity for the claims' cells (default 0.5,0.8,0.95,1.05)")
    ap.add_argument("--seeds", type=cmdline.number(2, integer=True), default=10,
                    help="seeds per claim cell near capacity (fractions >= --near; default 10)")
    ap.add_argument("--near", type=cmdline.number(0, lo_open=True), default=0.9,
                    help="the smallest fraction counted near capacity (default 0.9)")
    ap.add_argument("--far-seeds", type=cmdline.number(2, integer=True), default=None,
                    help="seeds per claim cell below --near (default: --seeds)")
    ap.add_argument("--locate-tol", type=cmdline.number(0, lo_open=True), default=None,
                    help="bracket width for the variants other than conserve, conv/s (default: --tol)")
    ap.add_argument("--skip-fractions", action="store_true",
                    help="locate and record only: no claim cell runs (the fraction rates are still recorded)")
    ap.add_argument("--jobs", type=cmdline.number(1, integer=True), default=None,
                    help="worker processes per run.py sweep (hydra.launcher.n_jobs; default: run.py's, the cores)")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "conserve" not in variants:
        ap.error(f"--variants: from {', '.join(VARIANTS)}, conserve included; got {a.variants!r}")
    to_locate = variants if a.locate is None else [v for v in a.locate.split(",") if v]
    if any(v not in VARIANTS for v in to_locate):
        ap.error(f"--locate: from {', '.join(VARIANTS)}; got {a.locate!r}")
    to_locate = ["conserve", *[v for v in to_locate if v != "conserve"]]
    lo, hi = a.range
    if not lo < hi:
        ap.error(f"--range: lo < hi needed, got {lo:g},{hi:g}")
    tables = []
    for p in a.reuse:
        if not p.is_file():
            ap.error(f"--reuse: no file {p}")
        import pandas as pd
        tables.append((str(p), pd.read_csv(p)))
    fractions = sorted(a.fractions, key=lambda f: (f < a.near, -f))   # near capacity first
    seeds_of = fraction_seeds(fractions, a.near, a.seeds, a.seeds if a.far_seeds is None else a.far_seeds)
    jobs = [] if a.jobs is None else [f"hydra.launcher.n_jobs={a.jobs}"]
    from harness.analysis.seeds import RunFailed, _label, run_arm
    probes: dict[str, dict] = {}

    def probe(variant: str, rate: float) -> list[float]:
        got = reused_ratios(tables, variant, rate, a.cap_seeds)
        if got is not None:
            probes.setdefault(variant, {})[f"{rate:g}"] = probe_record(*got)
            return got[0]
        cell = a.out / "cap" / f"{variant}_r{rate:g}"
        arm = cell_arm(variant, rate)
        run_arm(cell, arm, [*jobs, *SETTING], a.cap_seeds)
        g = [growth_of(cell / f"{_label(arm)}_seed{s}") for s in range(a.cap_seeds)]
        probes.setdefault(variant, {})[f"{rate:g}"] = probe_record(g, "run")
        return g
    tol_of = {v: a.tol if v == "conserve" or a.locate_tol is None else a.locate_tol for v in to_locate}
    record: dict = {"growth_bound": GROWTH_BOUND, "range": [lo, hi], "tol": a.tol, "cap_seeds": a.cap_seeds,
                    "tol_per_variant": tol_of, "capacity": {}, "probes": probes}
    try:
        for v in to_locate:
            record["capacity"][v] = locate(v, probe, lo, hi, tol_of[v])
            print(f"{v}: capacity in [{record['capacity'][v]['low']:g}, {record['capacity'][v]['high']:g}) conv/s",
                  flush=True)
            if v == "conserve":
                try:
                    record["rates"] = fraction_rates(record["capacity"]["conserve"]["low"], fractions)
                except ValueError as e:   # ConServe's capacity outside --range: no fraction to run
                    print(f"error: {e}", file=sys.stderr)
                    return 1
                record["seeds"] = seeds_of
                for tag, rate in ([] if a.skip_fractions else record["rates"].items()):
                    for w in variants:
                        run_arm(a.out / "claims" / tag, cell_arm(w, rate),
                                [*jobs, *SETTING], seeds_of[tag])
                    print(f"{tag} ({rate:g} conv/s): {', '.join(variants)} x {seeds_of[tag]} seeds done", flush=True)
    except RunFailed as e:
        print(f"conserve_capacity: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "capacity.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from harness.core import cmdline
    sys.exit(cmdline.run(main))
