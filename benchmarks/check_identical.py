"""Check that ``python run.py scheduler=X`` gives byte-identical results on two checkouts (a speed change
must not change a result).

For every scheduler it runs ``run.py`` once in the base checkout (``--base``, a ``git worktree`` of the
commit to compare against; its outputs are kept under ``--out``/base and reused by later calls) and once
in this checkout (always fresh: ``run.py`` skips a run whose directory is already complete, so every run
gets a new directory), then compares:

* ``turns.parquet``, ``conversations.parquet``, ``decisions.parquet``, ``instances.parquet``: the frames
  must be equal cell for cell (``pandas.DataFrame.equals``: same columns, dtypes and values, NaN = NaN)
  and the files' bytes are compared too (reported, not required: parquet metadata may name the writer);
* ``summary.json``: every field equal except the wall-clock ones (``sim_wall_s``, ``total_wall_s``,
  ``sim_turns_per_wall_s``), the cost ones (``cost_*``: CPU, peak RSS, events per call) and ``sim_events``
  (the number of clock events, which merging steps into runs changes by design; reported side by side). A
  field only the new run has (a new key, e.g. ``validity_flags``) is listed as added, not as a difference: it
  changes no result the base reported.

Usage (about 30 s of CPU per run on the default workload; ``nice`` it on a shared machine)::

    git worktree add /tmp/base 4050644
    HARNESS_CACHE_DIR=/tmp/cache nice -n 19 python benchmarks/check_identical.py --base /tmp/base \\
        --out /tmp/ident [--schedulers conserve,wait] [--jobs 2] [-- extra run.py overrides]

Exit status 0 when everything is identical, 1 otherwise (the differing files and fields are printed).
Too slow for the test suite (seven full runs); the merged-vs-step-by-step equivalence at the engine level
is tested in ``tests/test_speed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCHEDULERS = ("conserve", "ampd", "collocated", "disaggregated", "wait", "nested_wait", "wait_cp")
TABLES = ("turns.parquet", "conversations.parquet", "decisions.parquet", "instances.parquet")
VOLATILE = ("sim_wall_s", "total_wall_s", "sim_turns_per_wall_s", "sim_events",
            # what the run cost the machine (harness.analysis.cost): CPU, memory, events per call
            "cost_loop_cpu_s", "cost_run_cpu_s", "cost_process_cpu_s", "cost_children_cpu_s", "cost_peak_rss_bytes",
            "cost_events_per_call")


def run_one(checkout: Path, sched: str, out: Path, extra: list[str]) -> tuple[Path, float]:
    """Run ``run.py scheduler=<sched>`` in ``checkout`` into the fresh directory ``out``; returns the
    directory and the child's CPU seconds (user + sys). Raises RuntimeError with the log tail on failure."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "run.py", f"scheduler={sched}", f"hydra.run.dir={out}", *extra]
    t0 = os.times()
    p = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    t1 = os.times()
    if p.returncode != 0 or not (out / "summary.json").exists():
        raise RuntimeError(f"{checkout}: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return out, (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)


def compare(a: Path, b: Path) -> list[str]:
    """Differences between two run directories (empty: identical)."""
    diffs = []
    for name in TABLES:
        fa, fb = a / name, b / name
        if fa.exists() != fb.exists():
            diffs.append(f"{name}: present in only one run")
            continue
        if not fa.exists():
            continue
        da, db = pd.read_parquet(fa), pd.read_parquet(fb)
        if not da.equals(db):
            cols = [c for c in da.columns if c not in db.columns or not da[c].equals(db[c])]
            diffs.append(f"{name}: frames differ (shapes {da.shape} vs {db.shape}; columns {cols[:8]})")
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    for k in sorted(set(sa) | set(sb)):
        if k in VOLATILE or (k in sb and k not in sa):   # added keys: see added_keys
            continue
        if json.dumps(sa.get(k), sort_keys=True) != json.dumps(sb.get(k), sort_keys=True):
            diffs.append(f"summary.json {k}: {str(sa.get(k))[:60]} != {str(sb.get(k))[:60]}")
    return diffs


def added_keys(a: Path, b: Path) -> list[str]:
    """The ``summary.json`` keys run ``b`` (the new checkout's) has and run ``a`` (the base's) has not."""
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    return sorted(k for k in sb if k not in sa and k not in VOLATILE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout (git worktree) of the base commit")
    ap.add_argument("--out", type=Path, required=True, help="scratch directory for the run directories")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--jobs", type=int, default=2, help="runs at once")
    ap.add_argument("extra", nargs="*", help="run.py overrides for both sides (after --)")
    args = ap.parse_args(argv)
    scheds = [s for s in args.schedulers.split(",") if s]
    tag = "_".join(args.extra).replace("/", "_").replace("=", "-") or "default"
    base_root = args.out / "base" / tag
    base_root.mkdir(parents=True, exist_ok=True)

    def job(sched: str):
        bdir = base_root / sched
        bcpu = None
        if not (bdir / "summary.json").exists():
            tmp = base_root / f".{sched}.{uuid.uuid4().hex[:8]}"
            _, bcpu = run_one(args.base, sched, tmp, args.extra)
            tmp.rename(bdir)
        ndir = args.out / "new" / f"{sched}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:6]}"
        _, ncpu = run_one(ROOT, sched, ndir, args.extra)
        return sched, bdir, ndir, bcpu, ncpu

    bad = 0
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        for sched, bdir, ndir, bcpu, ncpu in ex.map(job, scheds):
            diffs = compare(bdir, ndir)
            sa = json.loads((bdir / "summary.json").read_text())
            sb = json.loads((ndir / "summary.json").read_text())
            bytes_same = all((bdir / t).read_bytes() == (ndir / t).read_bytes()
                             for t in TABLES if (bdir / t).exists() and (ndir / t).exists())
            status = "IDENTICAL" if not diffs else "DIFFERENT"
            bad += bool(diffs)
            print(f"{sched:14s} {status}  parquet bytes {'same' if bytes_same else 'differ'}  "
                  f"events {sa['sim_events']} -> {sb['sim_events']}  "
                  f"cpu {'cached' if bcpu is None else f'{bcpu:.1f}s'} -> {ncpu:.1f}s  ({ndir})", flush=True)
            for d in diffs:
                print("    " + d)
            added = added_keys(bdir, ndir)
            if added:
                print(f"    summary.json keys added (not compared): {', '.join(added)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
