"""Quick check of the wait_paper arms on the simulator: latency, evictions, peak KV, WAIT's reservation.

    python scripts/wait_check.py --workload wait_single --rates 4,12,16 --n 1000 --seed 0

For every arm of ``conf/experiment/wait_paper.yaml`` (plus plain ``collocated`` with the engine
defaults of the preset, the reference WAIT used to be identical to) and every rate, one simulation; prints
a markdown table: mean and p50 end-to-end latency over the central window (prompts 25 %..75 % by arrival,
the same window for every arm), TTFT p50, evictions (preemptions) per prompt, the peak KV held (tokens,
at a step's start), the WAIT plan's ``M^pi`` reservation (tokens), mean paused residents per step, and
whether the per-request timelines equal ``collocated``'s. Single-process, no parquet written.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness.run.session as session  # noqa: E402
import harness.sim.backend as sim_backend  # noqa: E402
from harness.workload.workload import build_workload  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from harness.core import cmdline  # noqa: E402
from harness.run.config import resolve  # noqa: E402
from tests.conftest import compose_cfg  # noqa: E402

_CFG_CACHE: dict = {}


def compose_point(ov: list[str], rate: float, n: int, seed: int):
    """``compose_run`` of ``ov`` plus the workload's rate, prompt count and seed; the Hydra composition of
    ``ov`` (about 1 s, most of a short run) is made once per override list and copied, the three workload
    keys set on the copy before it is resolved (what the same three command-line overrides give)."""
    key = tuple(ov)
    if key not in _CFG_CACHE:
        _CFG_CACHE[key] = compose_cfg(ov)
    cfg = copy.deepcopy(_CFG_CACHE[key])
    OmegaConf.update(cfg, "workload.rate_per_s", rate)
    OmegaConf.update(cfg, "workload.num_conversations", n)
    OmegaConf.update(cfg, "workload.seed", seed)
    return resolve(cfg)


ARMS = ["collocated", "wait_vllm", "wait_sarathi", "wait_wait", "wait_nested", "wait_cp", "wait_cp_control"]


def run_arm(arm: str, workload: str, rate: float, n: int, seed: int, extra: list[str]):
    ov = ["+experiment=wait_paper", f"workload={workload}", *extra]
    arm, *arm_ov = arm.split("@")         # e.g. wait_wait@scheduler.idle_policy=decode_residents
    if arm == "collocated":
        # the preset sets no scheduler (without this it is the default, conserve) and no
        # engine.gpu_memory_utilization / max_num_seqs (each arm takes them from conf/experiment/wait_engine/)
        ov += ["scheduler=collocated", "+experiment/wait_engine=vidur"]
    else:
        ov.append(f"+experiment/arm={arm}")
    ov += arm_ov
    run = compose_point(ov, rate, n, seed)
    convs, stats = build_workload([], run.cfg.workload)
    backends = []
    orig = sim_backend.SimBackend

    def capture(*a, **k):
        b = orig(*a, **k)
        backends.append(b)
        return b

    sim_backend.SimBackend = capture        # open_sim builds the cluster from this module's class
    try:
        t0 = time.perf_counter()
        res = session.simulate(session.session_input(run), convs, stats, run.scheduler_name, run.scheduler, log_decisions=True)
        wall = time.perf_counter() - t0
    finally:
        sim_backend.SimBackend = orig
    eng = backends[-1].engines[0]
    turns = pd.DataFrame(res.turns).sort_values("submit_s")
    return run, res, eng, turns, wall


def reservation_tokens(run, rule, bs: int) -> str:
    """The rule's KV reservation rounded to blocks, tokens: WAIT ``sum_j n_j sum_s ceil((l_j+s)/bs) bs``
    over the workload's prompt types (stages s = 0 .. output - 1); Nested WAIT
    ``sum_s cap_s ceil((l_max+s)/bs) bs`` over the stages up to the last boundary. '-' for other rules."""
    types = run.cfg.workload.prompt_types
    blk = lambda t: -(-t // bs) * bs  # noqa: E731
    if hasattr(rule, "classify") and hasattr(rule, "n"):
        edges = np.asarray(run.scheduler.output_bins)
        tot = 0
        for t in types:
            n = rule.n[int(np.searchsorted(edges, t.output_tokens, side="left"))]
            tot += sum(n * blk(t.input_tokens + s) for s in range(t.output_tokens))
        return str(tot)
    if hasattr(rule, "bounds"):
        lmax = max(t.input_tokens for t in types)
        k_out = max(t.output_tokens for t in types)
        return str(sum(rule.cap(rule.segment(s), s) * blk(lmax + s) for s in range(k_out)))
    return "-"


def central(df: pd.DataFrame) -> pd.DataFrame:
    k = len(df)
    return df.iloc[k // 4: 3 * k // 4]


def main(argv=None) -> int:
    ap = cmdline.ArgumentParser(prog="scripts/wait_check.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one line naming the flag, or the config "
                                       "key run.py would refuse); 130 interrupted.")
    ap.add_argument("--workload", default="wait_single")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default="4,12,16",
                    help="prompts/s (> 0), comma-separated")
    ap.add_argument("--n", type=cmdline.number(1, integer=True), default=1000, help="prompts per run (>= 1)")
    ap.add_argument("--seed", type=cmdline.number(0, integer=True), default=0, help="workload seed (>= 0)")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help="comma-separated arms; arm@key=value adds overrides to one arm")
    ap.add_argument("--extra", default="", help="extra overrides, ';'-separated")
    a = ap.parse_args(argv)
    from hydra.errors import HydraException

    from harness.core.trace import TraceError
    from harness.run.config import ConfigError
    try:
        extra = [x for x in a.extra.split(";") if x]
        print(f"workload={a.workload} n={a.n} seed={a.seed} {' '.join(extra)}")
        print("| arm | rate | E2E mean (s) | E2E p50 (s) | TTFT p50 (s) | evictions/prompt | peak KV (tok) | reservation (tok) "
              "| paused/step | same as collocated | wall (s) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for rate in a.rates:
            ref = None
            for arm in a.arms.split(","):
                run, res, eng, turns, wall = run_arm(arm, a.workload, rate, a.n, a.seed, extra)
                if res.error:
                    print(f"| {arm} | {rate:g} | error: {res.error} |")
                    continue
                turns = turns.reset_index(drop=True)
                e2e = turns["finish_s"] - turns["submit_s"]
                ttft = turns["first_token_s"] - turns["submit_s"]
                c = central(pd.DataFrame({"e2e": e2e, "ttft": ttft}))
                key = turns[["conversation_id", "first_token_s", "finish_s"]].sort_values("conversation_id")
                key = key.reset_index(drop=True)
                if arm == "collocated":
                    ref = key
                    same = "-"
                else:
                    same = "yes" if ref is not None and key.equals(ref) else "no"
                plan = res.extra.get("policy_plan", "")
                mpi = reservation_tokens(run, eng.rule, eng.bs)
                steps = max(eng.steps, 1)
                print(f"| {arm} | {rate:g} | {c.e2e.mean():.3f} | {c.e2e.median():.3f} | {c.ttft.median():.3f} "
                      f"| {res.preemptions / len(turns):.4f} | {eng.peak_used_blocks * eng.bs} | {mpi} "
                      f"| {eng.paused_steps / steps:.2f} | {same} | {wall:.1f} |", flush=True)
                if plan:
                    print(f"|  plan: {plan} |", flush=True)
    except (ConfigError, TraceError, HydraException) as e:   # an arm, --workload or --extra run.py would refuse
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
