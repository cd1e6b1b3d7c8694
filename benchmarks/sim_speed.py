"""Simulator speed and memory of the main job (``python run.py``: ConServe, the shipped SWE-bench trace, a40_1p3d,
0.05 conv/s), side by side with another commit of this project, with the speed targets (LLM calls and events per
CPU-second, warm ``run.py`` time, peak RSS, memory per conversation, linearity) as met / missed.

Usage::

    python benchmarks/sim_speed.py [--base fb9cdea] [--quick] [--schedulers conserve,ampd,...]
        [--rates 0.02,0.05,0.1,0.2] [--conversations 250,500,1000,2000] [--num-conversations N]
        [--repeat 3] [--runpy-repeat 3] [--skip schedulers,rates,conversations,runpy] [--no-pin]

Honest by construction:

* every measurement builds exactly the workload ``python run.py`` builds: the worker calls the checkout's own
  ``harness.run.runner.prepare`` (trace, sampling, arrivals **and the model's context limit**), or, in a checkout
  without it, ``build_workload(records, cfg.workload, context_limit(run))`` -- the same thing; the session is
  the main job's (instance samples every ``logger.metrics_interval_s``, decisions logged as ``logger``
  says); a consistency line compares the worker's LLM calls with ``run.py``'s ``summary.json``; the worker
  freezes its start-up heap before the loop as ``run.py`` does (``gc.freeze``: until 2026-12-07 it did not, and a
  full collection walking the modules and the trace could fall inside a short run: ~55 ms of WAIT's ~0.5-s loop at
  20 conversations, docs/speed.md "seventh round");
* ``python run.py`` always writes into a fresh temporary directory (``run.py`` skips a run whose directory
  is complete, so a loop into one fixed directory would time nothing); a run that prints "skipped" is an
  error here;
* CPU seconds (user + system, from ``os.wait4`` of each subprocess) are the measure, as the machine is
  shared; wall seconds are printed beside them. Each measurement is a fresh subprocess of the checkout
  measured, the two checkouts interleaved; ``--repeat`` times, medians with [min-max].

What it prints (markdown):

1. per scheduler (conserve, ampd, collocated, disaggregated, wait, nested_wait): LLM calls, clock events,
   calls and events per CPU-second of the simulation loop, peak RSS of the worker, for this checkout and
   ``--base``, and the ratio this / base of calls per CPU-second;
2. the cost-vs-rate curve (ConServe, ``--rates``): CPU us per event and per call;
3. the cost-vs-conversations curve (``python run.py`` whole process, ConServe, ``workload.num_conversations``
   from ``--conversations`` with ``workload.sample=with_replacement``, warm cache): CPU s, CPU s per
   conversation, peak RSS, and the marginal cost between successive points (MB and CPU ms per conversation);
4. ``python run.py`` (the main job) as a whole process: cold (an empty ``HARNESS_CACHE_DIR``: the
   unloaded-TTFET replays run) and warm (a cache the same checkout filled), CPU and wall; every run.py keeps its
   compiled bytecode (``_bytecode_env``: as on a user's machine after the first run, also where the machine sets
   ``PYTHONDONTWRITEBYTECODE``);
5. the speed targets (:func:`targets`, stated against ``fb9cdea``): each with the measured value and ``met`` /
   ``missed`` (``n/a`` when the part was skipped or, for a ratio, without ``--base``).

``--base REV`` runs a temporary ``git worktree`` of ``REV`` (removed afterwards); ``--base ''`` measures this
checkout alone. ``--quick``: a smoke run (``--repeat 1``, a 30-conversation workload, two points per curve);
its numbers are not the targets' measurements. ``--pin`` (default) pins every subprocess to one core.

The linearity rule (target "cost linear in conversations"): the marginal cost per conversation of the curve's
last interval (delta CPU s / delta n, and delta peak RSS / delta n) is at most 1.5x that of the interval
before it -- on the default doubling curve a linear cost keeps it at 1x, a quadratic one doubles it (the
first interval is left out: the fixed start-up cost and its noise weigh most there); the per-conversation
memory target is the
marginal peak RSS from the curve's smallest point to 2,000 conversations (the issue's 0.44 MB for fb9cdea is
(1.0 GiB - 345 MiB) / 1,500 conversations).
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
SCHEDULERS = "conserve,ampd,collocated,disaggregated,wait,nested_wait"

WORKER = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["root"])
import importlib, os
from hydra import compose, initialize_config_dir
# module paths by the checkout's layout (its own, never this checkout's: an editable install elsewhere
# could otherwise serve a module the base does not have): the wings (harness/run/, ...) or the flat harness/
WINGS = os.path.isdir(os.path.join(args["root"], "harness", "run"))
def mod(new, old):
    return importlib.import_module(new if WINGS else old)
config = mod("harness.run.config", "harness.config")
PROJECT_ROOT, register_configs, resolve = config.PROJECT_ROOT, config.register_configs, config.resolve
session = mod("harness.run.session", "harness.session")
runner = mod("harness.run.runner", "harness.runner")
simulate = getattr(session, "simulate", None) or runner.simulate
# the session's typed input (a checkout before it passes the resolved run itself)
session_input = getattr(session, "session_input", lambda run: run)
assert os.path.realpath(session.__file__).startswith(os.path.realpath(args["root"])), session.__file__
register_configs()
with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=args["overrides"])
run = resolve(cfg)
if hasattr(runner, "prepare"):   # exactly run.py's workload: trace, sampling, arrivals and the context limit
    convs, stats, limit = runner.prepare(run)
else:
    limit = session.context_limit(run)
    convs, stats = mod("harness.workload.workload", "harness.workload").build_workload(
        mod("harness.core.trace", "harness.trace").load_trace(run.trace_path), run.cfg.workload, limit)
lg = run.cfg.logger
import gc
gc.freeze()   # the start-up heap out of the collector's walks, as run.py's run does (harness.run.runner._execute)
w0, c0 = time.perf_counter(), time.process_time()
res = simulate(session_input(run), convs, stats, run.scheduler_name, run.scheduler, sample_interval_s=lg.metrics_interval_s,
               log_decisions=lg.log_decisions)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
assert not res.error, res.error
rec = res.recorder
calls = rec.num_turns if hasattr(rec, "num_turns") else len(rec.turns)
print("RESULT " + json.dumps({"wall_s": wall, "cpu_s": cpu, "calls": calls, "events": res.events,
                              "conversations": len(convs), "context_limit": limit,
                              "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _preexec(pin: bool):
    if not pin or not hasattr(os, "sched_setaffinity"):
        return None
    core = sorted(os.sched_getaffinity(0))[0]
    return lambda: os.sched_setaffinity(0, {core})


def _spawn(cmd: list, root: Path, env: dict, pin: bool) -> dict:
    """Run ``cmd`` in ``root``; its stdout/stderr, exit status, wall s, CPU s (user + system of it and the
    children it waited for, ``os.wait4``) and peak RSS (MiB)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        w0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=err, text=True, preexec_fn=_preexec(pin),
                             env={**env, "PYTHONPATH": str(root)})
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - w0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"rc": p.returncode, "stdout": out.read(), "stderr": err.read(), "wall_s": wall,
                "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024}


