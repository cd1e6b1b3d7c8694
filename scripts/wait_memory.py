"""The WAIT paper's memory-bound cells (W6, W7) and Nested WAIT's safety buffer: runs where the KV cache binds.

    nice -n 10 python scripts/wait_memory.py --workload wait_long --rates 4,3 --seeds 0-4 --n 2000 \\
        --memory 0.99,0.4,0.6 --arms vllm,sarathi,wait_cp_long,wait --jobs 2 --out /tmp/h6-mem
    nice -n 10 python scripts/wait_memory.py --workload wait_two_types --rates 16,20 --seeds 0-4 --n 2000 \\
        --memory 0.99,0.4 --arms sarathi,nested,nested_reserve --jobs 2 --out /tmp/h6-buffer

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

Every run's row is appended to ``<out>/runs.csv`` as it finishes; a rerun with the same ``--out`` skips the rows
already there (keyed by workload, arm, memory, rate, seed, n). Then prints the cells
(``harness.analysis.results.wait_memory_cells``: per workload, memory and rate, each arm's E2E and restart rate
over the seeds, and the claims' words).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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
          "completion_rate_per_s", "wall_s"]


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
            "wall_s": round(time.perf_counter() - t0, 2)}


def _key(r) -> tuple:
    return (r["workload"], r["arm"], float(r["memory"]), float(r["rate"]), int(r["seed"]), int(r["n"]))


def main(argv=None) -> int:
    """The command line (module docstring). Exit status: 0 printed; 2 bad input (a flag out of range, an unknown
    arm, an --out that cannot be written); 130 interrupted (the runs finished so far stay in runs.csv)."""
    ap = cmdline.ArgumentParser(prog="scripts/wait_memory.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one error line naming the flag); 130 "
                                       "interrupted (the runs finished so far stay in runs.csv; rerun to resume).")
    ap.add_argument("--workload", default="wait_long", help="a workload of conf/workload (wait_long, wait_two_types)")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default="4", help="prompts/s (> 0)")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True, ranges=True, min_len=2), default="0-4",
                    help="'a-b' or comma-separated workload seeds (>= 0, at least 2)")
    ap.add_argument("--n", type=cmdline.number(8, integer=True), default=2000, help="prompts per run (>= 8)")
    ap.add_argument("--memory", type=cmdline.number_list(0, lo_open=True), default="0.99,0.4",
                    help="engine.gpu_memory_utilization values, in (0, 1] (0.99: the paper's 1 %% margin; 0.4: "
                         "Vidur memory_margin_fraction 0.6)")
    ap.add_argument("--arms", default="vllm,sarathi,wait_cp_long,wait", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--jobs", type=cmdline.number(1, integer=True), default=2, help="worker processes (>= 1)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: print what runs.csv holds")
    ap.add_argument("--out", type=cmdline.writable(directory=True), required=True, help="directory for runs.csv")
    a = ap.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ARMS for x in arms):
        ap.error(f"argument --arms: comma-separated names of {', '.join(ARMS)}, got {a.arms!r}")
    if any(m > 1 for m in a.memory):
        ap.error(f"argument --memory: values in (0, 1], got {a.memory}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    import pandas as pd

    from harness.analysis.results import wait_memory_lines
    done = {}
    if path.exists() and path.stat().st_size:
        for r in pd.read_csv(path).to_dict("records"):
            done[_key(r)] = r
    tasks = [(a.workload, arm, m, r, s, a.n) for m in a.memory for r in a.rates for arm in arms for s in a.seeds]
    todo = [t for t in tasks if _key(dict(zip(("workload", "arm", "memory", "rate", "seed", "n"), t))) not in done]
    pool = None
    t0 = time.perf_counter()
    try:
        if todo and not a.report_only:
            new = not path.exists() or path.stat().st_size == 0
            with open(path, "a", newline="") as f:
                w = csv.DictWriter(f, FIELDS)
                if new:
                    w.writeheader()
                pool = cmdline.quiet_pool(a.jobs) if a.jobs > 1 and len(todo) > 1 else None
                for row in (pool.imap_unordered(_one, todo) if pool else map(_one, todo)):
                    w.writerow(row)
                    f.flush()
                    done[_key(row)] = row
        rows = pd.DataFrame([done[k] for k in done if k[0] == a.workload])
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
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
