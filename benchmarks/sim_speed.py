"""Simulator speed on the full shipped SWE-bench trace (500 conversations, 20,163 turns).

Usage: ``python benchmarks/sim_speed.py [--schedulers conserve,collocated,...] [--rate 0.05] [--repeat 1]``

Pins itself to one CPU core (``os.sched_setaffinity``) and reports, per variant: simulation wall time
(the replay only; trace loading and the unloaded-TTFET baseline are reported separately), simulated
turns per wall-second, simulator events per wall-second, and the ratio to the target (500 conversations
in under 30 s of wall time on one core).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedulers", default="conserve,ampd,collocated,disaggregated,wait,nested_wait")
    ap.add_argument("--rate", type=float, default=0.05, help="conversations/s (the main job's default)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="do not pin to one core")
    args = ap.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    from hydra import compose, initialize_config_dir
    from harness.config import PROJECT_ROOT, register_configs, resolve
    from harness.session import simulate, unloaded_ttfet
    from harness.trace import load_trace
    from harness.workload import build_workload

    register_configs()
    print(f"{'scheduler':<14} {'wall_s':>8} {'turns/s':>10} {'events':>10} {'events/s':>10} {'target ratio':>13}")
    for name in args.schedulers.split(","):
        cluster = "a40_1p3d"
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"scheduler={name}", f"cluster={cluster}",
                                                           f"workload.rate_per_s={args.rate}"])
        run = resolve(cfg)
        t0 = time.perf_counter()
        records = load_trace(run.trace_path)
        convs, stats = build_workload(records, run.cfg.workload)
        load_s = time.perf_counter() - t0
        best = None
        for _ in range(args.repeat):
            res = simulate(run, convs, stats, name, run.scheduler)
            assert not res.error, res.error
            best = res if best is None or res.wall_s < best.wall_s else best
        turns = len(best.turns)
        print(f"{name:<14} {best.wall_s:8.2f} {turns / best.wall_s:10.0f} {best.events:10d} "
              f"{best.events / best.wall_s:10.0f} {TARGET_S / best.wall_s:12.1f}x")
    t0 = time.perf_counter()
    unloaded_ttfet(run, convs, stats)
    print(f"trace load + workload: {load_s:.2f} s; unloaded-TTFET baseline (500 solo replays): "
          f"{time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
