"""Simulator fidelity against a real run (``python -m harness.tools.fidelity``).

Replays a real run's workload (the same conversations, arrivals and seed: the run's own ``config.yaml``
with ``backend=sim`` and the hardware profile under test) on the simulator and compares the two runs
metric by metric: mean and p50/p90/p99 of TTFT, TPOT, ITL, E2E and TTFET; request and output-token
throughput; the KV-usage time series; preemptions; energy where the real run measured it; and the
engine-side (``/metrics``) means where the real run wrote ``server_metrics.json``. The error of a metric
is ``sim / real - 1``; every row names the origin its times count from on each side (``origin``): the engine rows
from vLLM's ``queued_ts`` on both sides (the simulator's ``engine_queued_s``: one clock). The verdict checks the
fidelity targets (``TARGETS``): mean E2E and mean TPOT within 10 %, mean TTFT within 20 % (anchors from the literature: BLIS
6.7 % median E2E and 17.6 % TTFT error; Vidur < 9 % (arXiv 2405.05465); LLMServingSim 2.2 % E2E).

Writes ``fidelity.json`` and ``fidelity.md`` into ``--out`` (default: ``<real run>/fidelity``), and the
simulated run into ``<out>/sim``. ``--launch`` first runs the real side itself (Hydra overrides for a
``backend=vllm`` run; ``logger.steps=true`` is added). Exit status: 0 when every target is met on the
client's clocks, 1 when one is missed, 2 on bad arguments (a missing run directory or profile, an invalid
profile, bad ``--launch`` overrides, a simulator run or a partial run as the real side without
``--allow-sim-real`` / ``--allow-partial``), 3 when the ``--launch`` run failed, 130 when interrupted.

A P/D run (its turns disaggregated, with both servers' spans) also gets the per-leg table
(``harness.tools.connector.legs``: prefiller front end, queue, prefill + save, handoff to the first token, decode, each on
one clock per side); ``--link`` replays it with a cluster preset's link (e.g. the fitted ExampleConnector profile,
``python -m harness.tools.connector``) and ``--role-profile ROLE=PROFILE`` gives an instance role its own profile (a
pair at its measured speeds). Its engine rows are mixed (the real spans are the decoder request's) and say so.

Subcommands: ``steps`` (per-step fidelity, ``harness.tools.steps``), ``insample`` (every real step log fitted on
itself and replayed, with the replay's own noise floor: ``harness.tools.insample``) and ``protocol`` (calibration,
per-step fit and >= 3 held-out repeats, refused on contention, judged on the engine and server clocks:
``harness.tools.protocol``).

The maximum sustainable rate is not measured here: on the real side it needs a series of runs at rising
rates per workload (minutes each on the shared CPU), more than a fidelity check can afford; the report says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from harness.core import cmdline
from harness.tools.calibrate import load_profile, load_run_config, partial_run, run_means
from harness.core import evidence
from harness.core.profiles import HardwareConfig
from harness.tools import insample
from harness.tools.replay import engine_request_rows, sim_config, simulate_run  # noqa: F401 (sim_config re-exported)
from harness.tools import protocol as pr
from harness.tools import steps as st

# the field's targets (anchors below): mean E2E and mean TPOT/ITL within 10 %, mean TTFT within 20 %,
# judged on vLLM's own clocks where the real run has them (the simulator has no API-server or client term)
TARGETS = {"e2e_mean_s": 0.10, "tpot_mean_s": 0.10, "ttft_mean_s": 0.20}
ANCHORS = ("BLIS: 6.7 % median E2E, 17.6 % TTFT error; Vidur (arXiv 2405.05465): < 9 %; "
           "LLMServingSim: 2.2 % E2E")
PCTS = (50, 90, 99)
# vLLM's own clocks (server_metrics.json) against the simulator's: the engine-side readings of the targets
# (TPOT: vLLM's mean ITL, which is the mean TPOT weighted by tokens; the simulator's ITL mean likewise)
SERVER_PAIRS = {"server_ttft_mean_s": "ttft_mean_s", "server_itl_mean_s": "itl_mean_s",
                "server_e2e_mean_s": "e2e_mean_s"}
ENGINE_TARGETS = {"e2e_mean_s": "server_e2e_mean_s", "tpot_mean_s": "server_itl_mean_s",
                  "ttft_mean_s": "server_ttft_mean_s"}


def _dist(prefix: str, x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    out = {f"{prefix}_mean_s": float(x.mean()) if len(x) else math.nan}
    for q in PCTS:
        out[f"{prefix}_p{q}_s"] = float(np.percentile(x, q)) if len(x) else math.nan
    return out


def _kv_series(inst: pd.DataFrame, grid: np.ndarray) -> np.ndarray:
    """KV used fraction (of capacity) averaged over the instances, sampled on ``grid`` (s, shape (n,)),
    carrying each instance's last sample forward (0 before its first); shape (n,)."""
    out = np.zeros(len(grid))
    names = inst.instance.unique()
    for name in names:
        g = inst[inst.instance == name].sort_values("t_s")
        idx = np.searchsorted(g.t_s.to_numpy(), grid, side="right") - 1
        v = g.kv_used_frac.to_numpy(float)
        out += np.where(idx >= 0, v[np.clip(idx, 0, None)], 0.0)
    return out / max(1, len(names))


