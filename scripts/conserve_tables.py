"""Compact per-run tables of the ConServe presets, shipped under ``docs/data/<preset>/`` for the generated results
page (``python -m harness.analysis.results``: docs/results/conserve.md reads them):

    python scripts/conserve_tables.py SWEEP_DIR [SWEEP_DIR ...] --out docs/data/conserve_sensitivity \\
        --command "python run.py -m +experiment=conserve_sensitivity ..."

Each ``SWEEP_DIR`` is read by ``harness.analysis.report.load_sweep`` (every run directory below it, i.e. several
sweeps of one preset may be given, e.g. the halves of a preset run as two processes). One row per run:
the config columns ``harness.analysis.claims.classify`` reads (:data:`CONFIG_COLUMNS`, and every swept
``hardware.*`` constant of ``harness.analysis.claims.HW_KEYS``), the summary metrics the claims judge
(:data:`METRICS`), and two values computed from the run's parquet files where its ``summary.json`` lacks them:
``ttfet_<r>_from_admission_p95_s`` (``harness.analysis.metrics.admission_readings``) and
``serving_growth_ratio`` (``harness.analysis.capacity.conversation_growth_ratio``, the capacity criterion on
conversations). Writes ``<out>/runs.csv`` (sorted, floats to 6 significant
digits: the verdicts need ratios, not the last bits) and ``<out>/SOURCE.md`` (the command given, the sweep
directories, the code fingerprints of the runs, the row count).

Exit status 0 written, 2 bad arguments (a directory without runs, a run without a column the claims need).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.analysis.capacity import conversation_growth_ratio  # noqa: E402
from harness.analysis.claims import HW_KEYS  # noqa: E402
from harness.analysis.metrics import admission_readings  # noqa: E402

CONFIG_COLUMNS = ("workload.name", "scheduler.name", "scheduler.mode", "scheduler.predictor.mode",
                  "scheduler.predictor.error_rate", "scheduler.predictor.sigma", "scheduler.misroute_frac",
                  "scheduler.tpot_slo_s", "scheduler.ttft_slo_s", "scheduler.kv_high_frac", "cluster.name",
                  "workload.rate_per_s", "workload.seed", "workload.num_conversations", "engine.gpu_memory_utilization")
READINGS = ("first", "visible", "serving")
METRICS = ("num_conversations", "num_conversations_completed",
           *(f"ttfet_{r}_p{q}_s" for r in READINGS for q in (50, 95)),
           *(f"slo_attainment_{r}" for r in READINGS),
           *(f"ttfet_{r}_from_admission_p95_s" for r in READINGS),
           "tokens_per_joule", "admission_held_conversations", "admission_hold_p95_s", "ampd_remote_frac",
           "ampd_misrouted_frac", "ampd_decision_flip_frac", "serving_growth_ratio")
REQUIRED = ("scheduler.name", "cluster.name", "workload.rate_per_s", "workload.seed", "ttfet_first_p95_s",
            "ttfet_visible_p95_s", "slo_attainment_first", "slo_attainment_visible", "tokens_per_joule")


def table(dirs: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """The compact table of the runs under ``dirs`` and their code fingerprints.

    Raises:
        FileNotFoundError: a directory without runs. ValueError: a run lacks a :data:`REQUIRED` column."""
    from harness.analysis.report import load_config, load_sweep
    frames, fps = [], []
    for d in dirs:
        sw = load_sweep(d)
        runs = sw.runs.copy()
        # a key one sweep does not vary is not a column of its runs table (load_sweep keeps the swept keys):
        # read it from each run's config so that several sweeps of one preset concatenate
        for c in CONFIG_COLUMNS:
            if c not in runs.columns:
                runs[c] = [load_config(sw.run_dirs[rel]).get(c) for rel in runs["run"]]
        runs["run"] = [str(Path(d.name) / r) for r in runs["run"]]
        for i, rel in enumerate(sw.runs["run"]):
            rd = sw.run_dirs[rel]
            need_adm = any(f"ttfet_{r}_from_admission_p95_s" not in runs.columns
                           or pd.isna(runs.iloc[i].get(f"ttfet_{r}_from_admission_p95_s")) for r in READINGS)
            turns = pd.read_parquet(rd / "turns.parquet")
            conv = pd.read_parquet(rd / "conversations.parquet")
            if need_adm:
                for k, v in admission_readings(turns, conv).items():
                    runs.loc[runs.index[i], k] = v
            runs.loc[runs.index[i], "serving_growth_ratio"] = conversation_growth_ratio(turns, conv)
        if "partial" in runs.columns:   # a job stopped before its end (run.py marks it): not a measurement
            runs = runs[~runs["partial"].fillna(False).astype(bool)]
        frames.append(runs)
        fps += [str(x) for x in runs.get("code_fingerprint", pd.Series(dtype=object)).dropna()]
    runs = pd.concat(frames, ignore_index=True, sort=False)
    hw = [c for c in runs.columns if c.startswith("hardware.") and c.rsplit(".", 1)[-1] in HW_KEYS]
    missing = [c for c in REQUIRED if c not in runs.columns or runs[c].isna().all()]
    if missing:
        raise ValueError(f"{', '.join(map(str, dirs))}: no column {missing} in the runs (not a ConServe preset sweep?)")
    cols = ["run", *[c for c in CONFIG_COLUMNS if c in runs.columns], *sorted(hw),
            *[c for c in METRICS if c in runs.columns]]
    out = runs[cols].sort_values(["scheduler.name", *[c for c in ("scheduler.mode", "cluster.name")
                                                        if c in runs.columns], "workload.rate_per_s", "workload.seed",
                                  "run"], kind="stable", na_position="first").reset_index(drop=True)
    return out, fps


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring). Bad input: one ``error:`` line, exit 2, before anything is written."""
    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python scripts/conserve_tables.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep directories of one preset")
    ap.add_argument("--out", type=Path, required=True, help="directory for runs.csv and SOURCE.md")
    ap.add_argument("--command", required=True, help="the command that ran the sweeps (written to SOURCE.md)")
    ap.add_argument("--note", default="", help="a line for SOURCE.md (e.g. what was reduced and why)")
    a = ap.parse_args(argv)
    bad = [str(d) for d in a.sweeps if not d.is_dir()]
    if bad:
        ap.error(f"not a directory: {', '.join(bad)}")
    try:
        runs, fps = table(a.sweeps)
    except (FileNotFoundError, ValueError) as e:
        ap.error(str(e))
    a.out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(a.out / "runs.csv", index=False, float_format="%.6g")
    from collections import Counter
    lines = [f"# `{a.out.name}/runs.csv`", "",
             f"Made by `python scripts/conserve_tables.py {' '.join(d.name for d in a.sweeps)} --out {a.out}` from "
             f"the runs of:", "", f"    {a.command}", "",
             f"{len(runs)} runs; code fingerprints (first 12 hex digits of meta.json's code digest, runs): "
             + ", ".join(f"{k} ({n})" for k, n in Counter(fps).most_common()) + ".",
             "One row per run: the config columns the claims classify by and the summary metrics they judge "
             "(docs/metrics.md); `serving_growth_ratio` and `ttfet_<r>_from_admission_p95_s` computed from the run's "
             "parquet files (scripts/conserve_tables.py)."]
    if a.note:
        lines += ["", a.note]
    (a.out / "SOURCE.md").write_text("\n".join(lines) + "\n")
    print(f"{a.out / 'runs.csv'}: {len(runs)} runs")
    return 0


if __name__ == "__main__":
    from harness.core import cmdline
    sys.exit(cmdline.run(main))
