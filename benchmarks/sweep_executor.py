"""A stated slice of the 480-run rate sweep (6 variants x 8 rates x 10 seeds, the shape of
``+experiment=conserve_rate_sweep``) run as ONE ``python run.py -m`` command on a base checkout (its default
launcher: the pool launcher with the same ``--n-jobs`` where it has one) and on this one (the sweep executor,
``hydra/launcher=pool``), one after the other on the same machine;
timed as whole processes, extrapolated to the 480 runs, every job's results compared between the two.

Usage::

    python benchmarks/sweep_executor.py --base-dir /tmp/main [--rates 0.02,0.1] [--seeds 0]
        [--num-conversations 100] [--schedulers conserve,ampd,collocated,disaggregated,wait,nested_wait]
        [--n-jobs N] [--repeat 1] [--slope] [--out DIR]

The slice (default): the six variants at two rates (0.02 and 0.1 conv/s, the ends of the sweep's rates) x one
seed, ``workload.num_conversations=100`` (state it with the numbers): 12 jobs per checkout, the config of the
rate-sweep preset (``model=qwen3_0_6b cluster=a40_1p3d workload=swebench slo=relative``, the defaults, with
``logger.log_decisions=false``) given key by key, so the same command line runs on both checkouts. Both read the
SLO baselines from one warm disk cache per checkout (``$HARNESS_CACHE_DIR``, filled by a first, untimed run of
every seed), as a sweep re-run or a sweep after a first does; ``--cold`` leaves the cache off instead (every
sweep then replays each seed's baselines itself).

Per checkout and repeat: the command's CPU (user + system of the process and every worker it waited for,
``os.wait4``, s) and wall (s); from the jobs' ``summary.json``: the loop CPU (``cost_loop_cpu_s``, s) summed. The
fixed per-run cost is ``(process CPU - summed loop CPU) / jobs``: imports, Hydra's composes, the sweep's
validation, trace and workload, frames, files, pickling between processes, exit. Its marginal part, when the jobs
ran one after another in one process (base's basic launcher; this checkout with ``--n-jobs 1``), is the median
over consecutive jobs of ``cost_process_cpu_s`` since the previous job's less the job's ``cost_loop_cpu_s``: what
one more run costs outside its loop once the process is warm (Hydra's compose and ``run_job``, the run's
start-up, frames, files, the printed table). The slice's fixed CPU is split (:func:`one_off_split`) into a
one-off part (fixed - jobs x marginal: imports, the primary composes, each variant's first compose, exit) and the
marginal, and the fixed cost per run of the 480-run sweep extrapolated as one-off / 480 + marginal (a lower
bound: a job's validation before the launch, its compose from the memo and its checks, counts as one-off
here). Extrapolated: the 480-run
sweep's CPU-hours (the slice's mean CPU per job x 480: the slice stands for the sweep's rates and sizes) and the
wall at the command's measured parallelism (CPU / wall of the slice). The ratio base / this is printed for CPU and
for wall, with the load average before and after (``os.getloadavg``) and the cores this process may use.

Per job (first repeat): events per LLM call (``cost_events_per_call``) and loop CPU s of both checkouts, side by
side (WAIT's timeout-paced runs show there).

With ``--slope``, each checkout also runs the slice once with twice the seeds (the next ones), and the fixed cost
per run is the slope between the two sizes (:func:`slope_split`): everything a job costs outside its loop, its
validation included, which the marginal above leaves in the one-off part.

Identical results: each job of the two sweeps (matched by variant, rate and seed) is compared with
``benchmarks/check_identical.py``'s ``compare`` (every parquet frame cell for cell; ``summary.json`` but the
wall-clock and cost keys, ``harness.analysis.cost.VOLATILE_KEYS``, and ``sim_events``) and its parquet files byte
for byte. Exit status 0 when every job is identical, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from check_identical import TABLES, added_keys, compare  # noqa: E402
from sim_speed import _bytecode_env, _spawn  # noqa: E402

SCHEDULERS = "conserve,ampd,collocated,disaggregated,wait,nested_wait"
SWEEP_RUNS = 6 * 8 * 10   # the 480-run sweep
PRESET = ["model=qwen3_0_6b", "cluster=a40_1p3d", "workload=swebench", "slo=relative", "logger.progress=false",
          "logger.log_decisions=false"]


def sweep(root: Path, args: list[str], out: Path, cache: str) -> dict:
    """``python run.py -m <args>`` of checkout ``root`` into the sweep directory ``out``: process CPU s (with its
    workers), wall s, and per job (``{(scheduler, rate, seed): run dir}``) its loop CPU s."""
    if out.exists():
        shutil.rmtree(out)
    r = _spawn([sys.executable, "run.py", "-m", *args, f"hydra.sweep.dir={out}"], root,
               {**_bytecode_env(root), "HARNESS_CACHE_DIR": cache}, False)
    if r["rc"]:
        raise RuntimeError(f"{root}: sweep failed ({r['rc']}):\n{r['stdout'][-1500:]}\n{r['stderr'][-3000:]}")
    jobs, loop, seq, per_job = {}, 0.0, [], {}
    for d in sorted((p for p in out.iterdir() if (p / "summary.json").is_file()), key=lambda p: int(p.name.split("_")[0])):
        s = json.loads((d / "summary.json").read_text())
        c = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
        key = (c["scheduler"]["name"], float(c["workload"]["rate_per_s"]), int(c["workload"]["seed"]))
        jobs[key] = d
        per_job[key] = (float(s.get("cost_events_per_call", float("nan"))), float(s.get("cost_loop_cpu_s", 0.0)))
        loop += float(s.get("cost_loop_cpu_s", 0.0))
        seq.append((float(s["cost_process_cpu_s"]), float(s["cost_loop_cpu_s"])))
    start = next((ln for ln in r["stdout"].splitlines() if ln.startswith("sweep executor:")), "")
    # the marginal fixed cost of a job in a process that runs the jobs one after another (the basic launcher, or
    # the pool with one worker): its process CPU since the previous job's summary, less its loop CPU
    one = not start or "in this process" in start
    marginal = [b[0] - a[0] - b[1] for a, b in zip(seq, seq[1:])] if one else []
    return {"cpu_s": r["cpu_s"], "wall_s": r["wall_s"], "loop_s": loop, "jobs": jobs, "per_job": per_job,
            "start_line": start,
            "marginal_s": statistics.median(marginal) if marginal else float("nan")}


def one_off_split(cpu_s: float, loop_s: float, marginal_s: float, jobs: int) -> tuple[float, float]:
    """The slice's fixed CPU (``cpu_s - loop_s``, s) split into its one-off part (imports, the primary composes,
    each variant's first compose, exit: what a sweep pays once however many jobs it has) and the per-run part
    ``marginal_s``: returns (one-off s = fixed - jobs x marginal, the fixed cost per run of the 480-run sweep
    extrapolated = one-off / 480 + marginal, s). A lower bound of the latter: the marginal is measured between
    jobs in the launching process, so a job's validation before the launch (its compose from the memo, the
    check of its config, trace and workload: per job, in a sweep of any size) is counted as one-off here. NaN
    without a marginal (the jobs ran on several workers)."""
    fixed = cpu_s - loop_s
    one_off = fixed - jobs * marginal_s
    return one_off, one_off / SWEEP_RUNS + marginal_s


def slope_split(fixed_n: float, fixed_2n: float, n: int) -> tuple[float, float, float]:
    """The fixed CPU (process CPU less the summed loop CPU, s) of the slice at ``n`` jobs and of the same slice with
    twice the seeds (``2n`` jobs: the same variants and rates, so the same one-off part), on the linear model
    ``fixed(jobs) = one-off + jobs x per-run``: returns (one-off s = 2 fixed_n - fixed_2n, per-run s =
    (fixed_2n - fixed_n) / n, the fixed cost per run of the 480-run sweep = one-off / 480 + per-run). Unlike
    :func:`one_off_split` the per-run part holds everything a job costs outside its loop, its validation
    included; it is a difference of two measurements, so noisier (run it on a quiet machine)."""
    per_run = (fixed_2n - fixed_n) / n
    one_off = fixed_n - n * per_run
    return one_off, per_run, one_off / SWEEP_RUNS + per_run


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-dir", type=Path, required=True, help="a checkout of the base commit (git archive/worktree)")
    ap.add_argument("--rates", default="0.02,0.1", help="workload.rate_per_s of the slice, conv/s")
    ap.add_argument("--seeds", default="0", help="workload.seed values of the slice")
    ap.add_argument("--num-conversations", type=int, default=100, help="workload.num_conversations of every job")
    ap.add_argument("--schedulers", default=SCHEDULERS)
    ap.add_argument("--n-jobs", default=None, help="hydra.launcher.n_jobs of this checkout's sweep, and of the base's "
                                                   "where it has the pool launcher (default: null, every core this "
                                                   "process may use)")
    ap.add_argument("--repeat", type=int, default=1, help="alternating repeats of the pair of sweeps")
    ap.add_argument("--slope", action="store_true",
                    help="also run each checkout's slice with twice the seeds (the next seeds) once, and print the "
                         "fixed cost per run as the slope between the two sizes (validation included)")
    ap.add_argument("--cold", action="store_true", help="no disk cache of SLO baselines (each sweep replays them)")
    ap.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary directory)")
    args = ap.parse_args(argv)
    rates = [x for x in args.rates.split(",") if x]
    seeds = [x for x in args.seeds.split(",") if x]
    scheds = [s for s in args.schedulers.split(",") if s]
    if not rates or not seeds or not scheds or args.num_conversations < 1 or args.repeat < 1:
        ap.error("--rates, --seeds, --schedulers must be non-empty, --num-conversations and --repeat >= 1")
    if not (args.base_dir / "run.py").is_file():
        ap.error(f"--base-dir {args.base_dir}: no run.py there")
    more = [str(int(max(seeds, key=int)) + 1 + i) for i in range(len(seeds))] if args.slope else []
    tmp = Path(tempfile.mkdtemp(prefix="sweep_executor_"))
    out = args.out or tmp
    grid = [f"scheduler={','.join(scheds)}", f"workload.rate_per_s={','.join(rates)}",
            f"workload.seed={','.join(seeds)}", f"workload.num_conversations={args.num_conversations}", *PRESET]
    checkouts = {"base": args.base_dir.resolve(), "this": ROOT}
    # --n-jobs goes to the base too when it has the pool launcher (main since 6771edc's merge), so both sweeps run
    # the same number of workers; a base without it runs on Hydra's basic launcher (one process, one job at a time)
    pooled_base = "hydra/launcher: pool" in (args.base_dir / "conf" / "config.yaml").read_text()
    jobs_arg = [f"hydra.launcher.n_jobs={args.n_jobs}"] if args.n_jobs is not None else []
    extra = {"base": jobs_arg if pooled_base else [], "this": jobs_arg}
    caches = {k: "off" if args.cold else str(tmp / f"cache_{k}") for k in checkouts}
    n = len(scheds) * len(rates) * len(seeds)
    load0 = os.getloadavg()
    cores = len(os.sched_getaffinity(0))
    print(f"slice: {len(scheds)} variants x {len(rates)} rates {rates} x {len(seeds)} seeds {seeds}, "
          f"{args.num_conversations} conversations a run: {n} jobs per sweep; base {checkouts['base']}; SLO baselines "
          f"{'replayed by each sweep (no disk cache)' if args.cold else 'from a warm disk cache'}; load average "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; {cores} cores", flush=True)
    try:
        if not args.cold:   # fill each checkout's disk cache of SLO baselines (untimed)
            for k, root in checkouts.items():
                sweep(root, [f"scheduler={scheds[0]}", f"workload.rate_per_s={rates[0]}",
                             f"workload.seed={','.join(seeds + more)}",
                             f"workload.num_conversations={args.num_conversations}", *PRESET, *extra[k]],
                      tmp / f"warm_{k}", caches[k])
        res: dict = {k: [] for k in checkouts}
        for i in range(args.repeat):
            for k in (("base", "this") if i % 2 == 0 else ("this", "base")):
                m = sweep(checkouts[k], [*grid, *extra[k]], out / f"{k}_{i}", caches[k])
                res[k].append(m)
                print(f"repeat {i} {k}: CPU {m['cpu_s']:.1f} s, wall {m['wall_s']:.1f} s, loop CPU {m['loop_s']:.1f} s, "
                      f"fixed per run {(m['cpu_s'] - m['loop_s']) / n:.3f} s CPU (marginal, jobs in one process: "
                      f"median {m['marginal_s']:.3f} s); {m['start_line'] or 'basic launcher'}",
                      flush=True)
        twice: dict = {}
        if more:    # the same slice with twice the seeds: the same variants and rates, so the same one-off part
            grid2 = [x if not x.startswith("workload.seed=") else f"workload.seed={','.join(seeds + more)}" for x in grid]
            for k in checkouts:
                twice[k] = sweep(checkouts[k], [*grid2, *extra[k]], out / f"{k}_twice", caches[k])
                print(f"{k}, {2 * n} jobs: CPU {twice[k]['cpu_s']:.1f} s, loop CPU {twice[k]['loop_s']:.1f} s",
                      flush=True)
        load1 = os.getloadavg()
        bad = 0
        print("\n| variant | rate | seed | results (base vs this) |\n|---|---|---|---|")
        a, b = res["base"][0]["jobs"], res["this"][0]["jobs"]
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                bad += 1
                print(f"| {key[0]} | {key[1]:g} | {key[2]} | MISSING in {'base' if key not in a else 'this'} |")
                continue
            diffs = compare(a[key], b[key])
            same = all((a[key] / t).read_bytes() == (b[key] / t).read_bytes() for t in TABLES if (a[key] / t).exists())
            added = added_keys(a[key], b[key])
            bad += bool(diffs) or not same
            print(f"| {key[0]} | {key[1]:g} | {key[2]} | "
                  f"{'IDENTICAL' if not diffs else 'DIFFERENT: ' + '; '.join(diffs)}"
                  f"{', parquet bytes the same' if same else ', parquet bytes DIFFER'}"
                  f"{'; added summary keys: ' + ', '.join(added) if added else ''} |")
        print("\n| variant | rate | seed | events per LLM call: base | this | loop CPU s: base | this |\n"
              "|---|---|---|---|---|---|---|")
        pa, pb = res["base"][0]["per_job"], res["this"][0]["per_job"]
        for key in sorted(set(pa) & set(pb)):
            print(f"| {key[0]} | {key[1]:g} | {key[2]} | {pa[key][0]:.1f} | {pb[key][0]:.1f} | {pa[key][1]:.2f} | "
                  f"{pb[key][1]:.2f} |")
        med = {k: {f: statistics.median(m[f] for m in v) for f in ("cpu_s", "wall_s", "loop_s", "marginal_s")}
               for k, v in res.items()}
        print(f"\n## The slice ({n} jobs, median of {args.repeat}) and the 480-run sweep extrapolated\n")
        print("| checkout | CPU s | wall s | parallelism (CPU / wall) | loop CPU s | fixed per run, CPU s | marginal "
              "fixed per run (one process), CPU s | one-off CPU s | fixed per run over 480 runs, CPU s | "
              "480 runs: CPU-hours | 480 runs: wall h at this parallelism |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")
        for k, m in med.items():
            par = m["cpu_s"] / m["wall_s"]
            cpu480 = m["cpu_s"] / n * SWEEP_RUNS
            one_off, per480 = one_off_split(m["cpu_s"], m["loop_s"], m["marginal_s"], n)
            print(f"| {k} | {m['cpu_s']:.1f} | {m['wall_s']:.1f} | {par:.2f} | {m['loop_s']:.1f} | "
                  f"{(m['cpu_s'] - m['loop_s']) / n:.3f} | {m['marginal_s']:.3f} | {one_off:.1f} | {per480:.3f} | "
                  f"{cpu480 / 3600:.2f} | {cpu480 / par / 3600:.2f} |")
        if twice:
            print(f"\n## The fixed cost per run as the slope between {n} and {2 * n} jobs (validation included)\n")
            print("| checkout | fixed CPU s, n jobs (median) | fixed CPU s, 2n jobs | per run (slope), CPU s | one-off, "
                  "CPU s | fixed per run over 480 runs, CPU s |\n|---|---|---|---|---|---|")
            for k, m in med.items():
                one_off, slope, per480 = slope_split(m["cpu_s"] - m["loop_s"], twice[k]["cpu_s"] - twice[k]["loop_s"], n)
                print(f"| {k} | {m['cpu_s'] - m['loop_s']:.2f} | {twice[k]['cpu_s'] - twice[k]['loop_s']:.2f} | "
                      f"{slope:.3f} | {one_off:.2f} | {per480:.3f} |")
        print(f"\nratio base / this: CPU {med['base']['cpu_s'] / med['this']['cpu_s']:.3f}x, wall "
              f"{med['base']['wall_s'] / med['this']['wall_s']:.3f}x; load average before {load0[0]:.2f} {load0[1]:.2f} "
              f"{load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; {cores} cores")
        print(f"results: {'every job IDENTICAL, parquet bytes the same' if not bad else f'{bad} jobs DIFFERENT'}")
        if args.out is not None:
            (args.out / "sweep_executor.json").write_text(json.dumps(
                {k: [{f: m[f] for f in ("cpu_s", "wall_s", "loop_s", "marginal_s", "start_line")} for m in v]
                 for k, v in res.items()}, indent=1))
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