def run_metrics(run_dir: Path) -> dict:
    """The compared metrics of one run directory (s for times, tokens/s and requests/s for throughput,
    fractions for KV, J for energy; NaN where not measured)."""
    run_dir = Path(run_dir)
    t = pd.read_parquet(run_dir / "turns.parquet")
    ok = t[t.status == "ok"]
    c = pd.read_parquet(run_dir / "conversations.parquet")
    s = json.loads((run_dir / "summary.json").read_text())
    m: dict = {"turns_ok": int(len(ok)), "turns_failed": int((t.status != "ok").sum())}
    m.update(_dist("ttft", ok.ttft_s))
    m.update(_dist("tpot", ok.tpot_s))
    m.update(_dist("e2e", ok.e2e_s))
    m.update(_dist("ttfet", c.ttfet_s))
    tok_p = run_dir / "tokens.parquet"
    if tok_p.is_file():
        tok = pd.read_parquet(tok_p).sort_values(["conversation_id", "turn", "token"])
        same = (tok.conversation_id.to_numpy()[1:] == tok.conversation_id.to_numpy()[:-1]) & \
               (tok.turn.to_numpy()[1:] == tok.turn.to_numpy()[:-1])
        gaps = np.diff(tok.t_s.to_numpy())[same]
        m.update(_dist("itl", gaps))
    else:
        m.update(_dist("itl", np.array([])))
    m["request_throughput_per_s"] = s.get("request_throughput_per_s") or math.nan
    m["output_token_throughput_per_s"] = s.get("output_token_throughput_per_s") or math.nan
    m["preemptions"] = s.get("preemptions") if s.get("preemptions") is not None else math.nan
    m["energy_j"] = s.get("energy_j") if s.get("energy_j") is not None else math.nan
    inst = pd.read_parquet(run_dir / "instances.parquet")
    end = float(ok.finish_s.max()) if len(ok) else 0.0
    m["span_s"] = end
    if len(inst) and end > 0:
        grid = np.arange(0.0, end, 0.25)
        m["_kv_grid"] = grid
        m["_kv"] = _kv_series(inst, grid)
        m["kv_used_frac_mean"] = float(m["_kv"].mean())
        m["kv_used_frac_max"] = float(inst.kv_used_frac.max())
    server = evidence.server_metrics(run_dir)     # plain or packed (harness.core.evidence)
    if server is not None:
        srv = run_means(server)
        m["server_itl_mean_s"] = srv.get("itl_mean_s", math.nan)
        m["server_ttft_mean_s"] = srv.get("ttft_mean_s", math.nan)
        m["server_prefill_mean_s"] = srv.get("prefill_mean_s", math.nan)
        m["server_e2e_mean_s"] = srv.get("e2e_mean_s", math.nan)
        m["_loadavg"] = server.get("loadavg_1min")
    return m


# the origin of each compared row's times (``compare``'s ``origin``): the real side's / the simulator's
ORIGIN_ENGINE_QUEUED = "engine queued (vLLM queued_ts / sim engine_queued_s: the first step boundary after arrival)"
ORIGIN_ENGINE_ARRIVAL = ("MIXED: real engine queued (queued_ts) / sim arrival (the sim run has no engine_queued_s: "
                         "not like for like)")
ORIGIN_SERVER = "API-server arrival (vLLM arrival_time) / sim arrival (start_s)"
ORIGIN_CLIENT = "client send (real start_s) / sim arrival (start_s)"
ORIGIN_TOKENS = "token to token (no origin)"
ORIGIN_PD_MIXED = ("MIXED: real decoder request queued (its queued_ts) / sim the prefiller's engine_queued_s (a P/D "
                   "turn: not like for like; the per-leg table is)")


def origin(metric: str, sim_queued: bool = True, pd: bool = False) -> str:
    """Which origin the times of a compared metric count from, on each side (module constants ``ORIGIN_*``):
    the engine rows from vLLM's ``queued_ts`` (the simulator's ``engine_queued_s`` where its run has them), the
    server rows from the API server's arrival, the client rows from the client's send; ITL/TPOT rows have none.
    ``pd``: the real run's turns are P/D turns, whose real engine rows are the decoder request's alone (its spans)
    while the simulator's count from the turn's first engine, the prefiller: mixed (``ORIGIN_PD_MIXED``)."""
    if metric.startswith("engine_"):
        if "itl" in metric or metric == "engine_requests":
            return ORIGIN_TOKENS
        if pd:
            return ORIGIN_PD_MIXED
        return ORIGIN_ENGINE_QUEUED if sim_queued else ORIGIN_ENGINE_ARRIVAL
    if "itl" in metric or "tpot" in metric:
        return ORIGIN_TOKENS
    if metric.startswith("server_"):
        return ORIGIN_SERVER
    if metric.startswith(("ttft", "e2e")):
        return ORIGIN_CLIENT
    return ""


