"""Every real step log replayed in sample, like for like, and the replay's own noise floor
(``python -m harness.tools.fidelity insample``; issue 49's deterministic acceptance, docs/fidelity_cpu.md
"In sample, every shipped log").

In sample: a run's step log (``logs/<instance>.step_times.jsonl[.gz]``, ``harness.tools.steps``) is fitted per step on
itself (:func:`harness.tools.steps.fit_steps`, objective ``sum`` by default: the summed step time preserved), the API
front end net of the in-flight residual (:func:`harness.tools.steps.api_frontend`), and the run's own workload is
replayed on the simulator with that profile (:func:`harness.tools.replay.simulate_run`). The figures, each
``sim / real - 1``:

- ``busy``: the summed busy time (the simulated steps' durations against the logged ``wall_s``, plus the logged
  between-step gaps <= ``harness.tools.steps.BUSY_GAP_S`` when the profile has a between-step term);
- ``steps``: the step count; ``batch``: the mean decode batch of the steps that decode;
- ``engine_ttft``, ``engine_e2e``, ``engine_itl``: the engine-clock request means, both sides counted from vLLM's
  ``queued_ts`` (:func:`harness.tools.replay.engine_request_rows`).

Bounds (issue 49): busy, steps and batch within 2 %, the engine means within 3 % (:data:`BOUNDS`).

The floor (:func:`replay_floor`): the simulator is deterministic, but a closed loop's batch formation is not smooth in
its inputs: a request that reaches the engine just after a step boundary instead of just before waits a whole step and
joins another batch. The floor is the range of each figure over replays whose only change is the API front end
moved by a small fraction of itself (:data:`FLOOR_DELTAS_S`: -0.5 to +1 ms, against fitted front ends of 4-47 ms whose
standard errors are of that size); a bound under the floor cannot be checked on that log.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from harness.core.profiles import HardwareConfig, ModelConfig
from harness.tools import steps as st
from harness.tools.inputs import load_profile, load_run_config

BOUNDS = {"busy": 0.02, "steps": 0.02, "batch": 0.02, "engine_ttft": 0.03, "engine_e2e": 0.03, "engine_itl": 0.03}
FLOOR_DELTAS_S = (-5e-4, -1e-4, 1e-4, 5e-4, 1e-3)
ENGINE_KEYS = {"engine_ttft": "engine_ttft_mean_s", "engine_e2e": "engine_e2e_mean_s", "engine_itl": "engine_itl_mean_s"}


def busy_figures(steps: pd.DataFrame, hw: HardwareConfig, sim_dir: Path) -> dict:
    """``sim / real - 1`` of the summed busy time, the step count and the mean decode batch (module docstring) of a
    simulated replay (``sim_dir/steps.parquet``) against the logged ``steps`` (:func:`harness.tools.steps.load_step_times`).
    Returns ``{"busy", "steps", "batch"}`` (fractions)."""
    s = pd.read_parquet(Path(sim_dir) / "steps.parquet")
    gap = steps.idle_s.to_numpy(float)
    real_busy = steps.wall_s.sum() + (np.nansum(np.where((gap >= 0) & (gap <= st.BUSY_GAP_S), gap, 0.0))
                                      if hw.between_step_s else 0.0)
    return {"busy": float(s.duration_s.sum() / real_busy - 1), "steps": float(len(s) / len(steps) - 1),
            "batch": float(s.decode_tokens[s.decode_tokens > 0].mean()
                           / steps.decode_seqs[steps.decode_seqs > 0].mean() - 1)}


def fit_in_sample(run_dir: Path, base: str = "cpu", objective: str = "sum", busy_timeline: bool = False,
                  skip_steps: int = 8) -> tuple[pd.DataFrame, dict, dict, HardwareConfig]:
    """The per-step fit of a run's own step log and its front end: ``(steps, fit, frontend, profile)``
    (:func:`harness.tools.steps.fit_steps` with ``objective`` and ``busy_timeline``, on ``base``'s unfitted fields;
    :func:`harness.tools.steps.api_frontend`; the profile carries ``api_frontend_s``).

    Raises:
        FileNotFoundError: no step log or no ``config.yaml`` in ``run_dir``. ValueError: the log cannot be fitted.
    """
    steps, _ = st.load_step_times(Path(run_dir), skip_steps=skip_steps)
    model = ModelConfig(**load_run_config(Path(run_dir))["model"])
    fit = st.fit_steps(steps, load_profile(base), model, objective=objective, busy_timeline=busy_timeline)
    fe = st.api_frontend(Path(run_dir), steps)
    return steps, fit, fe, st.with_frontend(fit["hw"], fe)


def replay_figures(run_dir: Path, steps: pd.DataFrame, hw: HardwareConfig, out_dir: Path) -> dict:
    """Replay ``run_dir``'s workload with ``hw`` into ``out_dir`` and return every figure of the module docstring
    (fractions, ``sim / real - 1``) and ``requests`` (the engine requests compared)."""
    from harness.tools.replay import engine_request_rows, simulate_run
    sim = simulate_run(Path(run_dir), hw, Path(out_dir))
    out = busy_figures(steps, hw, sim)
    rows = engine_request_rows(Path(run_dir), sim)
    for k, m in ENGINE_KEYS.items():
        out[k] = float(rows[m]["sim"] / rows[m]["real"] - 1) if m in rows else float("nan")
    out["requests"] = int(rows["engine_requests"]["real"]) if rows else 0
    return out


def in_sample(run_dir: Path, out_dir: Path, base: str = "cpu", objective: str = "sum",
              busy_timeline: bool = False) -> dict:
    """The in-sample replay of one run (module docstring): ``{"figures": {...}, "hw": profile, "fit": ...}``."""
    steps, fit, fe, hw = fit_in_sample(run_dir, base, objective, busy_timeline)
    return {"figures": replay_figures(run_dir, steps, hw, out_dir), "hw": hw, "fit": fit, "frontend": fe,
            "steps": steps}


def replay_floor(run_dir: Path, out_dir: Path, steps: pd.DataFrame, hw: HardwareConfig,
                 deltas_s: Sequence[float] = FLOOR_DELTAS_S) -> dict:
    """The replay's noise floor (module docstring): for each figure, ``max - min`` over the replay with ``hw`` and
    the replays with ``api_frontend_s`` moved by each of ``deltas_s`` (s). Returns ``{figure: range}`` (fractions)
    and ``"runs"`` (each replay's figures)."""
    runs = [replay_figures(run_dir, steps, hw, Path(out_dir) / "floor_0")]
    for i, d in enumerate(deltas_s, 1):
        h = dataclasses.replace(hw, api_frontend_s=max(0.0, hw.api_frontend_s + d))
        runs.append(replay_figures(run_dir, steps, h, Path(out_dir) / f"floor_{i}"))
    out = {k: float(max(r[k] for r in runs) - min(r[k] for r in runs)) for k in BOUNDS}
    out["runs"] = runs
    return out


def shipped_step_logs(root: Optional[Path] = None) -> list[Path]:
    """Every shipped real run under ``docs/data`` with a collocated step log (one instance, ``logs/*.step_times.jsonl``
    or ``.gz``), sorted; P/D runs (two instances) are the connector tool's (``harness.tools.connector``)."""
    from harness.run.config import PROJECT_ROOT
    root = Path(root) if root is not None else PROJECT_ROOT / "docs" / "data"
    runs = set()
    for p in root.rglob("*.step_times.jsonl*"):
        run = p.parent.parent
        if p.parent.name == "logs" and (run / "config.yaml").is_file() and (run / "turns.parquet").is_file():
            runs.add(run)
    return sorted(r for r in runs if len(list((r / "logs").glob("*.step_times.jsonl*"))) == 1)


def verdicts(figures: dict, floor: Optional[dict] = None) -> dict:
    """Per figure: ``"within"`` (``|err| <= bound``), ``"under the floor"`` (missed, but the replay's own floor is
    at least the bound: not checkable on this log) or ``"missed"``."""
    out = {}
    for k, b in BOUNDS.items():
        e = figures.get(k, float("nan"))
        if abs(e) <= b:
            out[k] = "within"
        elif floor is not None and floor.get(k, 0.0) >= b:
            out[k] = "under the floor"
        else:
            out[k] = "missed"
    return out


def markdown(rows: Iterable[dict]) -> str:
    """The table ``insample`` prints: one row per run, each figure's error (and floor, where measured) and verdict."""
    keys = list(BOUNDS)
    head = "| run | slow-period figure | " + " | ".join(f"{k} (bound {BOUNDS[k]:.0%})" for k in keys) + " |"
    lines = [head, "|" + "---|" * (len(keys) + 2)]
    for r in rows:
        cells = []
        for k in keys:
            e = r["figures"][k]
            fl = f", floor {r['floor'][k]:.1%}" if r.get("floor") else ""
            cells.append(f"{e:+.1%}{fl}: {r['verdicts'][k]}")
        lines.append(f"| {r['run']} | {r['slow_periods']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def insample_main(argv: Sequence[str]) -> int:
    """``python -m harness.tools.fidelity insample [RUN ...] [--floor] [--objective O] [--busy-timeline]``: every
    shipped collocated step log by default. Exit 0 when every figure is within its bound or under the floor, 1 when
    one is missed, 2 on bad input."""
    import sys
    import tempfile

    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.fidelity insample",
                                description="Replay real step logs in sample, like for like (harness.tools.insample).",
                                epilog="Exit status: 0 every figure within its bound (or under the replay's floor "
                                       "with --floor), 1 one missed, 2 bad input, 130 interrupted.")
    ap.add_argument("runs", nargs="*", type=Path, help="real run directories with one step log (default: every shipped "
                                                       "collocated one under docs/data)")
    ap.add_argument("--base", default="cpu", help="base hardware profile (its unfitted fields kept; default cpu)")
    ap.add_argument("--objective", default="sum", choices=("sum", "relative", "absolute"))
    ap.add_argument("--busy-timeline", action="store_true", help="fit the between-step and after-idle terms too")
    ap.add_argument("--floor", action="store_true", help="also measure each run's replay floor (6 replays per run)")
    a = ap.parse_args(argv)
    runs = a.runs or shipped_step_logs()
    for r in runs:
        if not (r / "config.yaml").is_file():
            print(f"error: {r}: no config.yaml (not a run directory)", file=sys.stderr)
            return 2
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="insample-") as tmp:
            for i, run in enumerate(runs):
                res = in_sample(run, Path(tmp) / f"{i}", a.base, a.objective, a.busy_timeline)
                model = ModelConfig(**load_run_config(run)["model"])
                spf = st.slow_period_figure(res["steps"], load_profile(a.base), model)["figure"]
                floor = replay_floor(run, Path(tmp) / f"{i}f", res["steps"], res["hw"]) if a.floor else None
                rows.append({"run": str(run), "figures": res["figures"], "floor": floor, "slow_periods": spf,
                             "verdicts": verdicts(res["figures"], floor)})
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows))
    return 0 if all(v != "missed" for r in rows for v in r["verdicts"].values()) else 1
