"""The fixed cost per job of a sweep on Slurm and on Ray: one task per job (Hydra's submitit and Ray launchers,
``hydra/launcher=slurm`` / ``ray``) beside chunks of jobs per task (``hydra/launcher=pool_slurm`` / ``pool_ray``,
``harness.run.cluster_sweep``), on a single-node Slurm on loopback (``tests/slurm_local.py``: needs root and
``slurm-wlm``) and a local Ray of ``--ray-cpus`` CPUs that the sweep starts, one sweep after the other on this
machine; every job's results compared between the two launchers of a backend.

Usage::

    python benchmarks/cluster_sweep.py [--schedulers conserve,collocated] [--seeds 0,1,2,3]
        [--num-conversations 10] [--jobs-per-task 4] [--backends slurm,ray] [--ray-cpus 2] [--out DIR]

The slice (default): 2 variants x 4 seeds = 8 jobs of ``workload.num_conversations=10`` (``slo=relative``: each
job's SLO baseline replayed where it runs; the disk cache of baselines is off, ``HARNESS_CACHE_DIR=off``), 4 jobs a
task for the chunked launchers (2 tasks).

CPU: every Python process of a sweep -- the submitting process (``run.py``), each Slurm task (submitit's
``_submit``), each Ray worker (``default_worker.py``), Ray's own Python daemons -- records its user + system CPU
(``getrusage``) when it exits and every 0.5 s before (a ``sitecustomize.py`` put first on ``PYTHONPATH`` for these
sweeps only; a Ray worker stopped without running ``atexit`` keeps its last record), s. Slurm's own daemons and
Ray's C++ daemons (raylet, GCS) are not counted. The fixed cost per job is ``(submitting process + tasks or workers
- summed cost_loop_cpu_s) / jobs``: imports, Hydra's composes, the sweep's validation, pickling to and from the
tasks, the trace, the SLO baseline's replays, frames, files, exit: everything but the simulation loops. Ray's
Python daemons are reported apart.

Identical results: each job of the chunked sweep against the same job of the one-task-per-job sweep with
``benchmarks/check_identical.py``'s ``compare`` (every parquet frame cell for cell, ``summary.json`` but the
wall-clock and cost keys and ``sim_events``) and its parquet files byte for byte. Exit status 0 when every job is
identical, 1 otherwise, 2 for bad arguments (or no Slurm / Ray to run on).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from check_identical import TABLES, compare  # noqa: E402

HOOK = '''import os
_d = os.environ.get("HARNESS_BENCH_CPU_DIR")
if _d:
    import atexit, json, resource, sys, threading, time

    def _record():
        r = resource.getrusage(resource.RUSAGE_SELF)
        p = os.path.join(_d, f"{os.getpid()}.json")
        try:
            with open(p + ".tmp", "w") as f:
                json.dump({"pid": os.getpid(), "argv": list(sys.argv), "cpu_s": r.ru_utime + r.ru_stime}, f)
            os.replace(p + ".tmp", p)
        except OSError:
            pass

    def _every():
        while True:
            time.sleep(0.5)
            _record()
    threading.Thread(target=_every, daemon=True).start()
    atexit.register(_record)
'''


def role(argv: list) -> str:
    """Which part of a sweep a recorded process was, from its command line."""
    first = str(argv[0]) if argv else ""
    if "default_worker.py" in first or "submitit" in first:   # a Ray worker; a Slurm task (submitit's _submit)
        return "worker"
    return "driver" if first.endswith("run.py") else "other"


def sweep(launcher: list, grid: list, out: Path, env: dict, hook_dir: Path) -> dict:
    """``python run.py -m <launcher> <grid>`` into ``out`` with the CPU hook: CPU by role, wall, loop CPU, jobs."""
    cpu_dir = out.parent / f"{out.name}_cpu"
    for d in (out, cpu_dir):
        shutil.rmtree(d, ignore_errors=True)
    cpu_dir.mkdir(parents=True)
    env = {**env, "HARNESS_BENCH_CPU_DIR": str(cpu_dir),
           "PYTHONPATH": os.pathsep.join([str(hook_dir), str(ROOT)])}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "run.py", "-m", *launcher, *grid, f"hydra.sweep.dir={out}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if r.returncode:
        raise RuntimeError(f"sweep {launcher} failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}")
    time.sleep(1.5)   # the last periodic records of processes still stopping
    cpu = {"driver": 0.0, "worker": 0.0, "other": 0.0}
    procs = {"driver": 0, "worker": 0, "other": 0}
    for f in cpu_dir.glob("*.json"):
        rec = json.loads(f.read_text())
        k = role(rec["argv"])
        cpu[k] += float(rec["cpu_s"])
        procs[k] += 1
    jobs, loop = {}, 0.0
    for d in sorted(p for p in out.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((d / "summary.json").read_text())
        jobs[d.name] = d
        loop += float(s["cost_loop_cpu_s"])
    start = next((ln for ln in r.stdout.splitlines() if ln.startswith("sweep executor")), "one task per job")
    return {"cpu": cpu, "procs": procs, "wall_s": wall, "loop_s": loop, "jobs": jobs, "start": start}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedulers", default="conserve,collocated")
    ap.add_argument("--seeds", default="0,1,2,3", help="workload.seed values")
    ap.add_argument("--num-conversations", type=int, default=10)
    ap.add_argument("--jobs-per-task", type=int, default=4, help="hydra.launcher.jobs_per_task of the chunked sweeps")
    ap.add_argument("--backends", default="slurm,ray")
    ap.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray the sweeps start")
    ap.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary directory)")
    args = ap.parse_args(argv)
    scheds = [s for s in args.schedulers.split(",") if s]
    seeds = [s for s in args.seeds.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    if not scheds or not seeds or args.num_conversations < 1 or args.jobs_per_task < 1 or \
            not set(backends) <= {"slurm", "ray"} or not backends:
        ap.error("--schedulers/--seeds non-empty, --num-conversations/--jobs-per-task >= 1, --backends of slurm,ray")
    n = len(scheds) * len(seeds)
    grid = [f"scheduler={','.join(scheds)}", f"workload.seed={','.join(seeds)}",
            f"workload.num_conversations={args.num_conversations}", "logger.progress=false"]
    tmp = Path(tempfile.mkdtemp(prefix="cluster_sweep_"))
    out = args.out or tmp
    out.mkdir(parents=True, exist_ok=True)
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    base_env = {**os.environ, "HARNESS_CACHE_DIR": "off", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    load0 = os.getloadavg()
    print(f"slice: {len(scheds)} variants x {len(seeds)} seeds = {n} jobs of {args.num_conversations} conversations; "
          f"chunked: {args.jobs_per_task} jobs a task; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{len(os.sched_getaffinity(0))} cores", flush=True)
    rows, bad = [], 0
    slurm = None
    try:
        for backend in backends:
            if backend == "slurm":
                from tests import slurm_local
                why = slurm_local.available()
                if why:
                    print(f"error: no local Slurm: {why}", file=sys.stderr)
                    return 2
                slurm = slurm_local.LocalSlurm(tmp / "slurm")
                print(f"local Slurm up in {slurm.start():.1f} s", flush=True)
                env = {**base_env, "SLURM_CONF": slurm.env["SLURM_CONF"]}
                common = ["hydra.launcher.partition=debug", "hydra.launcher.mem_gb=null"]
                pair = {"one task per job (hydra/launcher=slurm)": ["hydra/launcher=slurm", *common],
                        "chunks (hydra/launcher=pool_slurm)": ["hydra/launcher=pool_slurm", *common,
                                                               f"hydra.launcher.jobs_per_task={args.jobs_per_task}"]}
            else:
                env = base_env
                common = ["hydra.launcher.ray.init.address=local", "+hydra.launcher.ray.init.include_dashboard=false",
                          f"+hydra.launcher.ray.init.num_cpus={args.ray_cpus}"]
                pair = {"one task per job (hydra/launcher=ray)": ["hydra/launcher=ray", *common],
                        "chunks (hydra/launcher=pool_ray)": ["hydra/launcher=pool_ray", *common,
                                                             "+hydra.launcher.ray.init.object_store_memory=78643200",
                                                             f"hydra.launcher.jobs_per_task={args.jobs_per_task}"]}
            res = {}
            for i, (label, launcher) in enumerate(pair.items()):
                m = sweep(launcher, grid, out / f"{backend}_{i}", env, hook)
                res[label] = m
                fixed = (m["cpu"]["driver"] + m["cpu"]["worker"] - m["loop_s"]) / n
                rows.append((backend, label, m, fixed))
                print(f"{backend} {label}: submitting process {m['cpu']['driver']:.1f} s, tasks/workers "
                      f"{m['cpu']['worker']:.1f} s ({m['procs']['worker']} processes), loop {m['loop_s']:.1f} s, "
                      f"fixed per job {fixed:.2f} s CPU; other Python {m['cpu']['other']:.1f} s "
                      f"({m['procs']['other']} processes); wall {m['wall_s']:.1f} s; {m['start']}", flush=True)
            a, b = (m["jobs"] for m in res.values())
            for name in sorted(set(a) | set(b)):
                if name not in a or name not in b:
                    bad += 1
                    print(f"{backend} {name}: MISSING in one sweep")
                    continue
                diffs = compare(a[name], b[name])
                same = all((a[name] / t).read_bytes() == (b[name] / t).read_bytes() for t in TABLES
                           if (a[name] / t).exists() or (b[name] / t).exists())
                bad += bool(diffs) or not same
                if diffs or not same:
                    print(f"{backend} {name}: DIFFERENT {'; '.join(diffs)}{'' if same else ' (parquet bytes differ)'}")
            if slurm is not None:
                slurm.stop()
                slurm = None
        load1 = os.getloadavg()
        print(f"\n## Fixed cost per job, {n} jobs ({', '.join(scheds)} x seeds {', '.join(seeds)}, "
              f"{args.num_conversations} conversations)\n")
        print("| backend | launcher | submitting process CPU s | task / worker CPU s (processes) | loop CPU s | "
              "fixed per job, CPU s | Ray's Python daemons CPU s | wall s |\n|---|---|---|---|---|---|---|---|")
        for backend, label, m, fixed in rows:
            print(f"| {backend} | {label} | {m['cpu']['driver']:.1f} | {m['cpu']['worker']:.1f} ({m['procs']['worker']}) | "
                  f"{m['loop_s']:.1f} | {fixed:.2f} | {m['cpu']['other']:.1f} | {m['wall_s']:.1f} |")
        print(f"\nload average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
              f"{load1[2]:.2f}")
        print(f"results: {'every job IDENTICAL, parquet bytes the same' if not bad else f'{bad} jobs DIFFERENT'}")
        if args.out is not None:
            (out / "cluster_sweep.json").write_text(json.dumps(
                [{"backend": b, "launcher": label, "cpu": m["cpu"], "procs": m["procs"], "loop_s": m["loop_s"],
                  "fixed_per_job_s": f, "wall_s": m["wall_s"], "jobs": n} for b, label, m, f in rows], indent=1))
    finally:
        if slurm is not None:
            slurm.stop()
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