def compare(real: dict, sim: dict, per_request: Optional[dict] = None) -> dict:
    """Per-metric ``{"real", "sim", "err"}`` (``err = sim / real - 1``; NaN where either is missing or the
    real value is 0), the KV series' mean absolute difference (fraction points, on the common span), and
    the verdict against ``TARGETS``."""
    rows = {}
    keys = [k for k in real if not k.startswith("_") and not k.startswith("server_")]
    for k in keys:
        r, s = real.get(k, math.nan), sim.get(k, math.nan)
        r = math.nan if r is None else float(r)
        s = math.nan if s is None else float(s)
        err = s / r - 1 if math.isfinite(r) and math.isfinite(s) and r != 0 else math.nan
        rows[k] = {"real": r, "sim": s, "err": err, "origin": origin(k)}
    # engine-side means (real: vLLM's own clocks) against the simulator's ITL / TTFT
    for k, simk in SERVER_PAIRS.items():
        if k in real:
            r, s = float(real[k]), float(sim.get(simk, math.nan))
            rows[k] = {"real": r, "sim": s, "err": s / r - 1 if math.isfinite(r) and r else math.nan,
                       "origin": origin(k)}
    for k, v in (per_request or {}).items():
        r, s = v["real"], v["sim"]
        rows[k] = {"real": r, "sim": s, "err": s / r - 1 if math.isfinite(r) and r else math.nan,
                   "origin": origin(k, v.get("sim_queued", True), v.get("pd", False))}
    kv = {}
    if "_kv" in real and "_kv" in sim:
        n = min(len(real["_kv"]), len(sim["_kv"]))
        d = np.abs(real["_kv"][:n] - sim["_kv"][:n])
        kv = {"mean_abs_diff": float(d.mean()) if n else math.nan, "max_abs_diff": float(d.max()) if n else math.nan,
              "grid_s": 0.25, "points": int(n)}
    verdict, engine = {}, {}
    for k, tol in TARGETS.items():
        e = rows.get(k, {}).get("err", math.nan)
        verdict[k] = {"target": tol, "err": e, "met": bool(math.isfinite(e) and abs(e) <= tol)}
        sk = ENGINE_TARGETS[k]
        if sk in rows:
            e = rows[sk]["err"]
            engine[sk] = {"target": tol, "err": e, "met": bool(math.isfinite(e) and abs(e) <= tol)}
    return {"metrics": rows, "kv_series": kv, "verdict": verdict,
            "all_met": all(v["met"] for v in verdict.values()), "engine_verdict": engine,
            "engine_all_met": bool(engine) and all(v["met"] for v in engine.values())}


def _fmt(v: float, k: str) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    if k == "engine_requests":
        return f"{v:.0f}"
    if k.endswith("per_s"):
        return f"{v:.4g}"
    if k.endswith("_s"):
        return f"{v * 1e3:.2f} ms" if abs(v) < 1 else f"{v:.3f} s"
    return f"{v:.4g}"


def _load(la) -> str:
    return "not recorded" if not la else f"{la.get('start', math.nan):.2f} / {la.get('end', math.nan):.2f}"


def markdown(result: dict) -> str:
    """The report as markdown (what ``fidelity.md`` holds)."""
    c = result["comparison"]
    lines = [f"# Simulator fidelity: `{result['profile']}` vs real run",
             "", f"- real run: `{result['real_dir']}` (workload `{result['workload']}`, "
                 f"{result['real']['turns_ok']} turns)",
             f"- simulated: `{result['sim_dir']}` with hardware profile `{result['profile_path']}`",
             f"- load average (1 min) on the real run's machine at its start / end: "
             f"{_load(result.get('real_loadavg'))}",
             f"- error = sim / real - 1; targets: mean E2E and mean TPOT within 10 %, mean TTFT within 20 %, "
             f"on vLLM's own clocks where the run has them "
             f"(anchors: {ANCHORS})", "",
             "| metric | real | sim | error | origin (real / sim) |", "|---|---|---|---|---|"]
    for k, r in c["metrics"].items():
        e = r["err"]
        lines.append(f"| {k} | {_fmt(r['real'], k)} | {_fmt(r['sim'], k)} | "
                     f"{'n/a' if not math.isfinite(e) else f'{e:+.1%}'} | {r.get('origin', '')} |")
    oc = result.get("one_clock")
    if oc:
        lines += ["", f"One clock (vLLM's `queued_ts` on both sides): the simulator adds an API front end of "
                      f"{oc['api_frontend_s'] * 1e3:.2f} ms "
                      f"per turn (`api_frontend_s`, server clock); a turn then waited "
                      f"{oc['sim_inflight_residual_mean_s'] * 1e3:.2f} ms on average at its engine for the step in "
                      f"flight (queued - arrival - front end), which the engine rows leave out on both sides."]
    kv = c["kv_series"]
    if kv:
        lines += ["", f"KV used fraction over time (both averaged over instances on a {kv['grid_s']} s grid, "
                      f"{kv['points']} points): mean |sim - real| {kv['mean_abs_diff']:.4f}, "
                      f"max {kv['max_abs_diff']:.4f} (fraction of capacity)."]
    lines += ["", "| target | error | limit | met |", "|---|---|---|---|"]
    for k, v in c["verdict"].items():
        e = v["err"]
        lines.append(f"| {k} | {'n/a' if not math.isfinite(e) else f'{e:+.1%}'} | ±{v['target']:.0%} | "
                     f"{'yes' if v['met'] else 'NO'} |")
    lines += ["", f"Verdict (client clocks, what the harness records): "
                  f"{'all targets met' if c['all_met'] else 'not all targets met'}."]
    if c.get("engine_verdict"):
        lines += ["", "The same targets on vLLM's own clocks (`server_metrics.json`: TTFT and E2E from the API "
                      "server's arrival, TPOT as vLLM's mean ITL) against the simulator:", "",
                  "| target | engine-side metric | error | limit | met |", "|---|---|---|---|---|"]
        for k, v in c["engine_verdict"].items():
            e = v["err"]
            lines.append(f"| {[t for t, s in ENGINE_TARGETS.items() if s == k][0]} | {k} | "
                         f"{'n/a' if not math.isfinite(e) else f'{e:+.1%}'} | ±{v['target']:.0%} | "
                         f"{'yes' if v['met'] else 'NO'} |")
        met = "all targets met" if c["engine_all_met"] else "not all targets met"
        lines += ["", f"Verdict (engine clocks): {met}."]
    pdl = result.get("pd_legs")
    if pdl:
        from harness.tools.connector import legs_markdown
        lk = result.get("link")
        lines += ["", (f"Link: `{lk['preset']}` (model {lk.get('model', 'link')})" if lk else
                       "Link: the real run's own cluster link"), ""]
        lines += [legs_markdown(pdl) if pdl["rows"] else f"P/D legs: none ({pdl.get('why', '')})"]
    lines += [
              "", "Maximum sustainable rate: not measured (needs a series of real runs at rising rates; "
                  "see harness/tools/fidelity.py)."]
    return "\n".join(lines) + "\n"