def worker(root: Path, pin: bool, env: dict, overrides: list) -> dict:
    """One simulation of the main job's session in a fresh interpreter of checkout ``root``."""
    r = _spawn([sys.executable, "-c", WORKER, json.dumps({"root": str(root), "overrides": overrides})], root, env,
               pin)
    for line in r["stdout"].splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "process_cpu_s": r["cpu_s"]}
    raise RuntimeError(f"worker in {root} failed ({overrides}):\n{r['stderr'][-3000:]}")


def _bytecode_env(root: Path) -> dict:
    """The environment of a ``python run.py`` measurement of checkout ``root``: this one, but with compiled
    bytecode kept (under ``PYTHONPYCACHEPREFIX`` = ``$TMPDIR/simspeed_pyc``), as on a user's machine after the
    first run. A machine that sets ``PYTHONDONTWRITEBYTECODE=1`` (this project's CI machine does) would
    otherwise recompile every imported module of the checkout in every run (~0.3 s CPU of run.py's ~7 s), which
    no user pays twice. The first run of each checkout (the one that fills the warm cache) writes the bytecode.

    One prefix for every checkout: Python keeps a module's bytecode there under the source's absolute path, so two
    checkouts never share their modules' bytecode, and the site-packages' (which a prefix also moves there: Python
    then reads no ``__pycache__``) is compiled once per machine. (A prefix per checkout, as until 2026-12-06,
    compiled all of NumPy, pandas, pyarrow and Hydra again for every ``--base`` worktree, whose path is new on each
    run: its first run.py cost 7.1 instead of 2.9 CPU s, load ~8.)"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "simspeed_pyc")
    return env


def runpy(root: Path, pin: bool, cache_dir: str, overrides: Optional[list] = None) -> dict:
    """``python run.py`` (the main job, plus ``overrides``) as a whole process, into a fresh directory."""
    parent = tempfile.mkdtemp(prefix="simspeed_run_")
    out = Path(parent) / "run"          # does not exist yet: run.py cannot skip it as complete
    try:
        r = _spawn([sys.executable, "run.py", f"hydra.run.dir={out}", "logger.progress=false", *(overrides or [])],
                   root, {**_bytecode_env(root), "HARNESS_CACHE_DIR": cache_dir}, pin)
        if r["rc"] or "skipped" in r["stdout"]:
            raise RuntimeError(f"run.py in {root} failed or skipped ({overrides}):\n{r['stdout'][-1500:]}"
                               f"\n{r['stderr'][-3000:]}")
        s = json.loads((out / "summary.json").read_text())
        r["calls"] = int(s.get("num_turns", 0)) + int(s.get("num_turns_failed", 0))
        r["conversations"] = int(s.get("num_conversations", 0))
        return r
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def med(xs: list) -> float:
    return statistics.median(xs)


def fmt(xs: list, digits: int = 3) -> str:
    """Median with the spread of the repeats."""
    if len(xs) == 1:
        return f"{xs[0]:.{digits}g}"
    return f"{med(xs):.{digits}g} [{min(xs):.{digits}g}-{max(xs):.{digits}g}]"


def _sha(root: Path) -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return r.stdout.strip() or "?"


def verdict(value: Optional[float], ok: Optional[bool]) -> str:
    return "n/a" if value is None or ok is None else ("met" if ok else "missed")


def main(argv: Optional[list] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="fb9cdea", help="commit to compare with ('' for none); the targets are "
                                                      "stated against fb9cdea")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, a 30-conversation workload, "
                                                         "two points per curve (not the targets' measurement)")
    ap.add_argument("--schedulers", default=SCHEDULERS)
    ap.add_argument("--rates", default=None, help="the cost-vs-rate curve (ConServe), conv/s "
                                                  "(default 0.02,0.05,0.1,0.2)")
    ap.add_argument("--conversations", default=None, help="the cost-vs-conversations curve, workload."
                                                          "num_conversations (default 250,500,1000,2000)")
    ap.add_argument("--num-conversations", type=int, default=None,
                    help="workload.num_conversations of the scheduler table and run.py (default: run.py's, all 500)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats per measurement (default 3)")
    ap.add_argument("--runpy-repeat", type=int, default=None, help="repeats of python run.py (default 3)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: schedulers, rates, conversations, runpy")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the subprocesses to one core")
    ap.add_argument("--json", default=None, help="also write every measurement to this JSON file")
    args = ap.parse_args(argv)
    q = args.quick
    repeat = args.repeat or (1 if q else 3)
    runpy_repeat = args.runpy_repeat or (1 if q else 3)
    rates = [float(r) for r in (args.rates or ("0.05,0.1" if q else "0.02,0.05,0.1,0.2")).split(",")]
    ns = [int(n) for n in (args.conversations or ("15,30" if q else "250,500,1000,2000")).split(",")]
    n_main = args.num_conversations or (30 if q else None)
    size = [f"workload.num_conversations={n_main}"] if n_main else []
    pin = not args.no_pin
    skip = set(filter(None, args.skip.split(",")))
    unknown = skip - {"schedulers", "rates", "conversations", "runpy"}
    if unknown:
        ap.error(f"--skip: unknown part(s) {sorted(unknown)}")
    checkouts = {"this": ROOT}
    tmp = Path(tempfile.mkdtemp(prefix="simspeed_"))
    base_dir = None
    if args.base:
        base_dir = tmp / "base"
        r = subprocess.run(["git", "worktree", "add", "--detach", str(base_dir), args.base], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            sys.exit(f"error: --base {args.base}: git worktree add failed: {r.stderr.strip()}")
        checkouts["base"] = base_dir
    warm = {k: str(tmp / f"cache_{k}") for k in checkouts}
    env = {**os.environ, "HARNESS_CACHE_DIR": "off"}
    data: dict = {"base": args.base, "quick": q, "this_sha": _sha(ROOT),
                  "base_sha": _sha(base_dir) if base_dir else None}
    main_job = {}   # per checkout: the conserve worker result (events per CPU-second of the loop)
    try:
        print(f"this checkout: {ROOT} (HEAD {data['this_sha']}); base: {args.base or '-'}"
              f"{' (' + data['base_sha'] + ')' if base_dir else ''}; pinned: {pin}; repeats: {repeat} "
              f"(medians [min-max]); CPU s = user + system{'; QUICK smoke run' if q else ''}", flush=True)
        if "schedulers" not in skip:
            print(f"\n## Per scheduler: the main job's session (a40_1p3d, 0.05 conv/s"
                  f"{f', {n_main} conversations' if n_main else ''}), simulation loop only")
            print("| scheduler | checkout | conversations | calls | events | calls/CPU-s | events/CPU-s | CPU s "
                  "| wall s | peak RSS MiB | calls/CPU-s this/base |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            data["schedulers"] = {}
            for name in args.schedulers.split(","):
                m = {k: [] for k in checkouts}
                for _ in range(repeat):
                    for k, root in checkouts.items():
                        m[k].append(worker(root, pin, env, [f"scheduler={name}", *size]))
                data["schedulers"][name] = m
                cps = {k: med([x["calls"] / x["cpu_s"] for x in xs]) for k, xs in m.items()}
                for k, xs in m.items():
                    ratio = f"{cps['this'] / cps['base']:.2f}x" if "base" in cps and k == "this" else ""
                    print(f"| {name} | {k} | {xs[0]['conversations']} | {xs[0]['calls']} | {xs[0]['events']} "
                          f"| {fmt([x['calls'] / x['cpu_s'] for x in xs])} "
                          f"| {fmt([x['events'] / x['cpu_s'] for x in xs])} | {fmt([x['cpu_s'] for x in xs])} "
                          f"| {fmt([x['wall_s'] for x in xs])} | {fmt([x['rss_mib'] for x in xs])} | {ratio} |",
                          flush=True)
                if name == "conserve":
                    main_job = m
        if "rates" not in skip:
            print("\n## Cost vs arrival rate (ConServe, the main job's session): CPU us per event and per call")
            print("| rate (conv/s) | checkout | calls | events | CPU s | CPU us/event | CPU us/call | us/event vs "
                  "the lowest rate |")
            print("|---|---|---|---|---|---|---|---|")
            res = {(k, r): [] for k in checkouts for r in rates}
            for _ in range(repeat):
                for r in rates:
                    for k, root in checkouts.items():
                        res[(k, r)].append(worker(root, pin, env, ["scheduler=conserve", f"workload.rate_per_s={r}",
                                                                   *size]))
            data["rates"] = {f"{k}@{r}": v for (k, r), v in res.items()}
            for k in checkouts:
                ref = med([x["cpu_s"] / x["events"] for x in res[(k, rates[0])]])
                for r in rates:
                    xs = res[(k, r)]
                    per_ev = [x["cpu_s"] / x["events"] * 1e6 for x in xs]
                    print(f"| {r:g} | {k} | {xs[0]['calls']} | {xs[0]['events']} | {fmt([x['cpu_s'] for x in xs])} "
                          f"| {fmt(per_ev)} | {fmt([x['cpu_s'] / x['calls'] * 1e6 for x in xs])} "
                          f"| {med(per_ev) / (ref * 1e6):.2f}x |", flush=True)
        curve = {}
        if "conversations" not in skip:
            print("\n## Cost vs conversations (python run.py whole process, ConServe, "
                  "workload.sample=with_replacement, warm cache)")
            print("| conversations | checkout | calls | CPU s | CPU ms/conversation | peak RSS MiB "
                  "| marginal CPU ms/conv | marginal MB/conv |")
            print("|---|---|---|---|---|---|---|---|")
            for k, root in checkouts.items():   # fill each checkout's warm cache (the unloaded-TTFET replays)
                runpy(root, pin, warm[k], ["workload.sample=with_replacement", f"workload.num_conversations={ns[0]}"])
            for k, root in checkouts.items():
                pts = []
                for n in ns:
                    xs = [runpy(root, pin, warm[k], ["workload.sample=with_replacement",
                                                     f"workload.num_conversations={n}"]) for _ in range(repeat)]
                    pts.append((n, med([x["cpu_s"] for x in xs]), med([x["rss_mib"] for x in xs]), xs))
                curve[k] = pts
                prev = None
                for n, cpu, rss, xs in pts:
                    mc = mm = ""
                    if prev is not None:
                        mc = f"{(cpu - prev[1]) / (n - prev[0]) * 1e3:.3g}"
                        mm = f"{(rss - prev[2]) * 1.048576 / (n - prev[0]):.3g}"
                    print(f"| {n} | {k} | {xs[0]['calls']} | {fmt([x['cpu_s'] for x in xs])} | {cpu / n * 1e3:.3g} "
                          f"| {fmt([x['rss_mib'] for x in xs])} | {mc} | {mm} |", flush=True)
                    prev = (n, cpu, rss)
            data["conversations"] = {k: [(n, c, r) for n, c, r, _ in v] for k, v in curve.items()}
        rp = {}
        if "runpy" not in skip:
            print(f"\n## python run.py (the main job{f', {n_main} conversations' if n_main else ''}) as a whole "
                  f"process: CPU s and wall s, peak RSS")
            # the warm cache of the main job: where the cost-vs-conversations curve ran (its run.py processes have
            # compiled the checkout's bytecode), the first cold run fills an empty cache of its own (a run into an
            # empty cache is what filling one is) and the warm runs read it; else a run first fills warm[k] (and
            # writes the bytecode, so that no measured run compiles)
            main_warm = {}
            for k, root in checkouts.items():
                if curve:   # an empty directory, as a cold run's below
                    main_warm[k] = tempfile.mkdtemp(prefix=f"main_cache_{k}_", dir=tmp)
                else:
                    runpy(root, pin, warm[k], size)   # fills (or keeps) the warm cache of this checkout
                    main_warm[k] = warm[k]
            m = {f"{k} {c}": [] for k in checkouts for c in ("cold", "warm")}
            for i in range(runpy_repeat):
                for k, root in checkouts.items():
                    fills = i == 0 and main_warm[k] != warm[k]
                    cold = main_warm[k] if fills else tempfile.mkdtemp(prefix="cold_", dir=tmp)
                    m[f"{k} cold"].append(runpy(root, pin, cold, size))
                    if not fills:
                        shutil.rmtree(cold, ignore_errors=True)
                    m[f"{k} warm"].append(runpy(root, pin, main_warm[k], size))
            print("| checkout, cache | calls | CPU s | wall s | peak RSS MiB |")
            print("|---|---|---|---|---|")
            for k, xs in m.items():
                print(f"| {k} | {xs[0]['calls']} | {fmt([x['cpu_s'] for x in xs])} | {fmt([x['wall_s'] for x in xs])} "
                      f"| {fmt([x['rss_mib'] for x in xs])} |")
            if base_dir:
                for c in ("cold", "warm"):
                    b, t = med([x["cpu_s"] for x in m[f"base {c}"]]), med([x["cpu_s"] for x in m[f"this {c}"]])
                    bw, tw = med([x["wall_s"] for x in m[f"base {c}"]]), med([x["wall_s"] for x in m[f"this {c}"]])
                    print(f"speed-up this vs base, {c} cache: CPU {b / t:.2f}x, wall {bw / tw:.2f}x")
            if main_job:
                w, r = main_job["this"][0]["calls"], m["this warm"][0]["calls"]
                print(f"workload check: the benchmark's worker simulated {w} LLM calls, run.py's summary.json "
                      f"counts {r} ({'the same' if w == r else 'DIFFERENT'})")
            rp = {k: {"cpu_s": med([x["cpu_s"] for x in xs]), "wall_s": med([x["wall_s"] for x in xs]),
                      "rss_mib": med([x["rss_mib"] for x in xs])} for k, xs in m.items()}
            data["runpy"] = rp
        data["targets"] = targets(data, main_job, curve, rp, args.base, q)
    finally:
        if base_dir is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_dir)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    return data


def targets(data: dict, main_job: dict, curve: dict, rp: dict, base: str, quick: bool) -> list:
    """Print and return the speed targets (stated against ``fb9cdea``: LLM calls and events per CPU-second, warm
    ``run.py`` time, peak RSS, memory per conversation, linearity) with the measured values and met / missed."""
    rows = []
    sch = data.get("schedulers", {})
    for name in SCHEDULERS.split(","):
        want = 4.0 if name in ("wait", "nested_wait") else 2.0
        r = None
        if name in sch and "base" in sch[name]:
            r = (med([x["calls"] / x["cpu_s"] for x in sch[name]["this"]])
                 / med([x["calls"] / x["cpu_s"] for x in sch[name]["base"]]))
        rows.append((f"LLM calls per CPU-second >= {want:g}x base: {name}", None if r is None else f"{r:.2f}x",
                     verdict(r, None if r is None else r >= want)))
    ev = med([x["events"] / x["cpu_s"] for x in main_job["this"]]) if main_job else None
    rows.append(("events per CPU-second of the main job's loop >= 80 k", None if ev is None else f"{ev / 1e3:.1f} k",
                 verdict(ev, None if ev is None else ev >= 80e3)))
    sp = rp["base warm"]["cpu_s"] / rp["this warm"]["cpu_s"] if "base warm" in rp else None
    rows.append(("python run.py whole process >= 1.7x faster warm than base (CPU s)",
                 None if sp is None else f"{sp:.2f}x", verdict(sp, None if sp is None else sp >= 1.7)))
    cw = rp["this warm"]["cpu_s"] if "this warm" in rp else None
    rows.append(("python run.py warm <= 5 s CPU", None if cw is None else f"{cw:.2f} s",
                 verdict(cw, None if cw is None else cw <= 5.0)))
    rss = rp["this warm"]["rss_mib"] if "this warm" in rp else None
    rows.append(("peak RSS of the main job <= 250 MiB", None if rss is None else f"{rss:.0f} MiB",
                 verdict(rss, None if rss is None else rss <= 250)))
    pts = curve.get("this", [])
    per = lin = None
    if len(pts) >= 2:
        (n0, _, r0), (n1, _, r1) = pts[0][:3], pts[-1][:3]
        per = (r1 - r0) * 1.048576 / (n1 - n0)   # MiB -> MB
        mc = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:])]
        mm = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:])]
        lin = (max(mc[-1] / mc[-2] if mc[-2] > 0 else 1.0, mm[-1] / mm[-2] if mm[-2] > 0 else 1.0)
               if len(mc) >= 2 else None)
    at = f" at {pts[-1][0]} conversations" if pts else ""
    rows.append((f"<= 0.2 MB per conversation (marginal peak RSS){at}", None if per is None else f"{per:.3f} MB",
                 verdict(per, None if per is None else per <= 0.2)))
    rows.append(("cost linear in conversations (last / previous interval's marginal cost <= 1.5x)",
                 None if lin is None else f"{lin:.2f}x", verdict(lin, None if lin is None else lin <= 1.5)))
    note = "" if base == "fb9cdea" else f" (the issue states them against fb9cdea; the base here is {base or 'none'})"
    print(f"\n## Targets of issue 21{note}{' -- QUICK smoke run, not a measurement of the targets' if quick else ''}")
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for what, value, v in rows:
        print(f"| {what} | {value or '-'} | {v} |")
    return [{"target": w, "measured": v, "verdict": x} for w, v, x in rows]


if __name__ == "__main__":
    main()
