"""The WAIT paper's memory-bound cells (W6, W7) and Nested WAIT's safety buffer: runs where the KV cache binds.

    nice -n 10 python scripts/wait_memory.py --workload wait_long --rates 4,3 --seeds 0-4 --n 2000 \\
        --memory 0.99,0.4,0.6 --arms vllm,sarathi,wait_cp_long,wait --jobs 2 --out /tmp/h6-mem
    nice -n 10 python scripts/wait_memory.py --workload wait_two_types --rates 16,20 --seeds 0-4 --n 2000 \\
        --memory 0.99,0.4 --arms sarathi,nested,nested_reserve --jobs 2 --out /tmp/h6-buffer
    nice -n 10 python scripts/wait_memory.py --workload wait_long --memory 0.99 --capacity 1.5,2.5 --cap-tol 0.125 \\
        --cap-seeds 0-4 --cap-arms sarathi,wait_cp_long --fractions 0.8,0.95 --seeds 0-9 --arms vllm,sarathi,wait_cp_long \\
        --jobs 1 --out /tmp/s4h5-w6cap

The paper's own setup (numerical.tex, "Hardware"; docs/wait.md): one A100 80 GB serving Llama-2-7B, 0.5 MiB of
KV per token, and "after model weights and the baseline 1 % memory margin ... a KV-cache cap of approximately
1.37e5 tokens": ``engine.gpu_memory_utilization`` 0.99 gives ``floor((80 GiB x 0.99 - 13,476,298,752 B) / (0.5 MiB
x 16)) = 8,531`` blocks of 16 = 136,496 tokens (``harness.core.profiles.kv_capacity_blocks``;
``tests/test_wait_memory.py`` by hand). The memory-bound claims:

* W6 (numerical.tex, Table "Eviction diagnostic for p512d1000 at lambda = 4.0"; the authors'
  ``scripts/long_decode_memory_diagnostic.py``): 512/1000 at 4.0 prompts/s with the baseline memory: Sarathi's
  eviction-induced restart rate 2.88 %, WAIT's 0 %; mean E2E 30.2 s (Sarathi) vs 26.4 s (WAIT).
* W7 (the authors' Figure F, ``scripts/plot_figure_F_memory.py``: "the KV-cache pool intentionally constrained to
  a margin of 0.6", lambda = 4.0, 10,000 requests): WAIT (tl 120) 31.3 s and 0 restarts, vLLM 53.0 s and 0,
  Sarathi 78.1 s and 3,222 restarts. Vidur's memory planner keeps ``total x (1 - margin)`` (``vidur/scheduler/
  utils/memory_planner.py``), so margin 0.6 is ``--memory 0.4`` (2,489 blocks = 39,824 tokens); the script's
  docstring also says "60 % of the block pool", ``--memory 0.6`` (4,537 blocks = 72,592 tokens): both are run.

Arms (``--arms``, names of :data:`ARMS`; each a ``wait_paper`` arm with overrides): ``vllm`` (vLLM-like),
``sarathi`` (Sarathi-like with the diagnostic's ``batch_size_cap`` 512), ``wait_cp_long`` (the diagnostic's
"WAIT": WAIT-CP tl 120, cs 128, gate off; the arm ``wait_cp_memory``), ``wait`` (Algorithm 1, tl 20), ``nested``
(Algorithm 2, tl 30) and ``nested_reserve`` (the same with ``scheduler.safety_buffer=reserve``, the paper's memory safety buffer held
free at admission; ``baselines/wait/nested_wait.py``). Per run: mean E2E over the central window (prompts 25-75 %
by arrival), its eviction-induced restarts (the sum of the window's prompts' preemptions) and restart rate
(% of the window's prompts: the diagnostic's ``restart_rate_pct``), the preemptions of the whole run, the peak KV
held and the KV capacity (tokens), the effective completion rate (prompts / (last finish - first arrival)).

**Capacity** (``--capacity lo,hi``): this simulator's own capacity in the setting, with the WAIT table's estimator
(``harness.analysis.capacity.seed_capacities``; docs/wait.md, "Capacity with its uncertainty"): per memory setting,
arm of ``--cap-arms`` and seed of ``--cap-seeds``, one bisection on the rate over ``[lo, hi]`` prompts/s to
``--cap-tol``, a seed's rate bounded when its run's window growth ratio (the E2E of the central window's last
quarter over its first, arrival order: ``harness.analysis.capacity.growth_ratio``) is at most 1.25; each seed's
capacity its bracket's midpoint, printed as mean [95 % t-interval] (min-max, n) with the WAIT-CP / Sarathi-like
margin paired on the seed. The probes' rows go to ``<out>/capacity.csv`` (the columns of ``runs.csv``), apart from
the claims' cells. ``--fractions f1,f2``: the cells are also run at ``f x`` the first ``--cap-arms`` arm's mean
capacity (rounded to 0.01 prompts/s) at the first ``--memory`` setting, so the W6 cells sit at stated fractions of
located capacity (the paper's 4 prompts/s is past this simulator's ~2 prompts/s there).

Every run's row is appended to ``<out>/runs.csv`` as it finishes; a rerun with the same ``--out`` skips the rows
already there (keyed by workload, arm, memory, rate, seed, n; a file written before the ``growth_ratio`` column is
rewritten with it, empty). Then prints the cells
(``harness.analysis.results.wait_memory_cells``: per workload, memory and rate, each arm's E2E and restart rate
over the seeds, and the claims' words).
"""