def real_run_problem(real_dir: Path, allow_sim_real: bool = False, allow_partial: bool = False) -> str:
    """Why ``real_dir`` (holding a ``summary.json``) cannot be the real side of a fidelity check, or ``""``:
    a simulator run (``summary.json`` ``backend``, else ``config.yaml`` ``backend.name``, is ``sim``: the
    simulator compared with itself measures nothing about it) unless ``allow_sim_real``; a partial run
    (``harness.analysis.validity.partial_run``: failed or interrupted, its turns stop early, so its means are
    biased) unless ``allow_partial``. A run that names no backend is taken as real."""
    real_dir = Path(real_dir)
    try:
        backend = json.loads((real_dir / "summary.json").read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    if backend is None:
        try:
            backend = (load_run_config(real_dir).get("backend") or {}).get("name")
        except (OSError, ValueError, AttributeError):
            backend = None
    if backend == "sim" and not allow_sim_real:
        return (f"{real_dir} is a simulator run (backend sim), not a real one: the simulator compared with "
                f"itself says nothing about its fidelity; pass --allow-sim-real to compare it anyway")
    partial = partial_run(real_dir)
    if partial and not allow_partial:
        return (f"{real_dir} is a partial run ({partial}): its turns stop early (the run failed or was "
                f"interrupted), so its means are biased; pass --allow-partial to compare it anyway")
    return ""


def load_link(path_or_name: str) -> dict:
    """The ``link`` mapping of a cluster preset (a YAML path or a ``conf/cluster/`` name), validated as a
    ``harness.core.profiles.LinkConfig``.

    Raises:
        FileNotFoundError: no such file or preset. ValueError: no ``link`` in it, or an invalid one (the field named).
    """
    import yaml

    from harness.core.profiles import LinkConfig
    from harness.run.config import PROJECT_ROOT
    p = Path(path_or_name)
    if not p.is_file():
        p = PROJECT_ROOT / "conf" / "cluster" / f"{path_or_name}.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"--link {path_or_name}: no such file or conf/cluster/ preset")
    d = yaml.safe_load(p.read_text()) or {}
    if not isinstance(d.get("link"), dict):
        raise ValueError(f"{p}: no link mapping")
    try:
        LinkConfig(**d["link"]).validate(f"{p}: link")
    except TypeError as e:
        raise ValueError(f"{p}: link: {e}") from None
    return d["link"]


def fidelity(real_dir: Path, profile_path: str, out_dir: Optional[Path] = None, *, allow_sim_real: bool = False,
             allow_partial: bool = False, link: Optional[str] = None,
             role_profiles: Optional[dict] = None) -> dict:
    """Simulate ``real_dir``'s workload with the profile and write ``fidelity.json`` / ``fidelity.md`` into
    ``out_dir`` (default ``<real_dir>/fidelity``); returns the result dict. A simulator run or a partial run
    as the real side is refused unless ``allow_sim_real`` / ``allow_partial`` (:func:`real_run_problem`).
    ``link``: a cluster preset whose ``link`` replaces the run's (:func:`load_link`, e.g. the fitted ExampleConnector
    profile); a real run with P/D turns and spans also gets the per-leg table (``harness.tools.connector.legs``).
    ``role_profiles``: ``{role: profile path or name}`` for the instances of a role (:func:`sim_config`).

    Raises:
        FileNotFoundError: ``real_dir`` is not a completed run directory, or the profile does not exist.
        ValueError: ``real_dir`` is a simulator run or a partial run, not allowed (the message says which).
    """
    from harness.core.recorder import write_json, write_text
    real_dir = Path(real_dir)
    if not (real_dir / "summary.json").is_file():
        raise FileNotFoundError(f"{real_dir}: no summary.json (not a completed run directory)")
    why = real_run_problem(real_dir, allow_sim_real, allow_partial)
    if why:
        raise ValueError(why)
    profile = load_profile(profile_path)
    link_d = load_link(link) if link is not None else None
    out_dir = Path(out_dir) if out_dir is not None else real_dir / "fidelity"
    roles = {r: load_profile(p) for r, p in (role_profiles or {}).items()}
    sim_dir = simulate_run(real_dir, profile, out_dir / "sim", link=link_d, role_profiles=roles)
    real, sim = run_metrics(real_dir), run_metrics(sim_dir)
    cfg = load_run_config(real_dir)
    st_t = pd.read_parquet(sim_dir / "turns.parquet")
    st_t = st_t[st_t.status == "ok"]
    waited = (st_t.engine_queued_s - st_t.start_s - profile.api_frontend_s).mean() if len(st_t) else math.nan
    result = {"real_dir": str(real_dir), "sim_dir": str(sim_dir), "profile": profile.name,
              # the simulator's own one-clock figures: the API front end it adds, and the mean wait of a turn that
              # reached its engine for the step in flight (queued - arrival - front end), s
              "one_clock": {"api_frontend_s": profile.api_frontend_s, "sim_inflight_residual_mean_s": float(waited)},
              "profile_path": str(profile_path), "workload": cfg["workload"]["name"],
              "real": {k: v for k, v in real.items() if not k.startswith("_")},
              "sim": {k: v for k, v in sim.items() if not k.startswith("_")},
              "comparison": compare(real, sim, engine_request_rows(real_dir, sim_dir)),
              "targets": TARGETS, "anchors": ANCHORS,
              "real_loadavg": real.get("_loadavg"),
              "max_sustainable_rate": "not measured: a series of real runs at rising rates per workload"}
    if link_d is not None:
        result["link"] = {"preset": str(link), **link_d}
    if roles:
        result["role_profiles"] = {r: str(p) for r, p in role_profiles.items()}
    real_t = pd.read_parquet(real_dir / "turns.parquet")
    if bool(real_t.disaggregated.any()):
        from harness.tools import connector
        try:
            result["pd_legs"] = connector.legs(real_dir, sim_dir)
        except FileNotFoundError as e:     # a P/D run without spans: no legs, said
            result["pd_legs"] = {"n_turns": 0, "rows": [], "why": str(e)}
    write_json(result, out_dir / "fidelity.json")
    write_text(markdown(result), out_dir / "fidelity.md")
    return result


def compose_real(overrides: Sequence[str]) -> tuple:
    """The project's config composed with ``overrides`` (+ ``logger.steps=true``, ``logger.progress=false``):
    ``(Resolved, resolved yaml)``; nothing is run (``harness.run.config.compose_run``).

    Raises:
        harness.run.config.ConfigError: the overrides do not compose (an unknown key or option, a malformed
            override: Hydra's message on one line) or do not give a valid ``backend=vllm`` run.
    """
    from omegaconf import OmegaConf

    from harness.run.config import ConfigError, compose_run
    run, dcfg = compose_run([*overrides, "logger.steps=true", "logger.progress=false"])
    if run.backend_name != "vllm":
        raise ConfigError(f"--launch needs backend=vllm overrides, got backend {run.backend_name!r}")
    return run, OmegaConf.to_yaml(dcfg)


def launch_real(overrides: Sequence[str], out_dir: Path) -> Path:
    """Run the real side: :func:`compose_real` of ``overrides``, executed into ``out_dir``.

    Raises:
        harness.run.config.ConfigError: the overrides do not give a valid ``backend=vllm`` run.
    """
    from harness.run.runner import execute
    run, text = compose_real(overrides)
    execute(run, out_dir, text)
    return out_dir


# ---- the protocol (its rules: harness.tools.protocol) --------------------------------------------------------------

def protocol(out: Path, base_profile: str, heldout: Sequence[str], calibration: Sequence[str] = pr.CALIBRATION_OVERRIDES,
             repeats: int = pr.MIN_REPEATS, skip_steps: int = 8, max_load_per_cpu: float = pr.MAX_LOAD_BEFORE_PER_CPU,
             max_dispersion: float = pr.MAX_DISPERSION, launch: Optional[Callable] = None,
             max_load_after_per_cpu: float = pr.MAX_LOAD_AFTER_PER_CPU, settle_s: float = pr.SETTLE_S,
             objective: str = "sum", max_slow_periods: float = pr.MAX_SLOW_PERIODS,
             max_insample_steps: float = pr.MAX_INSAMPLE_STEPS) -> dict:
    """Calibrate, fit per step, then replay the held-out workload ``repeats`` times back to back (module docstring).

    The fit is made under every objective of ``harness.tools.steps.OBJECTIVES`` (a modelling choice: relative
    or absolute step-time errors) and each profile judged on the same real runs; ``objective`` names the one
    whose verdicts set the exit status, and the rows whose verdict word differs between objectives are listed
    as depending on it.

    Writes into ``out``: ``calibration/`` (real run; each real run's step-time logs and spans packed,
    ``harness.core.evidence.pack``, so that shipping the runs ships them), ``<base>_protocol.yaml`` (the per-step fit under
    ``objective``, ``harness.tools.steps.fit_steps``, its header listing every term as fitted or fixed at its
    prior) and ``<base>_protocol_<other objective>.yaml``, ``heldout_<k>/`` (real runs, each with ``fidelity/``
    holding ``fidelity.md`` and the per-regime ``steps.md`` of the deciding profile, ``fidelity_<other>/`` those of
    the other), and ``protocol.json``, rewritten after every step: each run's figures (load before / after, the wait
    for the load to settle, the steal share, dispersion), the bounds, then the fit and the rows
    (:func:`protocol_rows`) of the deciding objective, ``by_objective`` (each objective's profile, fit, rows and
    exit status), ``depends_on_objective`` (the rows whose word flips), or ``refused`` with the reason. Before
    each run it waits up to ``settle_s`` s for the load average to fall to the before-bound
    (``harness.tools.protocol.settle``). ``launch(overrides, dir)`` runs a real side (default
    ``harness.tools.fidelity.launch_real``). Returns the ``protocol.json`` dict.

    Raises:
        ValueError: ``repeats`` < ``pr.MIN_REPEATS``, an unknown ``objective``, a bound that is not a finite
            number > 0 (``settle_s``, ``skip_steps``: >= 0), before anything is written or launched.
        harness.tools.steps.Contended: a run's figures are over a bound (:func:`contention_problem`); nothing is
            fitted or judged after it.
        FileNotFoundError: a run wrote no step-time log.
        RuntimeError: a launched run failed (its partial results are written).
    """
    from harness.core.profiles import ModelConfig
    from harness.core.recorder import write_json
    from harness.sim.perf import PerfModel
    from harness.tools.inputs import load_profile, load_run_config
    if repeats < pr.MIN_REPEATS:
        raise ValueError(f"--repeats {repeats}: the protocol needs >= {pr.MIN_REPEATS} held-out repeats")
    if objective not in st.OBJECTIVES:
        raise ValueError(f"--objective {objective}: one of {', '.join(st.OBJECTIVES)}")
    pr.contention_problem({"ncpu": 1}, max_load_per_cpu, max_dispersion, max_load_after_per_cpu,   # bounds: finite, > 0
                          max_slow_periods, max_insample_steps)
    cmdline.check_number("settle_s", settle_s, 0)
    cmdline.check_number("skip_steps", skip_steps, 0)
    launch = launch or launch_real
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"bounds": {"loadavg_1min_per_cpu_before": max_load_per_cpu,
                                "loadavg_1min_per_cpu_after": max_load_after_per_cpu, "settle_s": settle_s,
                                "decode_dispersion": max_dispersion, "slow_periods": max_slow_periods,
                                "insample_steps": max_insample_steps, "min_repeats": pr.MIN_REPEATS},
                     "runs": {}, "calibration_overrides": list(calibration), "heldout_overrides": list(heldout),
                     "repeats": repeats, "deciding_targets": pr.DECIDING, "shown_targets": pr.SHOWN, "anchors": ANCHORS}

    def save():
        write_json(summary, out / "protocol.json")

    def real_run(name: str, overrides: Sequence[str]):
        ncpu = os.cpu_count() or 1
        before, waited = pr.settle(max_load_per_cpu * ncpu, settle_s)
        fig = {"run": name, "ncpu": before["ncpu"], "loadavg_before": before["loadavg"][0]}
        summary["runs"][name] = {"before": before, "figures": fig, "settle_wait_s": round(waited, 1)}
        save()
        why = pr.contention_problem(fig, max_load_per_cpu, max_dispersion, max_load_after_per_cpu, max_slow_periods,
                                    max_insample_steps)
        if not why:
            try:
                launch(overrides, out / name)
            except (RuntimeError, KeyboardInterrupt) as e:   # its partial results are in out / name
                summary["runs"][name]["failed"] = f"{type(e).__name__}: {e}"
                save()
                raise
            after = pr.machine_state()
            evidence.pack(out / name)      # step logs and spans kept, compressed (they ship with the run)
            steps, d, n = pr.run_steps(out / name, skip_steps)
            slow = st.slow_period_figure(steps, base, ModelConfig(**load_run_config(out / name)["model"]))
            with tempfile.TemporaryDirectory(prefix="insample-") as tmp:   # the replay itself is not kept
                ins = insample.in_sample(out / name, Path(tmp), base_profile)["figures"]
            fig.update(loadavg_after=after["loadavg"][0], step_dispersion=d, dispersion_steps=n,
                       slow_periods=slow["figure"], insample_steps=ins["steps"])
            summary["runs"][name]["slow_periods"] = slow
            summary["runs"][name]["insample"] = ins
            summary["runs"][name]["after"] = after
            summary["runs"][name]["steal_share"] = pr.steal_share(before.get("cpu_jiffies"), after.get("cpu_jiffies"))
            why = pr.contention_problem(fig, max_load_per_cpu, max_dispersion, max_load_after_per_cpu,
                                        max_slow_periods, max_insample_steps)
        if why:
            summary["refused"] = why
            save()
            raise st.Contended(why)
        save()
        return steps

    base = load_profile(base_profile)
    cal = real_run("calibration", calibration)
    model = ModelConfig(**load_run_config(out / "calibration")["model"])
    fig_cal = summary["runs"]["calibration"]["figures"]
    order = [objective] + [o for o in st.OBJECTIVES if o != objective]   # the deciding objective first
    profs: dict[str, Path] = {}
    summary["by_objective"] = {}
    for obj in order:
        fit = st.fit_steps(cal, base, model, objective=obj)
        name = f"{base.name}_protocol" + ("" if obj == objective else f"_{obj}")
        fit["hw"] = dataclasses.replace(fit["hw"], name=name)
        fe = st.api_frontend(out / "calibration", cal)
        fit["hw"] = st.with_frontend(fit["hw"], fe)
        extra = {"decode_start_excess": st.decode_start_excess(cal, st.replay(cal, PerfModel(fit["hw"], model))),
                 "api_frontend_ttft": fe}
        prof = profs[obj] = out / f"{name}.yaml"
        prof.write_text(st.steps_profile_yaml(fit, out / "calibration", base.name, fig_cal, extra))
        load_profile(str(prof))   # it loads and validates
        summary["by_objective"][obj] = {
            "profile": str(prof), "fit": {"terms": fit["terms"], "n_steps": fit["n_steps"], "objective": obj,
                                          "dropped_outliers": fit["dropped_outliers"],
                                          "rel_se_bound": fit["rel_se_bound"], **extra}}
    summary["objective"] = objective
    summary["profile"] = summary["by_objective"][objective]["profile"]
    summary["fit"] = summary["by_objective"][objective]["fit"]
    save()
    metrics: dict[str, list] = {obj: [] for obj in order}
    for k in range(1, repeats + 1):
        d = out / f"heldout_{k}"
        real_run(d.name, heldout)
        for obj in order:
            fd = d / ("fidelity" if obj == objective else f"fidelity_{obj}")
            res = fidelity(d, str(profs[obj]), fd)
            st.steps_report(d, str(profs[obj]), fd, skip_steps, check=False)
            metrics[obj].append(res["comparison"]["metrics"])
        summary["runs"][d.name]["fidelity"] = str(d / "fidelity" / "fidelity.md")
        save()
    for obj in order:
        rows = pr.protocol_rows(metrics[obj])
        summary["by_objective"][obj].update(metrics=rows, exit_status=pr.decision(rows))
    summary["metrics"] = summary["by_objective"][objective]["metrics"]
    summary["exit_status"] = summary["by_objective"][objective]["exit_status"]
    summary["depends_on_objective"] = pr.flips({o: v["metrics"] for o, v in summary["by_objective"].items()})
    save()
    return summary


