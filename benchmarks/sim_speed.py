"""Simulator speed on the full shipped SWE-bench trace (500 conversations, 20,163 LLM calls), side by side with
an older commit of this project.

Usage::

    python benchmarks/sim_speed.py [--base b3737c3] [--schedulers conserve,ampd,...] [--rates 0.02,0.05,0.1,0.2]
                                   [--repeat 3] [--runpy-repeat 3] [--no-pin] [--skip schedulers,rates,runpy,slo]

What it prints (every measurement is repeated ``--repeat`` times, the two checkouts interleaved so that they
share the machine's load; medians, with the spread min-max in brackets):

* per scheduler (main job: a40_1p3d, 0.05 conv/s): simulated LLM calls per wall-second and per CPU-second,
  clock events per wall-second, for this checkout and for ``--base`` (a temporary ``git worktree`` of that
  commit, removed afterwards), and their ratio (this / base, calls per second);
* the cost-vs-rate curve (ConServe, ``--rates``): wall and CPU seconds per event and per call, and the cost
  per event relative to the 0.05 conv/s run, for both checkouts;
* the unloaded-TTFET SLO baseline (500 solo replays) without any cache;
* ``python run.py`` as a whole process (wall and CPU), this checkout with a cold and a warm on-disk cache
  (``HARNESS_CACHE_DIR``), and the base.

Each measurement runs in a fresh subprocess of the checkout measured (``python -c``; the same code for both,
using whichever of ``harness.session`` / ``harness.runner`` holds ``simulate``). ``--pin`` (default) pins
every subprocess to the same single core (``os.sched_setaffinity``), so neither side gets a second core.
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

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["root"])
from hydra import compose, initialize_config_dir
from harness.config import PROJECT_ROOT, register_configs, resolve
try:
    from harness.session import simulate, unloaded_ttfet
except ImportError:
    from harness.runner import simulate, unloaded_ttfet
from harness.trace import load_trace
from harness.workload import build_workload
register_configs()
with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=[f"scheduler={args['scheduler']}", "cluster=a40_1p3d",
                                                   f"workload.rate_per_s={args['rate']}"])
run = resolve(cfg)
convs, stats = build_workload(load_trace(run.trace_path), run.cfg.workload)
w0, c0 = time.perf_counter(), time.process_time()
if args["what"] == "slo":
    unloaded_ttfet(run, convs, stats)
    calls, events = sum(len(r.turns) for _, r in convs), 0
else:
    res = simulate(run, convs, stats, args["scheduler"], run.scheduler)
    assert not res.error, res.error
    calls, events = len(res.turns), res.events
print("RESULT " + json.dumps({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
                              "calls": calls, "events": events}))
"""


def _preexec(pin: bool):
    if not pin or not hasattr(os, "sched_setaffinity"):
        return None
    core = sorted(os.sched_getaffinity(0))[0]
    return lambda: os.sched_setaffinity(0, {core})


def worker(root: Path, pin: bool, env: dict, **args) -> dict:
    """One measurement in a fresh interpreter of checkout ``root``."""
    r = subprocess.run([sys.executable, "-c", WORKER, json.dumps({"root": str(root), **args})], cwd=root,
                       capture_output=True, text=True, env=env, preexec_fn=_preexec(pin))
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker in {root} failed ({args}):\n{r.stderr[-3000:]}")


