"""A stated slice of the 480-run rate sweep (6 variants x 8 rates x 10 seeds of the ConServe rate-sweep
shape, ``+experiment=conserve_rate_sweep``), timed on this checkout and a base commit side by side, extrapolated to
the whole sweep, with every run's results compared between the two (byte-identical per run).

Usage::

    python benchmarks/sweep_slice.py --base 8d1e9e4 [--base-dir /tmp/base] [--rates 0.02,0.1] [--seeds 0]
        [--num-conversations 100] [--schedulers conserve,ampd,collocated,disaggregated,wait,nested_wait]
        [--out DIR] [--no-pin]

The slice (default): one seed per variant at two rates (0.02 and 0.1 conv/s, the ends of the sweep's 8 rates
0.02-0.1), ``workload.num_conversations=100``: 12 jobs per checkout. Each job is one ``python run.py`` process
(the cost a Slurm array task or a one-process-per-run launcher pays), run through ``benchmarks/nonloop_cpu.py``
(this checkout's copy, importing the measured checkout's ``harness``), pinned to one core, the two checkouts
interleaved job by job. Per job: CPU s of the whole process (user + system, ``os.wait4``, exit included), of the
simulation loop (every ``SimClock.run``) and outside it (the fixed per-run cost: imports, Hydra, trace, workload,
frames, files). The SLO baseline of each seed is replayed once per checkout before the timed jobs (into a cache of
that checkout), as a sweep replays it once per seed: the timed jobs read it.

Extrapolation: the 480 runs are 80 per variant (8 rates x 10 seeds); a variant's runs are estimated at the mean
CPU s of its jobs in the slice (so the slice's rates stand for the 8, and its size for the runs' size: state
``--num-conversations`` with the numbers). Printed: CPU-hours of the 480 runs per checkout, the wall time that is
at least on 2 cores (CPU / 2), the ratio base / this, the load average before and after (``os.getloadavg``).

Identical results: each job's run directory of the two checkouts is compared with ``benchmarks/check_identical.py``'s
``compare`` (every parquet frame cell for cell, ``summary.json`` but the wall-clock and cost keys; keys only this
checkout writes are listed as added) and the parquet files byte for byte. Exit status 0 when every job is
identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from check_identical import TABLES, added_keys, compare  # noqa: E402
from sim_speed import _bytecode_env, _preexec, _spawn  # noqa: E402

SCHEDULERS = "conserve,ampd,collocated,disaggregated,wait,nested_wait"
SWEEP_RUNS_PER_VARIANT = 8 * 10   # the 480-run sweep: 8 rates x 10 seeds per variant


def job(root: Path, overrides: list[str], out: Path, cache: str, pin: bool) -> dict:
    """One ``python run.py`` of checkout ``root`` through nonloop_cpu.py into ``out``: CPU s of the process
    (``cpu_s``), of its loop (``loop_s``) and outside it (``nonloop_s``), wall s, peak RSS MiB."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "nonloop_cpu.py"), "+experiment=conserve_rate_sweep",
           *overrides, f"hydra.run.dir={out}", "logger.progress=false"]
    r = _spawn(cmd, root, {**_bytecode_env(root), "HARNESS_CACHE_DIR": cache}, pin)
    if r["rc"] or not (out / "summary.json").is_file():
        raise RuntimeError(f"{root}: {' '.join(cmd)} failed ({r['rc']}):\n{r['stdout'][-1500:]}\n{r['stderr'][-2000:]}")
    line = next(x for x in r["stderr"].splitlines() if x.startswith("NONLOOP "))
    vals = dict(kv.split("=") for kv in line.split()[1:])
    loop = float(vals["loop"])
    return {"cpu_s": r["cpu_s"], "loop_s": loop, "nonloop_s": r["cpu_s"] - loop, "wall_s": r["wall_s"],
            "rss_mib": r["rss_mib"]}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (a temporary git worktree, removed after)")
    ap.add_argument("--base-dir", type=Path, default=None, help="an existing checkout of --base to use instead")
    ap.add_argument("--rates", default="0.02,0.1", help="workload.rate_per_s of the slice, conv/s")
    ap.add_argument("--seeds", default="0", help="workload.seed values of the slice")
    ap.add_argument("--num-conversations", type=int, default=100, help="workload.num_conversations of every job")
    ap.add_argument("--schedulers", default=SCHEDULERS)
    ap.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: a temporary one)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin each job to one core")
    args = ap.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    scheds = [s for s in args.schedulers.split(",") if s]
    if not rates or not seeds or not scheds or args.num_conversations < 1:
        ap.error("--rates, --seeds and --schedulers must be non-empty and --num-conversations >= 1")
    pin = not args.no_pin
    tmp = Path(tempfile.mkdtemp(prefix="sweep_slice_"))
    out = args.out or tmp / "runs"
    base_dir = args.base_dir
    made_worktree = False
    if base_dir is None:
        base_dir = tmp / "base"
        r = subprocess.run(["git", "worktree", "add", "--detach", str(base_dir), args.base], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"error: --base {args.base}: git worktree add failed: {r.stderr.strip()}", file=sys.stderr)
            return 2
        made_worktree = True
    checkouts = {"base": base_dir, "this": ROOT}
    size = [f"workload.num_conversations={args.num_conversations}"]
    load0 = os.getloadavg()
    print(f"slice: {len(scheds)} variants x {len(rates)} rates {rates} x {len(seeds)} seeds {seeds}, "
          f"{args.num_conversations} conversations a run ({len(scheds) * len(rates) * len(seeds)} jobs per checkout); "
          f"base {args.base} ({base_dir}); load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
          f"on {os.cpu_count()} cores; pinned: {pin}", flush=True)
    caches = {k: str(tmp / f"cache_{k}") for k in checkouts}
    res: dict = {k: {} for k in checkouts}
    bad = 0
    try:
        for seed in seeds:   # the SLO baseline of each seed, once per checkout (as a sweep replays it once)
            for k, root in checkouts.items():
                job(root, [f"scheduler={scheds[0]}", f"workload.rate_per_s={rates[0]}", f"workload.seed={seed}", *size],
                    tmp / "warm" / f"{k}_{seed}", caches[k], pin)
        print("| variant | rate | seed | checkout | CPU s | loop CPU s | outside the loop, CPU s | wall s | peak RSS MiB "
              "| results |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for sched in scheds:
            for rate in rates:
                for seed in seeds:
                    ov = [f"scheduler={sched}", f"workload.rate_per_s={rate}", f"workload.seed={seed}", *size]
                    dirs = {}
                    for k, root in checkouts.items():
                        dirs[k] = out / k / f"{sched}_r{rate}_s{seed}"
                        if dirs[k].exists():
                            shutil.rmtree(dirs[k])
                        res[k][(sched, rate, seed)] = m = job(root, ov, dirs[k], caches[k], pin)
                    diffs = compare(dirs["base"], dirs["this"])
                    same_bytes = all((dirs["base"] / t).read_bytes() == (dirs["this"] / t).read_bytes()
                                     for t in TABLES if (dirs["base"] / t).exists())
                    added = added_keys(dirs["base"], dirs["this"])
                    verdict = ("IDENTICAL" if not diffs else "DIFFERENT: " + "; ".join(diffs)) + \
                              (", parquet bytes the same" if same_bytes else ", parquet bytes differ") + \
                              (f"; added summary keys: {', '.join(added)}" if added else "")
                    bad += bool(diffs)
                    for k in checkouts:
                        m = res[k][(sched, rate, seed)]
                        print(f"| {sched} | {rate:g} | {seed} | {k} | {m['cpu_s']:.2f} | {m['loop_s']:.2f} "
                              f"| {m['nonloop_s']:.2f} | {m['wall_s']:.1f} | {m['rss_mib']:.0f} "
                              f"| {verdict if k == 'this' else ''} |", flush=True)
        load1 = os.getloadavg()
        print(f"\n## Extrapolated to the 480-run sweep (6 variants x 8 rates x 10 seeds; {args.num_conversations} "
              f"conversations a run; each variant at the mean of its {len(rates) * len(seeds)} jobs here)\n")
        print("| variant | base CPU s per run | this CPU s per run | base / this | base outside the loop | "
              "this outside the loop |")
        print("|---|---|---|---|---|---|")
        tot = {k: 0.0 for k in checkouts}
        for sched in scheds:
            mean = {k: statistics.fmean(v["cpu_s"] for (s, _, _), v in res[k].items() if s == sched) for k in checkouts}
            fixed = {k: statistics.fmean(v["nonloop_s"] for (s, _, _), v in res[k].items() if s == sched)
                     for k in checkouts}
            for k in checkouts:
                tot[k] += mean[k] * SWEEP_RUNS_PER_VARIANT
            print(f"| {sched} | {mean['base']:.2f} | {mean['this']:.2f} | {mean['base'] / mean['this']:.2f}x "
                  f"| {fixed['base']:.2f} | {fixed['this']:.2f} |")
        runs = SWEEP_RUNS_PER_VARIANT * len(scheds)
        for k in checkouts:
            print(f"{k}: {runs} runs, {tot[k] / 3600:.2f} CPU-hours, at least {tot[k] / 2 / 60:.0f} min of wall on 2 "
                  f"cores")
        print(f"ratio base / this (CPU of the extrapolated sweep): {tot['base'] / tot['this']:.3f}x; load average "
              f"before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        print(f"results: {'every job IDENTICAL' if not bad else f'{bad} jobs DIFFERENT'} (benchmarks/check_identical.py's "
              f"comparison; the cost keys are not compared)")
        if args.out is not None:   # every measurement, for the record
            data = {k: {f"{s}|{r}|{sd}": v for (s, r, sd), v in res[k].items()} for k in checkouts}
            (args.out / "sweep_slice.json").write_text(json.dumps(data, indent=1))
    finally:
        if made_worktree:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_dir)], cwd=ROOT, capture_output=True)
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