def protocol_main(argv: Sequence[str]) -> int:
    """``python -m harness.tools.fidelity protocol``: see :func:`protocol`."""
    ap = cmdline.ArgumentParser(
        prog="python -m harness.tools.fidelity protocol", description=protocol.__doc__.split("\n\n")[0],
        epilog=f"Bounds: 1-minute load average before each real run (after waiting up to --settle-s for it to settle) "
               f"<= --max-load-per-cpu x the machine's CPUs, after it (its own load included) <= "
               f"--max-load-after-per-cpu x the CPUs; each run's decode step-time dispersion <= --max-dispersion; "
               f"each run's slow-period figure <= --max-slow-periods; "
               f">= {pr.MIN_REPEATS} held-out repeats. "
               f"Verdicts on the engine and server clocks (the client clock shown, never deciding); 'within noise' "
               f"only when the real side's spread is under the target. Exit status: 0 every deciding metric met or "
               f"within noise; 1 one missed, unresolved or without data; 2 bad input, or refused: a contended run "
               f"(the message names the figure and its bound; nothing fitted or judged after it); 3 a launched run "
               f"failed; 130 interrupted. Every bound is checked (finite, in range) before anything runs. "
               f"docs/fidelity_cpu.md, \"The protocol\".")
    ap.add_argument("--profile", required=True, help="base hardware profile (its unfitted fields are kept)")
    ap.add_argument("--out", type=cmdline.writable(directory=True), required=True,
                    help="directory for the runs, the profile and protocol.json")
    ap.add_argument("--calibration", nargs="+", default=list(pr.CALIBRATION_OVERRIDES),
                    help="Hydra overrides of the calibration run (backend=vllm ...; default workload=calibration_steps_cpu)")
    ap.add_argument("--heldout", nargs="+", required=True, help="Hydra overrides of the held-out run (backend=vllm ...)")
    ap.add_argument("--repeats", type=int, default=pr.MIN_REPEATS,
                    help=f"held-out repeats (>= {pr.MIN_REPEATS}; fewer is refused before anything runs)")
    ap.add_argument("--skip-steps", type=cmdline.number(0, integer=True), default=8,
                    help="first logged steps per instance left out (warm-up; >= 0)")
    ap.add_argument("--max-load-per-cpu", type=cmdline.number(0, lo_open=True), default=pr.MAX_LOAD_BEFORE_PER_CPU,
                    help="bound of the 1-minute load average per CPU before each run, settled (default %(default)s)")
    ap.add_argument("--max-load-after-per-cpu", type=cmdline.number(0, lo_open=True), default=pr.MAX_LOAD_AFTER_PER_CPU,
                    help="bound of the 1-minute load average per CPU after each run, its own load included "
                         "(default %(default)s)")
    ap.add_argument("--settle-s", type=cmdline.number(0), default=pr.SETTLE_S,
                    help="longest wait before each run for the load average to settle under its bound, s "
                         "(default %(default)s)")
    ap.add_argument("--max-dispersion", type=cmdline.number(0, lo_open=True), default=pr.MAX_DISPERSION,
                    help="bound of a run's decode step-time dispersion (IQR / median within a composition; > 0)")
    ap.add_argument("--max-slow-periods", type=cmdline.number(1), default=pr.MAX_SLOW_PERIODS,
                    help="bound of a run's slow-period figure (busy-time-weighted over step-weighted speed ratio of "
                         f"{st.SLOW_WINDOW_S:g} s windows against its own in-sample fit; correlated machine noise; "
                         ">= 1; default %(default)s)")
    ap.add_argument("--max-insample-steps", type=cmdline.number(0, lo_open=True), default=pr.MAX_INSAMPLE_STEPS,
                    help="bound of a run's |in-sample step-count error| (its own log fitted on itself and replayed: "
                         "a slowed API server or client changes the real batching; > 0; default 0.08)")
    ap.add_argument("--objective", choices=st.OBJECTIVES, default="sum",
                    help="the per-step fit's objective whose verdicts set the exit status (every objective is fitted "
                         "and judged on the same runs, and the verdicts that depend on it are named; default "
                         "%(default)s)")
    a = ap.parse_args(argv)
    from harness.run.config import ConfigError
    try:
        if a.repeats < pr.MIN_REPEATS:
            raise ValueError(f"--repeats {a.repeats}: the protocol needs >= {pr.MIN_REPEATS} held-out repeats")
        check_profile(a.profile)
        for what, ov in (("--calibration", a.calibration), ("--heldout", a.heldout)):
            try:
                compose_real(ov)   # both valid backend=vllm runs, before anything is launched
            except ConfigError as e:
                raise ValueError(f"{what}: {e}") from None
        s = protocol(a.out, a.profile, a.heldout, a.calibration, a.repeats, a.skip_steps, a.max_load_per_cpu,
                     a.max_dispersion, max_load_after_per_cpu=a.max_load_after_per_cpu, settle_s=a.settle_s,
                     objective=a.objective, max_slow_periods=a.max_slow_periods,
                     max_insample_steps=a.max_insample_steps)
    except (FileNotFoundError, ValueError) as e:   # st.Contended is a ValueError: a refusal, with its figures
        refused = isinstance(e, st.Contended)
        print(f"refused: {e} (figures in {a.out / 'protocol.json'})" if refused else f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: a launched run failed: {e} (what was measured: {a.out / 'protocol.json'})", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"interrupted (what was measured: {a.out / 'protocol.json'})", file=sys.stderr)
        return 130
    for obj, v in s["by_objective"].items():
        print(f"fit objective {obj}" + (" (deciding)" if obj == s["objective"] else "") + f": {v['profile']}")
        print(pr.rows_text(v["metrics"]))
    flips = s["depends_on_objective"]
    print("depends on the fit objective: " + ", ".join(flips) if flips else
          "no verdict depends on the fit objective")
    print(json.dumps({k: v["figures"] for k, v in s["runs"].items()}, default=str))
    return s["exit_status"]


def check_profile(path_or_name: str) -> HardwareConfig:
    """``harness.tools.inputs.load_profile`` (every way a profile can be bad is one ``ValueError`` line naming the
    profile), run before anything else (``--launch`` starts servers).

    Raises:
        FileNotFoundError: no such file or ``conf/hardware/`` profile. ValueError: the profile is invalid.
    """
    return load_profile(path_or_name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["protocol"]:   # the protocol (its rules: harness.tools.protocol)
        return protocol_main(argv[1:])
    if argv[:1] == ["insample"]:   # every step log replayed in sample: harness.tools.insample
        from harness.tools.insample import insample_main
        return insample_main(argv[1:])
    if argv[:1] == ["steps"]:   # per-step fidelity: harness.tools.steps
        from harness.tools.steps import steps_main
        return steps_main(argv[1:])
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.fidelity", description=__doc__.split("\n\n")[0],
                                 epilog="Exit status: 0 when every target is met on vLLM's own clocks (on the client's "
                                        "where the run has no server_metrics.json), 1 when one "
                                        "is missed, 2 on bad arguments (no such run directory or completed run, "
                                        "no such or an invalid profile, bad --launch overrides, a simulator "
                                        "or partial real run without --allow-sim-real / --allow-partial), 3 when the "
                                        "--launch run failed, 130 when interrupted.")
    ap.add_argument("real_dir", type=Path, help="a completed real run directory (or where --launch writes one)")
    ap.add_argument("--profile", required=True, help="hardware profile: a YAML path or a conf/hardware/ name")
    ap.add_argument("--out", type=cmdline.writable(directory=True), default=None,
                    help="report directory (default <real_dir>/fidelity)")
    ap.add_argument("--launch", nargs=argparse.REMAINDER, default=None,
                    help="run the real side first with these Hydra overrides (backend=vllm ...)")
    ap.add_argument("--allow-sim-real", action="store_true",
                    help="accept a simulator run (backend sim) as the real side; else refused (exit 2)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="accept a partial real run (summary.json \"partial\": true); else refused (exit 2)")
    ap.add_argument("--link", default=None,
                    help="a cluster preset (YAML path or conf/cluster/ name) whose link replaces the real run's in the "
                         "simulated replay, e.g. the fitted ExampleConnector profile "
                         "(conf/cluster/cpu_1p1d_example_connector.yaml); P/D runs get a per-leg table")
    ap.add_argument("--role-profile", action="append", default=[], metavar="ROLE=PROFILE",
                    help="the instances of ROLE (prefiller, decoder, collocated) replayed with PROFILE (YAML path or "
                         "conf/hardware/ name) instead of --profile, e.g. a P/D pair at its measured speeds "
                         "(python -m harness.tools.connector --hardware-out); repeatable")
    a = ap.parse_args(argv)
    from harness.run.config import ConfigError
    from harness.core.trace import TraceError
    try:
        check_profile(a.profile)   # a bad profile is bad input (2), found before the real side is launched
        if a.link is not None:
            load_link(a.link)      # so is a bad link
        role_profiles = {}
        for rp in a.role_profile:
            role, sep, prof = rp.partition("=")
            if not sep or role not in ("prefiller", "decoder", "collocated"):
                raise ValueError(f"--role-profile {rp!r}: ROLE=PROFILE with ROLE one of prefiller, decoder, collocated")
            check_profile(prof)
            role_profiles[role] = prof
        if a.launch is not None:
            try:
                launch_real(a.launch, a.real_dir)
            except RuntimeError as e:  # the real run failed (its partial results are written)
                print(f"error: the --launch run failed: {e}", file=sys.stderr)
                return 3
        result = fidelity(a.real_dir, a.profile, a.out, allow_sim_real=a.allow_sim_real,
                          allow_partial=a.allow_partial, link=a.link, role_profiles=role_profiles)
    except (FileNotFoundError, ValueError, ConfigError, TraceError) as e:  # ConfigError, TraceError: ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(markdown(result))
    c = result["comparison"]
    return 0 if (c["engine_all_met"] if c.get("engine_verdict") else c["all_met"]) else 1


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