def runpy(root: Path, pin: bool, env: dict) -> dict:
    """``python run.py`` (the main job) as a whole process: wall and CPU (children's user + sys) seconds."""
    out = tempfile.mkdtemp(prefix="simspeed_run_")
    c0 = os.times()
    w0 = time.perf_counter()
    r = subprocess.run([sys.executable, "run.py", f"hydra.run.dir={out}", "logger.progress=false"], cwd=root,
                       capture_output=True, text=True, env=env, preexec_fn=_preexec(pin))
    wall = time.perf_counter() - w0
    c1 = os.times()
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode:
        raise RuntimeError(f"run.py in {root} failed:\n{r.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)}


def med(xs: list[float]) -> str:
    """Median with the spread of the repeats."""
    if len(xs) == 1:
        return f"{xs[0]:.3g}"
    return f"{statistics.median(xs):.3g} [{min(xs):.3g}-{max(xs):.3g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="b3737c3", help="commit to compare with ('' for none)")
    ap.add_argument("--schedulers", default="conserve,ampd,collocated,disaggregated,wait,nested_wait")
    ap.add_argument("--rates", default="0.02,0.05,0.1,0.2", help="the cost-vs-rate curve (ConServe), conv/s")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runpy-repeat", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: schedulers, rates, slo, runpy")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the subprocesses to one core")
    args = ap.parse_args()
    pin = not args.no_pin
    skip = set(filter(None, args.skip.split(",")))
    checkouts = {"this": ROOT}
    base_dir = None
    if args.base:
        base_dir = Path(tempfile.mkdtemp(prefix="simspeed_base_")) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_dir), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        checkouts["base"] = base_dir
    cache = tempfile.mkdtemp(prefix="simspeed_cache_")
    env_off = {**os.environ, "HARNESS_CACHE_DIR": "off"}
    try:
        print(f"this checkout: {ROOT} (HEAD {_sha(ROOT)}); base: {args.base or '-'}; pinned: {pin}; "
              f"repeats: {args.repeat} (medians [min-max])", flush=True)
        if "schedulers" not in skip:
            print("\n## Full trace per scheduler (a40_1p3d, 0.05 conv/s): simulated LLM calls per second")
            print(f"| scheduler | calls | this calls/wall-s | this calls/CPU-s | this events | this events/wall-s "
                  f"| base calls/wall-s | base calls/CPU-s | base events | ratio (wall) | ratio (CPU) |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for name in args.schedulers.split(","):
                m = {k: [] for k in checkouts}
                for _ in range(args.repeat):
                    for k, root in checkouts.items():
                        m[k].append(worker(root, pin, env_off, what="sim", scheduler=name, rate=0.05))
                print(_row(name, m), flush=True)
        if "rates" not in skip:
            print("\n## Cost vs arrival rate (ConServe, full trace): CPU microseconds per event and per call")
            print("| rate (conv/s) | checkout | calls | events | wall s | CPU s | CPU us/event | CPU us/call "
                  "| us/event vs 0.05 |")
            print("|---|---|---|---|---|---|---|---|---|")
            rates = [float(r) for r in args.rates.split(",")]
            res = {(k, r): [] for k in checkouts for r in rates}
            for _ in range(args.repeat):
                for r in rates:
                    for k, root in checkouts.items():
                        res[(k, r)].append(worker(root, pin, env_off, what="sim", scheduler="conserve", rate=r))
            for k in checkouts:
                ref = statistics.median([x["cpu_s"] / x["events"] for x in res[(k, 0.05)]]) if (k, 0.05) in res else None
                for r in rates:
                    xs = res[(k, r)]
                    per_ev = [x["cpu_s"] / x["events"] * 1e6 for x in xs]
                    rel = f"{statistics.median(per_ev) / (ref * 1e6):.2f}x" if ref else "-"
                    print(f"| {r} | {k} | {xs[0]['calls']} | {xs[0]['events']} | {med([x['wall_s'] for x in xs])} "
                          f"| {med([x['cpu_s'] for x in xs])} | {med(per_ev)} "
                          f"| {med([x['cpu_s'] / x['calls'] * 1e6 for x in xs])} | {rel} |", flush=True)
        if "slo" not in skip:
            print("\n## Unloaded-TTFET SLO baseline (500 solo replays, no cache)")
            m = {k: [] for k in checkouts}
            for _ in range(args.repeat):
                for k, root in checkouts.items():
                    m[k].append(worker(root, pin, env_off, what="slo", scheduler="conserve", rate=0.05))
            for k in checkouts:
                print(f"{k}: wall {med([x['wall_s'] for x in m[k]])} s, CPU {med([x['cpu_s'] for x in m[k]])} s")
            if "base" in m:
                print(f"ratio base/this (CPU): {statistics.median([x['cpu_s'] for x in m['base']]) / statistics.median([x['cpu_s'] for x in m['this']]):.2f}x")
        if "runpy" not in skip:
            print("\n## python run.py (main job) as a whole process, s")
            warm = {**os.environ, "HARNESS_CACHE_DIR": cache}
            runpy(ROOT, pin, warm)   # fills the warm cache
            m = {"this (cold cache)": [], "this (warm cache)": [], **({"base": []} if base_dir else {})}
            for _ in range(args.runpy_repeat):
                cold = {**os.environ, "HARNESS_CACHE_DIR": tempfile.mkdtemp(prefix="simspeed_cold_")}
                m["this (cold cache)"].append(runpy(ROOT, pin, cold))
                shutil.rmtree(cold["HARNESS_CACHE_DIR"], ignore_errors=True)
                m["this (warm cache)"].append(runpy(ROOT, pin, warm))
                if base_dir:
                    m["base"].append(runpy(base_dir, pin, env_off))
            for k, xs in m.items():
                print(f"{k}: wall {med([x['wall_s'] for x in xs])}, CPU {med([x['cpu_s'] for x in xs])}")
            if base_dir:
                b = statistics.median([x["wall_s"] for x in m["base"]])
                bc = statistics.median([x["cpu_s"] for x in m["base"]])
                for k in ("this (cold cache)", "this (warm cache)"):
                    print(f"speed-up vs base, {k}: wall {b / statistics.median([x['wall_s'] for x in m[k]]):.2f}x, "
                          f"CPU {bc / statistics.median([x['cpu_s'] for x in m[k]]):.2f}x")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if base_dir is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_dir)], cwd=ROOT, capture_output=True)
            shutil.rmtree(base_dir.parent, ignore_errors=True)


def _row(name: str, m: dict) -> str:
    t = m["this"]
    cells = [name, str(t[0]["calls"]), med([x["calls"] / x["wall_s"] for x in t]),
             med([x["calls"] / x["cpu_s"] for x in t]), str(t[0]["events"]), med([x["events"] / x["wall_s"] for x in t])]
    if "base" in m:
        b = m["base"]
        ratio_w = statistics.median([x["calls"] / x["wall_s"] for x in t]) / statistics.median([x["calls"] / x["wall_s"] for x in b])
        ratio_c = statistics.median([x["calls"] / x["cpu_s"] for x in t]) / statistics.median([x["calls"] / x["cpu_s"] for x in b])
        cells += [med([x["calls"] / x["wall_s"] for x in b]), med([x["calls"] / x["cpu_s"] for x in b]),
                  str(b[0]["events"]), f"{ratio_w:.2f}x", f"{ratio_c:.2f}x"]
    else:
        cells += ["-"] * 5
    return "| " + " | ".join(cells) + " |"


def _sha(root: Path) -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return r.stdout.strip() or "?"


if __name__ == "__main__":
    main()