from __future__ import annotations

import csv
import math
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.analysis.capacity import (GROWTH_BOUND, capacity_margin, capacity_summary, capacity_text,  # noqa: E402
                                       growth_ratio, seed_capacities)
from harness.core import cmdline  # noqa: E402

# name -> the wait_paper arm and its overrides (scripts/wait_check.py's "arm@key=value" form)
ARMS = {
    "vllm": "wait_vllm",
    "sarathi": "wait_sarathi@engine.max_num_seqs=512",
    "wait_cp_long": "wait_cp_memory",
    "wait": "wait_wait",
    "nested": "wait_nested",
    "nested_reserve": "wait_nested@scheduler.safety_buffer=reserve",
}
FIELDS = ["workload", "arm", "memory", "kv_capacity_tokens", "rate", "seed", "n", "e2e_central_mean_s", "e2e_mean_s",
          "window_prompts", "restarts_window", "restart_rate_pct", "preemptions", "peak_kv_tokens",
          "completion_rate_per_s", "growth_ratio", "wall_s"]


def _one(task) -> dict:
    workload, arm, memory, rate, seed, n = task
    from wait_check import run_arm
    t0 = time.perf_counter()
    run, res, eng, turns, _ = run_arm(f"{ARMS[arm]}@engine.gpu_memory_utilization={memory}", workload, rate, n, seed,
                                      [])
    if res.error:
        raise RuntimeError(f"{workload} {arm} memory {memory} rate {rate} seed {seed}: {res.error}")
    turns = turns.reset_index(drop=True)
    e2e = (turns["finish_s"] - turns["submit_s"]).to_numpy(dtype=float)
    k = len(turns)
    win = turns.iloc[k // 4: 3 * k // 4]
    restarts = int(win["preemptions"].sum())
    span = float(turns["finish_s"].max() - turns["submit_s"].min())
    return {"workload": workload, "arm": arm, "memory": memory, "kv_capacity_tokens": eng.capacity_blocks * eng.bs,
            "rate": rate, "seed": seed, "n": n, "e2e_central_mean_s": float(e2e[k // 4: 3 * k // 4].mean()),
            "e2e_mean_s": float(e2e.mean()), "window_prompts": len(win), "restarts_window": restarts,
            "restart_rate_pct": 100.0 * restarts / max(1, len(win)), "preemptions": int(res.preemptions),
            "peak_kv_tokens": eng.peak_used_blocks * eng.bs, "completion_rate_per_s": k / span if span > 0 else 0.0,
            "growth_ratio": growth_ratio(e2e), "wall_s": round(time.perf_counter() - t0, 2)}


def _key(r) -> tuple:
    return (r["workload"], r["arm"], float(r["memory"]), float(r["rate"]), int(r["seed"]), int(r["n"]))


class _Rows:
    """The rows of one csv of this script (``runs.csv`` or ``capacity.csv``), keyed by :func:`_key`, and its
    writer: each new row appended and flushed as its run finishes. A file with another header (written before the
    ``growth_ratio`` column) is rewritten with :data:`FIELDS` first (its rows kept, the new column empty)."""

    def __init__(self, path: Path):
        import pandas as pd
        self.path, self.done, self.f, self.w = path, {}, None, None
        if path.exists() and path.stat().st_size:
            old = pd.read_csv(path)
            for r in old.to_dict("records"):
                self.done[_key(r)] = r
            if list(old.columns) != FIELDS:
                tmp = path.with_name(f".{path.name}.tmp")
                old.reindex(columns=FIELDS).to_csv(tmp, index=False)
                tmp.replace(path)

    def add(self, row: dict) -> dict:
        if self.w is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self.f = open(self.path, "a", newline="")
            self.w = csv.DictWriter(self.f, FIELDS)
            if new:
                self.w.writeheader()
        self.w.writerow(row)
        self.f.flush()
        self.done[_key(row)] = row
        return row

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def capacities(store: _Rows, workload: str, memory: float, arms: list[str], seeds: list[int], lo: float, hi: float,
               tol: float, n: int, pool=None, workers: int = 1,
               run: bool = True) -> dict[str, dict[int, tuple[float, float]]]:
    """Each arm's capacity per seed (prompts/s brackets ``[low, high)``, :func:`harness.analysis.capacity
    .seed_capacities`) at one memory setting: a probe is one run (:func:`_one`) kept in ``store``; its rate is bounded
    when its window growth ratio is at most :data:`harness.analysis.capacity.GROWTH_BOUND`. The bisections of
    different (arm, seed) run side by side on ``pool`` (``workers`` threads feeding it), one at a time without.
    ``run=False``: only the probes already in ``store`` (a bisection that needs another is left out).

    Raises:
        RuntimeError: a run failed (:func:`_one`).
    """
    from concurrent.futures import ThreadPoolExecutor
    lock = threading.Lock()

    def search(arm, seed):
        def bounded_at(rate, s):
            task = (workload, arm, memory, rate, s, n)
            k = _key(dict(zip(("workload", "arm", "memory", "rate", "seed", "n"), task)))
            row = store.done.get(k)
            if row is None or not math.isfinite(float(row.get("growth_ratio", math.nan))):
                if not run:
                    raise LookupError(k)
                row = pool.apply(_one, (task,)) if pool else _one(task)
                with lock:
                    store.add(row)
            return float(row["growth_ratio"]) <= GROWTH_BOUND
        try:
            return seed_capacities(bounded_at, [seed], lo, hi, tol)[seed]
        except LookupError:
            return None
    jobs = [(arm, s) for arm in arms for s in seeds]
    with ThreadPoolExecutor(max_workers=workers if pool else 1) as ex:
        found = dict(zip(jobs, ex.map(lambda j: search(*j), jobs)))
    return {arm: {s: found[(arm, s)] for s in seeds if found[(arm, s)] is not None} for arm in arms}


def capacity_lines(caps: dict[str, dict[int, tuple[float, float]]]) -> list[str]:
    """``capacities``' result as markdown: per arm the per-seed brackets and the capacity (mean [95 % t-interval]
    (min-max, n), :func:`harness.analysis.capacity.capacity_text`), and WAIT-CP (tl 120) / Sarathi-like - 1 paired
    on the seed when both were run (no paper value: the paper states no capacity in this setting)."""
    lines = ["| arm | capacity (prompts/s) | per seed [low, high) |", "|---|---|---|"]
    for arm, b in caps.items():
        if b:
            lines.append(f"| {arm} | {capacity_text(capacity_summary(b))} | "
                         + ", ".join(f"{s}: [{lo:g}, {hi:g})" for s, (lo, hi) in sorted(b.items())) + " |")
    if all(capacity_summary(caps.get(a, {}))["n"] >= 2 for a in ("sarathi", "wait_cp_long")):
        est, ci, n, k, _ = capacity_margin(caps["wait_cp_long"], caps["sarathi"], 0.0)
        lines += ["", f"WAIT-CP / Sarathi-like capacity − 1: {est:+.1f} % [{ci[0]:+.1f}, {ci[1]:+.1f}] (n={n}, "
                      f"{k} of {n} {'<' if est < 0 else '>'} 0)"]
    return lines


def main(argv=None) -> int:
    """The command line (module docstring). Exit status: 0 printed; 2 bad input (a flag out of range, an unknown
    arm, an --out that cannot be written); 130 interrupted (the runs finished so far stay in runs.csv)."""
    ap = cmdline.ArgumentParser(prog="scripts/wait_memory.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one error line naming the flag); 130 "
                                       "interrupted (the runs finished so far stay in runs.csv; rerun to resume).")
    ap.add_argument("--workload", default="wait_long", help="a workload of conf/workload (wait_long, wait_two_types)")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default=None,
                    help="prompts/s (> 0); default 4 without --fractions, none with it")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True, ranges=True, min_len=2), default="0-4",
                    help="'a-b' or comma-separated workload seeds (>= 0, at least 2)")
    ap.add_argument("--n", type=cmdline.number(8, integer=True), default=2000, help="prompts per run (>= 8)")
    ap.add_argument("--memory", type=cmdline.number_list(0, lo_open=True), default="0.99,0.4",
                    help="engine.gpu_memory_utilization values, in (0, 1] (0.99: the paper's 1 %% margin; 0.4: "
                         "Vidur memory_margin_fraction 0.6)")
    ap.add_argument("--arms", default="vllm,sarathi,wait_cp_long,wait", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--jobs", type=cmdline.number(1, integer=True), default=2, help="worker processes (>= 1)")
    ap.add_argument("--capacity", type=cmdline.number_list(0, lo_open=True, min_len=2, max_len=2), default=None,
                    help="lo,hi: locate each --cap-arms arm's capacity per seed by bisection on [lo, hi] prompts/s "
                         "(0 < lo < hi) at each --memory; probes in capacity.csv")
    ap.add_argument("--cap-tol", type=cmdline.number(0, lo_open=True), default=0.125,
                    help="bisection stops at this bracket width (prompts/s, > 0)")
    ap.add_argument("--cap-seeds", type=cmdline.number_list(0, integer=True, ranges=True, min_len=2), default="0-4",
                    help="seeds of the capacity bisections (at least 2)")
    ap.add_argument("--cap-arms", default="sarathi,wait_cp_long",
                    help="arms of the capacity bisections (the first: the base of --fractions)")
    ap.add_argument("--fractions", type=cmdline.number_list(0, lo_open=True), default=None,
                    help="with --capacity: also run the cells at these fractions (> 0) of the first --cap-arms arm's "
                         "mean capacity at the first --memory (rounded to 0.01 prompts/s)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: print what runs.csv holds")
    ap.add_argument("--out", type=cmdline.writable(directory=True), required=True, help="directory for runs.csv")
    a = ap.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ARMS for x in arms):
        ap.error(f"argument --arms: comma-separated names of {', '.join(ARMS)}, got {a.arms!r}")
    if any(m > 1 for m in a.memory):
        ap.error(f"argument --memory: values in (0, 1], got {a.memory}")
    cap_arms = [x for x in a.cap_arms.split(",") if x]
    if not cap_arms or any(x not in ARMS for x in cap_arms):
        ap.error(f"argument --cap-arms: comma-separated names of {', '.join(ARMS)}, got {a.cap_arms!r}")
    if a.capacity and not a.capacity[0] < a.capacity[1]:
        ap.error(f"argument --capacity: lo < hi needed, got {a.capacity[0]:g},{a.capacity[1]:g}")
    if a.fractions and not a.capacity:
        ap.error("argument --fractions: needs --capacity (the capacity it is a fraction of)")
    rates = a.rates if a.rates is not None else ([] if a.fractions else [4.0])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    import pandas as pd

    from harness.analysis.results import wait_memory_lines
    store, cap_store = _Rows(path), _Rows(out / "capacity.csv")
    pool = None
    t0 = time.perf_counter()
    try:
        pool = cmdline.quiet_pool(a.jobs) if a.jobs > 1 and not a.report_only else None
        if a.capacity:
            lo, hi = a.capacity
            print(f"Capacity, per seed: the highest rate whose central window stays bounded (that seed's window "
                  f"growth ratio <= {GROWTH_BOUND}), one bisection per seed of {','.join(map(str, a.cap_seeds))} on "
                  f"[{lo:g}, {hi:g}] prompts/s to {a.cap_tol:g}, n={a.n}; each seed's capacity its bracket's "
                  "midpoint\n")
            for i, m in enumerate(a.memory):
                caps = capacities(cap_store, a.workload, m, cap_arms, a.cap_seeds, lo, hi, a.cap_tol, a.n, pool,
                                  a.jobs, run=not a.report_only)
                print(f"memory {m:g}:\n")
                print("\n".join(capacity_lines(caps)) + "\n", flush=True)
                base = caps.get(cap_arms[0], {})
                if i == 0 and a.fractions:
                    if capacity_summary(base)["n"] < 2:
                        raise RuntimeError(f"--fractions: {cap_arms[0]}'s capacity is not located at memory {m:g}")
                    c = capacity_summary(base)["mean"]
                    extra = [round(f * c, 2) for f in a.fractions]
                    print(f"--fractions {','.join(f'{f:g}' for f in a.fractions)} of {cap_arms[0]}'s {c:.3f} "
                          f"prompts/s: rates {','.join(f'{r:g}' for r in extra)}\n")
                    rates = rates + [r for r in extra if r not in rates]
        tasks = [(a.workload, arm, m, r, s, a.n) for m in a.memory for r in rates for arm in arms for s in a.seeds]
        todo = [t for t in tasks
                if _key(dict(zip(("workload", "arm", "memory", "rate", "seed", "n"), t))) not in store.done]
        if todo and not a.report_only:
            for row in (pool.imap_unordered(_one, todo) if pool else map(_one, todo)):
                store.add(row)
        rows = pd.DataFrame([store.done[k] for k in store.done if k[0] == a.workload])
        print(f"{a.workload}, Llama-2-7B on one A100 80 GB, n={a.n} prompts per run, "
              f"seeds {','.join(map(str, a.seeds))} "
              f"({len(todo) if not a.report_only else 0} runs now, {time.perf_counter() - t0:.0f} s wall)\n")
        print("\n".join(wait_memory_lines(rows)))
    except KeyboardInterrupt as e:
        if pool:
            pool.terminate()
        print(f"interrupted ({str(e) or 'Ctrl-C'}); the runs finished so far are in {path}", file=sys.stderr)
        return cmdline.INTERRUPTED
    finally:
        if pool:
            pool.close()
            pool.join()
        store.close()
        cap_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
