"""Fidelity and calibration at the engine step: every real step's exact batch, replayed through the
step model, and a least-squares fit of the step model's coefficients to the real step times.

Input: the step-time logs a launched vLLM server writes with ``logger.steps=true``
(``<run_dir>/logs/<instance>.step_times.jsonl``, ``harness.vllm.wait_scheduler.StepTimingMixin``): one line per
non-empty engine step with its decode sequences (KV context, output tokens so far), its prefill chunks
(tokens, prefix in the KV cache, prefix-cache hit, whether the chunk completes the prompt) and its wall time
on the engine core's clock.

* :func:`replay`: ``harness.sim.perf.PerfModel.step`` (``decode_step`` for decode-only steps) of each step's
  batch, with the arguments ``harness.sim.engine`` passes for such a step.
* :func:`regime_table`: per regime (decode batch 1 / 2-4 / 5-16 / >16; decode context bands; prefill-only
  steps without a prefix, with a cached prefix, continuing a chunked prompt; mixed prefill + decode; busy vs
  after an idle gap; with a request's first decode step) the step count, the median error ``model / real -
  1`` of the steps, the error of the regime's total time, and the real side's own dispersion: the relative
  interquartile range (IQR / median) of real step times among steps of the same composition (same decode
  batch, summed context within 256 tokens, same prefill tokens within 32), pooled over compositions seen at
  least 3 times.
* :func:`contention`: refuses (``Contended``) a run whose 1-minute load average (the step log's first line,
  ``server_metrics.json``'s start / end) exceeds ``max_load_per_cpu`` x the machine's CPUs, or whose pooled
  decode-step dispersion exceeds ``max_dispersion``: such a run measures the machine, not the server.
* :func:`fit_steps`: least squares of the step model's additive terms on the real step times, with one of three
  objectives (:data:`OBJECTIVES`, a modelling choice the fidelity protocol reports every way): ``sum`` (the deciding
  one: ordinary least squares, then the per-step intercept set so the model's summed time over every
  logged step, the dropped outliers included, equals the real one: what a simulated timeline spends), ``relative``
  (rows scaled by ``1 / measured``: every step's relative error weighs the same, so the fit follows the typical
  step and, on right-skewed step times, falls below their mean) or ``absolute`` (ordinary least squares on the
  times, s: with the intercept, the kept steps' residuals sum to zero, so the fitted model reproduces their
  summed time, not the outliers'). Each coefficient has its standard error
  (``s^2 (X^T X)^-1``); a coefficient
  whose relative standard error exceeds ``rel_se_bound`` (or whose estimate is not positive) is fixed at its
  prior (the base profile's value) and the rest refitted, worst first, until every free coefficient is
  identified. Steps more than ``outlier_mads`` scaled MADs from the median residual (time-slice stalls) are
  dropped once and counted. Then the busy timeline (:func:`fit_busy_timeline`: the between-step and after-idle
  terms, from the log's gaps) and, by ``calibrate``, the API front end net of the in-flight residual
  (:func:`api_frontend`).
* :func:`slow_periods`: a within-run validity figure that sees correlated (slow-period) machine noise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from harness.core import evidence
from harness.core.profiles import AFTER_IDLE_BANDS_S, HardwareConfig, ModelConfig, rescale_peaks
from harness.sim.perf import PerfModel, REF_KV_HEADS
from harness.sim.step_model import StepModel

STEP_FIELDS = ["instance", "step", "t0", "t_end", "wall_s", "idle_s", "decode_seqs", "decode_ctx", "first_decodes",
               "prefill_tokens", "prefill_ctx", "prefill_pairs", "prefill_samples", "prefill_seqs", "prefill_cached"]
# contention bounds (stated; docs/fidelity_cpu.md "Per-step fidelity"): the 1-minute load average per CPU of the
# machine read while the run's own servers and client were up (its first logged step, server_metrics.json's start /
# end: the run's own load is in it; quiet runs on 2 CPUs read 0.44-2.25, one more CPU-bound process adds about 1),
# and the pooled within-composition IQR / median of decode-only step times
MAX_LOAD_PER_CPU = 1.5
MAX_DISPERSION = 0.25
REL_SE_BOUND = 0.5        # a coefficient with a larger relative standard error is not identified: fixed at its prior
IDLE_GAP_S = 0.05         # a step that started this long after the previous one ended follows an idle engine
# fit_steps' objectives: "sum" (absolute least squares, then the per-step intercept set so that the model's summed
# time over every logged step, the dropped outliers included, equals the real one: what a simulated timeline spends;
# the deciding one: an under-priced sum makes the simulated engine empty faster and batch fewer decodes per step),
# "relative" (each step's relative error weighs the same; fit_steps' default) and
# "absolute" (plain least squares on the kept step times: their summed time kept, the outliers' not)
OBJECTIVES = ("sum", "relative", "absolute")


class Contended(ValueError):
    """A run refused because it measured a contended machine; the message names the figure and its bound."""


def load_step_times(run_dir: Path, skip_steps: int = 0, chunks: bool = False) -> tuple[pd.DataFrame, dict]:
    """Every logged step of every instance of ``run_dir`` (``logs/*.step_times.jsonl``) as one row of
    :data:`STEP_FIELDS` (tokens; s), and ``{instance: start line}`` (load average, CPUs). ``skip_steps``: the
    first steps of each instance dropped (the harness's warm-up requests). ``chunks``: also a ``prefill_chunks``
    column, the step's logged prefill chunks as they are (``[[n, prefix, cached, samples], ...]``, tokens; the P/D
    connector's fit reads them, ``harness.tools.connector``).

    Raises:
        FileNotFoundError: no step-time log (a run without ``logger.steps=true`` on launched servers).
        ValueError: a line that is not JSON (naming the file and line).
    """
    files = evidence.step_time_logs(run_dir)     # plain or packed (harness.core.evidence)
    if not files:
        raise FileNotFoundError(f"{run_dir}/logs: no *.step_times.jsonl (run backend=vllm with logger.steps=true "
                                f"on launched servers)")
    rows, meta = [], {}
    for inst, f in files:
        for k, line in enumerate(evidence.read_text(f).splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise ValueError(f"{f}:{k}: not JSON") from None
            if d.get("event") == "start":
                meta[inst] = d
                continue
            if d["step"] <= skip_steps:
                continue
            rows.append(composition_row(inst, d) + ((d.get("prefill", []),) if chunks else ()))
    return pd.DataFrame(rows, columns=STEP_FIELDS + (["prefill_chunks"] if chunks else [])), meta


def composition_row(inst: str, d: dict) -> tuple:
    """One step-time log line as the :data:`STEP_FIELDS` tuple: the ``PerfModel.step`` arguments of its batch
    (decode sequences and summed context; prefill tokens, prefix tokens read, causal attention pairs ``n p +
    n (n + 1) / 2``, chunks completing their prompt, chunks, cached prefix tokens of chunks starting their
    prefill) and the decodes that are a request's first decode step."""
    dec, pre = d.get("decode", []), d.get("prefill", [])
    return (inst, int(d["step"]), float(d["t0"]), float(d["t_end"]), float(d["wall_s"]),
            math.nan if d.get("idle_s") is None else float(d["idle_s"]),
            len(dec), sum(c for c, _ in dec), sum(1 for _, o in dec if o <= 1),
            sum(p[0] for p in pre), sum(p[1] for p in pre), float(sum(n * p + n * (n + 1) / 2 for n, p, *_ in pre)),
            sum(p[3] for p in pre), len(pre), sum(p[2] for p in pre))


def replay(steps: pd.DataFrame, perf: StepModel) -> np.ndarray:
    """The step model's time of every step row (s): ``decode_step`` for decode-only steps, else ``step`` with
    the per-prefill arguments, and the step's first decodes when ``perf`` prices them (``has_decode_start``), as
    ``harness.sim.engine`` charges them; plus the after-idle term of the logged gap before the step
    (``PerfModel.after_idle``; the first logged step counts as after a long idle, as the engine's first step does),
    less the between-step term (``between_step_s``: outside the logged ``wall_s``)."""
    out = np.empty(len(steps))
    cols = [steps[c].to_numpy() for c in ("decode_seqs", "decode_ctx", "prefill_tokens", "prefill_ctx",
                                          "prefill_pairs", "prefill_samples", "prefill_seqs", "prefill_cached")]
    first = steps.first_decodes.to_numpy() if perf.has_decode_start else np.zeros(len(steps), int)
    for i, (b, ctx, n, p, pairs, samp, seqs, cached, f) in enumerate(zip(*cols, first)):
        if n == 0:
            out[i] = perf.decode_step(int(b), int(ctx), int(f)).time_s
        else:
            out[i] = perf.step(int(n), float(pairs), int(p), int(samp), int(b), int(ctx), int(seqs), int(cached),
                               int(f)).time_s
    if any(perf.after_idle_s):
        out += [perf.after_idle(x if math.isfinite(x) else math.inf) for x in steps.idle_s.to_numpy(float)]
    return out - perf.between_step_s


def regimes(steps: pd.DataFrame) -> dict[str, pd.Series]:
    """Boolean masks of the reported regimes (module docstring), by grouping: ``{"batch: decode b=1": mask,
    ...}``; a step falls in one regime of each grouping (``batch``, ``context``, ``state``)."""
    b, n = steps.decode_seqs, steps.prefill_tokens
    dec = n == 0
    ctx = steps.decode_ctx / steps.decode_seqs.clip(lower=1)
    out = {"batch: decode b=1": dec & (b == 1), "batch: decode b=2-4": dec & b.between(2, 4),
           "batch: decode b=5-16": dec & b.between(5, 16), "batch: decode b>16": dec & (b > 16),
           "batch: prefill only, no prefix": (b == 0) & (n > 0) & (steps.prefill_ctx == 0),
           "batch: prefill only, cached prefix": (b == 0) & (n > 0) & (steps.prefill_cached > 0),
           "batch: prefill only, chunk after earlier chunks": (b == 0) & (n > 0) & (steps.prefill_ctx > 0)
           & (steps.prefill_cached == 0),
           "batch: mixed prefill + decode": (b > 0) & (n > 0)}
    for lo, hi in ((0, 200), (200, 500), (500, 1000), (1000, 2000), (2000, math.inf)):
        out[f"context: decode, {lo}-{hi if hi < math.inf else ''} tokens per sequence"] = dec & (ctx >= lo) & (ctx < hi)
    idle = steps.idle_s.fillna(math.inf) > IDLE_GAP_S
    out["state: after an idle gap > 50 ms"] = idle
    out["state: busy"] = ~idle
    out["state: decode with a request's first decode step"] = dec & (steps.first_decodes > 0)
    return out


def composition_key(steps: pd.DataFrame) -> pd.Series:
    """Steps of "the same composition": same decode batch, summed context // 256, prefill tokens // 32, prefix //
    256 and chunks."""
    return (steps.decode_seqs.astype(str) + "/" + (steps.decode_ctx // 256).astype(str) + "/"
            + (steps.prefill_tokens // 32).astype(str) + "/" + (steps.prefill_ctx // 256).astype(str) + "/"
            + steps.prefill_seqs.astype(str))


def dispersion(steps: pd.DataFrame, min_count: int = 3) -> tuple[float, int]:
    """The real side's own spread: the IQR / median of real step times within each composition
    (:func:`composition_key`) seen at least ``min_count`` times, pooled as the step-weighted median over those
    compositions; and the number of steps it rests on (NaN, 0 when none)."""
    if steps.empty:
        return math.nan, 0
    vals, weights = [], []
    for _, g in steps.groupby(composition_key(steps)):
        if len(g) >= min_count:
            q1, q2, q3 = np.percentile(g.wall_s, [25, 50, 75])
            vals.append((q3 - q1) / q2 if q2 > 0 else math.nan)
            weights.append(len(g))
    if not vals:
        return math.nan, 0
    order = np.argsort(vals)
    v, w = np.asarray(vals)[order], np.asarray(weights)[order]
    return float(v[np.searchsorted(np.cumsum(w), w.sum() / 2)]), int(w.sum())


def regime_table(steps: pd.DataFrame, model_s: np.ndarray) -> list[dict]:
    """Per regime (:func:`regimes`): ``n`` steps, real and model median step time (s), ``median_err`` (of
    ``model / real - 1`` per step), ``median_abs_err``, ``total_err`` (sum model / sum real - 1) and the real
    dispersion (:func:`dispersion`) with the steps it rests on."""
    err = model_s / steps.wall_s.to_numpy() - 1.0
    rows = []
    for name, m in regimes(steps).items():
        m = m.to_numpy()
        g = steps[m]
        disp, nd = dispersion(g)
        e = err[m]
        rows.append({"regime": name, "n": int(m.sum()),
                     "real_median_s": float(g.wall_s.median()) if m.any() else math.nan,
                     "model_median_s": float(np.median(model_s[m])) if m.any() else math.nan,
                     "median_err": float(np.median(e)) if m.any() else math.nan,
                     "median_abs_err": float(np.median(np.abs(e))) if m.any() else math.nan,
                     "total_err": float(model_s[m].sum() / g.wall_s.sum() - 1) if m.any() else math.nan,
                     "real_dispersion": disp, "dispersion_steps": nd})
    return rows


def run_loadavg(run_dir: Path, meta: dict) -> dict:
    """The 1-minute load averages recorded for the run: at the first logged step of each instance (its step
    log's start line), and at the run's start and end (``server_metrics.json`` ``loadavg_1min``); ``ncpu``: the
    machine's CPUs (the start line's, else this machine's)."""
    out: dict = {"ncpu": next((m.get("ncpu") for m in meta.values() if m.get("ncpu")), os.cpu_count())}
    for inst, m in meta.items():
        if m.get("loadavg"):
            out[f"{inst} first step"] = float(m["loadavg"][0])
    sm = evidence.server_metrics(run_dir)
    if sm is not None:
        la = sm.get("loadavg_1min") or {}
        for k in ("start", "end"):
            if la.get(k) is not None:
                out[f"run {k}"] = float(la[k])
    return out


def contention(run_dir: Path, steps: pd.DataFrame, meta: dict, max_load_per_cpu: float = MAX_LOAD_PER_CPU,
               max_dispersion: float = MAX_DISPERSION, check: bool = True) -> dict:
    """The run's contention figures (:func:`run_loadavg`; ``dispersion`` of its decode-only steps) and the
    bounds; raises :class:`Contended` naming the first figure over its bound. ``check=False``: the figures only,
    ``"bounds": "not checked"`` (a contended run fitted or reported anyway says how contended it was).

    Raises:
        Contended: a load average above ``max_load_per_cpu x ncpu``, or a decode-step dispersion above
            ``max_dispersion`` (``check`` only).
        ValueError: a bound that is not a finite number > 0 (a NaN bound would pass every figure).
    """
    from harness.core.cmdline import check_number
    check_number("max_load_per_cpu", max_load_per_cpu, 0, lo_open=True)
    check_number("max_dispersion", max_dispersion, 0, lo_open=True)
    la = run_loadavg(run_dir, meta)
    disp, nd = dispersion(steps[steps.prefill_tokens == 0])
    if not check:
        return {"loadavg_1min": la, "decode_dispersion": disp, "dispersion_steps": nd, "bounds": "not checked"}
    fig = {"loadavg_1min": la, "decode_dispersion": disp, "dispersion_steps": nd,
           "bounds": {"loadavg_1min": max_load_per_cpu * la["ncpu"], "decode_dispersion": max_dispersion}}
    bound = max_load_per_cpu * la["ncpu"]
    for k, v in la.items():
        if k != "ncpu" and v > bound:
            raise Contended(f"{run_dir}: 1-minute load average {v:.2f} ({k}) > bound {bound:.2f} "
                            f"({max_load_per_cpu:g} x {la['ncpu']} CPUs): the machine was contended; rerun on a quiet machine")
    if math.isfinite(disp) and disp > max_dispersion:
        raise Contended(f"{run_dir}: decode step-time dispersion (IQR / median within a composition, {nd} steps) "
                        f"{disp:.1%} > bound {max_dispersion:.0%}: the machine was contended; rerun on a quiet machine")
    return fig


# ---- correlated noise: slow periods ----------------------------------------------------------------------------

SLOW_WINDOW_S = 0.5       # the slow-period figure's window, s of busy time (logged step time)
# bound of the slow-period figure (docs/fidelity_cpu.md "A validity figure that sees slow periods"): the shipped
# calibration (docs/data/twin_cpu/calibration) reads 1.030; the same log with every 200 steps' first 60 at half speed
# 1.144, at 2/3 speed 1.070; independent log-normal noise of sigma 0.3 on every step 1.049
MAX_SLOW_PERIODS = 1.10


def slow_periods(steps: pd.DataFrame, model_s: np.ndarray, window_s: float = SLOW_WINDOW_S) -> dict:
    """A within-run validity figure that sees correlated (slow) machine noise, which the dispersion (the size of the
    noise) does not: the logged steps of each instance in time order are cut into windows of ``window_s`` s of busy
    time (their summed ``wall_s``); each window's speed ratio is ``R = sum(wall) / sum(model)`` (``model_s``: the
    step model's times of the same steps, s, e.g. the run's own in-sample fit); the figure is the busy-time-weighted
    mean of ``R`` over the step-weighted mean of ``R``. A machine slowed for a while makes its windows
    slower and fewer-stepped at once, so busy time weighs them more than steps do: the figure rises above 1; noise
    that is independent from step to step averages out within a window and leaves it near 1, and so does a constant
    speed. Returns ``{"figure", "busy_weighted", "step_weighted", "windows"}`` (NaN with fewer than 2 windows)."""
    R, B, N = [], [], []
    for _, idx in steps.groupby("instance").groups.items():
        g = steps.loc[idx].sort_values("t0")
        w = g.wall_s.to_numpy(float)
        m = np.asarray(model_s)[steps.index.get_indexer(g.index)]
        win = (np.cumsum(w) // window_s).astype(int)
        bw, bm, bn = np.bincount(win, w), np.bincount(win, m), np.bincount(win)
        ok = (bn > 0) & (bm > 0)
        R += list(bw[ok] / bm[ok])
        B += list(bw[ok])
        N += list(bn[ok])
    if len(R) < 2:
        return {"figure": math.nan, "busy_weighted": math.nan, "step_weighted": math.nan, "windows": len(R)}
    R, B, N = (np.asarray(x, float) for x in (R, B, N))
    bwm, swm = float((B * R).sum() / B.sum()), float((N * R).sum() / N.sum())
    return {"figure": bwm / swm, "busy_weighted": bwm, "step_weighted": swm, "windows": int(len(R))}


def slow_period_figure(steps: pd.DataFrame, base: HardwareConfig, model: ModelConfig,
                       window_s: float = SLOW_WINDOW_S) -> dict:
    """:func:`slow_periods` against the run's own in-sample per-step fit (:func:`fit_steps`, objective ``sum``):
    the figure judges the machine's time structure, not another run's prices. NaN figure when the run has too few
    steps to fit."""
    try:
        fit = fit_steps(steps.reset_index(drop=True), base, model, objective="sum")
    except ValueError:
        return {"figure": math.nan, "busy_weighted": math.nan, "step_weighted": math.nan, "windows": 0}
    st_ = steps.reset_index(drop=True)
    return slow_periods(st_, replay(st_, PerfModel(fit["hw"], model)), window_s)


# ---- the fit -------------------------------------------------------------------------------------------

TERMS = ("step_overhead_s", "decode_seq_s", "kv_token_s", "prefill_token_s", "attention_pair_s",
         "prefill_seq_overhead_s", "cached_prefix_token_s", "decode_start_s")


def _flops(model: ModelConfig) -> tuple[float, float, float]:
    """``(linear FLOPs per token, LM-head FLOPs per sampling sequence, attention FLOPs per (query, key) pair)``
    (harness.sim.perf's module docstring: Kaplan et al. 2020, Sec. 2.1)."""
    L = model.num_layers
    return (2.0 * L * model.linear_params_per_layer, 2.0 * model.hidden_size * model.vocab_size,
            4.0 * L * model.num_heads * model.head_dim)


def design(steps: pd.DataFrame, hw: HardwareConfig, model: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(X, offset)`` of the step model in its additive terms (:data:`TERMS`): ``wall ~ offset + X beta``.

    Columns: 1 (per step), decode sequences, KV tokens read and written (prefix + prefill + context +
    decodes), prefill tokens + LM-head FLOPs of sampling chunks in prefill-token units, attention pairs,
    prefill chunks, cached prefix tokens, decode sequences in their request's first decode step. ``offset``: the
    linear layers' time terms the fit keeps from ``hw`` (``decode_efficiency`` and ``memory_efficiency``): under
    the hard roofline ``max(lin_c, lin_m)`` with the decode GEMMs' ``lin_c`` and the streamed weights' ``lin_m``;
    a step whose prefill GEMMs are on the compute side has its decode ``lin_c`` in the offset and the prefill
    part in column 3 (a step whose weights time dominates gets ``lin_m`` and a 0 in column 3)."""
    lf, hf, af = _flops(model)
    b = steps.decode_seqs.to_numpy(float)
    n = steps.prefill_tokens.to_numpy(float)
    dec_c = (lf + hf) * b / (hw.peak_flops * hw.decode_efficiency)
    lin_m = model.step_weight_bytes / (hw.mem_bandwidth_bytes_per_s * hw.memory_efficiency)
    pre_units = n + hf / lf * steps.prefill_samples.to_numpy(float)
    pre_c = pre_units * lf / (hw.peak_flops * hw.prefill_efficiency)   # the prior's, to choose the roofline side
    compute = dec_c + pre_c >= lin_m
    offset = np.where(compute, dec_c, lin_m)
    kv = (steps.prefill_ctx + steps.prefill_tokens + steps.decode_ctx + steps.decode_seqs).to_numpy(float)
    X = np.column_stack([np.ones(len(steps)), b, kv, np.where(compute, pre_units, 0.0),
                         steps.prefill_pairs.to_numpy(float), steps.prefill_seqs.to_numpy(float),
                         steps.prefill_cached.to_numpy(float), steps.first_decodes.to_numpy(float)])
    return X, offset


def priors(hw: HardwareConfig, model: ModelConfig) -> dict:
    """Each of :data:`TERMS` as ``hw`` has it (s per unit of its column of :func:`design`)."""
    lf, hf, af = _flops(model)
    L = model.num_layers
    kv_eff = hw.memory_efficiency if hw.kv_memory_efficiency is None else hw.kv_memory_efficiency
    attn_eff = hw.prefill_efficiency if hw.attention_efficiency is None else hw.attention_efficiency
    return {"step_overhead_s": hw.step_overhead_s + L * hw.layer_overhead_s,
            "decode_seq_s": L * hw.attention_seq_overhead_s * model.num_kv_heads / REF_KV_HEADS,
            "kv_token_s": model.kv_bytes_per_token / (hw.mem_bandwidth_bytes_per_s * kv_eff),
            "prefill_token_s": lf / (hw.peak_flops * hw.prefill_efficiency)
            + L * hw.attention_token_overhead_s * model.num_heads * model.head_dim / 4096,
            "attention_pair_s": af / (hw.peak_flops * attn_eff),
            "prefill_seq_overhead_s": hw.prefill_seq_overhead_s, "cached_prefix_token_s": hw.cached_prefix_token_s,
            "decode_start_s": hw.decode_start_s}


def profile_from_terms(base: HardwareConfig, model: ModelConfig, beta: dict, source: str) -> HardwareConfig:
    """``base`` with the fitted terms written as its fields: ``step_overhead_s`` (``layer_overhead_s`` 0),
    ``attention_seq_overhead_s`` (the per-sequence decode cost beyond the decode GEMMs), ``kv_memory_efficiency``,
    ``prefill_efficiency`` (``attention_token_overhead_s`` 0), ``attention_efficiency``, the per-prefill terms,
    ``decode_start_s``; the hard roofline; ``decode_efficiency``, ``memory_efficiency`` and the peaks kept, unless
    an efficiency comes out above 1 (the base's peaks are round figures a machine can beat): then the peak is raised by it
    and every efficiency on that side divided by it (:func:`harness.core.profiles.rescale_peaks`; every step
    time unchanged). ``source`` goes to ``prefill_terms_source``'s note and ``source``."""
    lf, hf, af = _flops(model)
    L = model.num_layers
    return rescale_peaks(dataclasses.replace(
        base, roofline_exponent=None, layer_overhead_s=0.0, attention_token_overhead_s=0.0,
        step_overhead_s=beta["step_overhead_s"],
        attention_seq_overhead_s=beta["decode_seq_s"] * REF_KV_HEADS / (L * model.num_kv_heads),
        kv_memory_efficiency=model.kv_bytes_per_token / (base.mem_bandwidth_bytes_per_s * beta["kv_token_s"]),
        prefill_efficiency=lf / (base.peak_flops * beta["prefill_token_s"]),
        attention_efficiency=af / (base.peak_flops * beta["attention_pair_s"]),
        prefill_seq_overhead_s=beta["prefill_seq_overhead_s"], cached_prefix_token_s=beta["cached_prefix_token_s"],
        decode_start_s=beta.get("decode_start_s", base.decode_start_s), prefill_terms_source=source, source=source))


def _wls(X: np.ndarray, y: np.ndarray, offset: np.ndarray, objective: str = "relative",
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``relative``: least squares of ``(y - offset) / y`` on ``X / y``; ``absolute``: of ``y - offset`` on ``X``.
    Returns ``(beta, standard errors, residuals)`` (relative residuals, or seconds)."""
    w = 1.0 / y if objective == "relative" else np.ones_like(y)      # "absolute", "sum": plain least squares
    A = X * w[:, None]
    r = (y - offset) * w
    beta, *_ = np.linalg.lstsq(A, r, rcond=None)
    res = r - A @ beta
    dof = max(1, len(y) - X.shape[1])
    try:
        cov = np.linalg.inv(A.T @ A) * float(res @ res) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        se = np.full(X.shape[1], math.inf)
    return beta, se, res


def fit_steps(steps: pd.DataFrame, base: HardwareConfig, model: ModelConfig, rel_se_bound: float = REL_SE_BOUND,
              outlier_mads: float = 8.0, objective: str = "relative", decode_start: bool = True,
              busy_timeline: bool = True) -> dict:
    """Fit :data:`TERMS` to the real step times (module docstring), under ``objective`` (:data:`OBJECTIVES`).
    ``decode_start=False`` leaves ``decode_start_s`` out of the fit (the base's value is kept and
    the term is not listed: the fit as it was before the term existed, ``calibrate --no-decode-start``).
    ``busy_timeline`` (default): also the between-step and after-idle terms (:func:`fit_busy_timeline`, listed with
    the terms; under the ``sum`` objective the intercept then gives back the after-idle time, so the summed time of
    the logged steps stays the real one); ``False``: both kept at the base's values (the fit before these terms existed,
    ``calibrate --no-busy-timeline``).
    Returns ``{"terms": {name: {"value", "se", "rel_se", "status": "fitted" | "fixed at prior: <why>",
    "prior"}}, "hw": the profile (:func:`profile_from_terms`), "n_steps", "dropped_outliers", "rel_se_bound",
    "objective", "sum_shift_s" (the intercept's shift under ``sum``, s), "base_peaks" (the base's ``peak_flops`` and
    ``mem_bandwidth_bytes_per_s``),
    "residual_median_abs"}`` (the median absolute relative residual, whatever the objective).

    Raises:
        ValueError: fewer steps than terms, or an unknown ``objective``.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    cols = [j for j, t in enumerate(TERMS) if decode_start or t != "decode_start_s"]
    names = tuple(TERMS[j] for j in cols)
    if len(steps) < len(names) + 2:
        raise ValueError(f"{len(steps)} steps: too few to fit {len(names)} terms")
    X, off = design(steps, base, model)
    X = X[:, cols]
    y = steps.wall_s.to_numpy(float)
    prior = priors(base, model)
    keep = np.ones(len(y), bool)
    free = list(range(len(names)))
    fixed: dict[int, str] = {}
    # a column with no variation in the data (all zero) is fixed at once
    for j in range(1, len(names)):
        if not np.any(X[:, j]):
            fixed[j] = "no data (the column is 0 in every step)"
    dropped = 0
    for it in range(len(names) + 2):
        free = [j for j in range(len(names)) if j not in fixed]
        fixed_off = off + sum((prior[names[j]] * X[:, j] for j in fixed), np.zeros(len(y)))
        beta, se, res = _wls(X[keep][:, free], y[keep], fixed_off[keep], objective)
        if it == 0 and outlier_mads:
            med = np.median(res)
            mad = 1.4826 * np.median(np.abs(res - med))
            out = np.zeros(len(y), bool)
            out[np.flatnonzero(keep)[np.abs(res - med) > outlier_mads * max(mad, 1e-12)]] = True
            if out.any():
                keep &= ~out
                dropped = int(out.sum())
                beta, se, res = _wls(X[keep][:, free], y[keep], fixed_off[keep], objective)
        rel = np.where(beta > 0, se / np.maximum(np.abs(beta), 1e-300), math.inf)
        bad = [(rel[k], k) for k in range(len(free)) if not (beta[k] > 0 and rel[k] <= rel_se_bound)]
        if not bad:
            break
        _, k = max(bad)
        j = free[k]
        fixed[j] = (f"relative standard error {rel[k]:.0%} > {rel_se_bound:.0%}" if beta[k] > 0
                    else f"estimate {beta[k]:.3g} (SE {se[k]:.2g}) not positive")
    sum_shift = 0.0
    if objective == "sum" and 0 not in fixed:
        # the intercept's least-squares value over every step with the slopes kept: the summed time of all the
        # logged steps (outliers, i.e. stalls, included) is the real one
        k0 = free.index(0)
        model_all = fixed_off + X[:, free] @ beta
        sum_shift = float(np.mean(y - model_all))
        beta = beta.copy()
        beta[k0] += sum_shift
    terms = {}
    for j, name in enumerate(names):
        if j in fixed:
            terms[name] = {"value": prior[name], "se": math.nan, "rel_se": math.nan, "prior": prior[name],
                           "status": f"fixed at prior: {fixed[j]}"}
        else:
            k = free.index(j)
            terms[name] = {"value": float(beta[k]), "se": float(se[k]), "rel_se": float(se[k] / beta[k]),
                           "prior": prior[name], "status": "fitted"}
    if busy_timeline:
        wall_only = dataclasses.replace(base, between_step_s=0.0, after_idle_s=[])
        hw0 = profile_from_terms(wall_only, model, {k: v["value"] for k, v in terms.items()}, "")
        bt = fit_busy_timeline(steps, replay(steps, PerfModel(hw0, model)), rel_se_bound)
        if objective == "sum" and bt["after_idle_s"] and "fitted" == terms["step_overhead_s"]["status"]:
            extra = sum(PerfModel(dataclasses.replace(hw0, after_idle_s=bt["after_idle_s"]), model).after_idle(
                x if math.isfinite(x) else math.inf) for x in steps.idle_s.to_numpy(float))
            terms["step_overhead_s"]["value"] -= extra / len(y)
            sum_shift -= extra / len(y)
        terms.update(bt["terms"])
        base = dataclasses.replace(base, between_step_s=bt["between_step_s"], after_idle_s=bt["after_idle_s"])
    src = (f"fitted by harness.tools.calibrate --from-steps (per-step least squares, objective {objective}); "
           + "; ".join(f"{k} {v['status']}" for k, v in terms.items()))
    hw = profile_from_terms(base, model, {k: v["value"] for k, v in terms.items()}, src)
    rel_res = res if objective == "relative" else (res - sum_shift) / y[keep]
    return {"terms": terms, "hw": hw, "n_steps": int(keep.sum()), "dropped_outliers": dropped,
            "rel_se_bound": rel_se_bound, "objective": objective, "sum_shift_s": sum_shift,
            "base_peaks": {"peak_flops": base.peak_flops, "mem_bandwidth_bytes_per_s": base.mem_bandwidth_bytes_per_s},
            "residual_median_abs": float(np.median(np.abs(rel_res)))}


def fit_busy_timeline(steps: pd.DataFrame, model_s: np.ndarray, rel_se_bound: float = REL_SE_BOUND) -> dict:
    """The two costs of the busy timeline outside the logged steps' ``wall_s``, from the step log's own
    gaps (``idle_s``: a step's ``t0`` minus the previous step's ``t_end``):

    * ``between_step_s``: the engine core's time between ``update_from_output`` and the next ``schedule()``, the
      median of the gaps in [0, :data:`BUSY_GAP_S`] (the engine had work), with the median's standard error
      ``1.2533 sigma / sqrt(n)``;
    * ``after_idle_s``: per idle band (``harness.core.profiles.AFTER_IDLE_BANDS_S``), the mean residual ``wall -
      model_s`` of the steps after a gap in that band minus the busy steps' (gap <= :data:`BUSY_GAP_S`), with the
      standard error of the difference; fixed at 0 ("not fitted: ...") with fewer than 3 steps, a non-positive
      estimate or a relative standard error above ``rel_se_bound``; trailing unfitted bands dropped.

    ``model_s``: the step model's times of the steps without either term (s). Returns ``{"between_step_s",
    "after_idle_s" (list), "terms": {name: {"value", "se", "rel_se", "status", "n"}}}``."""
    gap = steps.idle_s.to_numpy(float)
    busy = np.isfinite(gap) & (gap >= 0) & (gap <= BUSY_GAP_S)
    terms: dict = {}
    g = gap[busy]
    if len(g) >= 3:
        bs = float(np.median(g))
        se = float(1.2533 * g.std(ddof=1) / math.sqrt(len(g)))
        terms["between_step_s"] = {"value": bs, "se": se, "rel_se": se / bs if bs > 0 else math.nan,
                                   "status": "fitted" if bs > 0 else "fixed at prior: median 0", "n": int(len(g))}
    else:
        bs = 0.0
        terms["between_step_s"] = {"value": 0.0, "se": math.nan, "rel_se": math.nan, "n": int(len(g)),
                                   "status": "fixed at prior: not fitted: fewer than 3 gaps <= 1 ms"}
    r = steps.wall_s.to_numpy(float) - np.asarray(model_s)
    rb = r[busy]
    edges = list(AFTER_IDLE_BANDS_S) + [math.inf]
    after = []
    gi = np.where(np.isfinite(gap), gap, math.inf)     # the first logged step: after the server's idle start
    for k in range(len(AFTER_IDLE_BANDS_S)):
        m = (gi >= edges[k]) & (gi < edges[k + 1])
        name = f"after_idle_s[{edges[k]:g}-{edges[k + 1]:g} s]"
        rk = r[m]
        if len(rk) < 3 or len(rb) < 3:
            terms[name] = {"value": 0.0, "se": math.nan, "rel_se": math.nan, "n": int(len(rk)),
                           "status": f"fixed at prior: not fitted: {len(rk)} steps after such a gap (< 3)"}
            after.append(0.0)
            continue
        v = float(rk.mean() - rb.mean())
        se = float(math.sqrt(rk.var(ddof=1) / len(rk) + rb.var(ddof=1) / len(rb)))
        rel = se / v if v > 0 else math.inf
        ok = v > 0 and rel <= rel_se_bound
        terms[name] = {"value": v if ok else 0.0, "se": se, "rel_se": rel if v > 0 else math.nan, "n": int(len(rk)),
                       "status": "fitted" if ok else (f"fixed at prior: not fitted: estimate {v:.3g} s not positive"
                                                      if v <= 0 else f"fixed at prior: not fitted: relative standard "
                                                      f"error {rel:.0%} > {rel_se_bound:.0%}"), "estimate": v}
        after.append(v if ok else 0.0)
    while after and after[-1] == 0.0:
        after.pop()
    return {"between_step_s": bs, "after_idle_s": after, "terms": terms}


def decode_start_excess(steps: pd.DataFrame, model_s: np.ndarray) -> dict:
    """Batch-1 decode steps that are a request's first decode step against the other batch-1 decode steps:
    the difference of their mean (real - model) times, s, with its standard error and the counts (a
    per-request decode-start cost the step model has no term for, when it persists)."""
    m = (steps.prefill_tokens == 0).to_numpy() & (steps.decode_seqs == 1).to_numpy()
    d = steps.wall_s.to_numpy() - model_s
    a, b = d[m & (steps.first_decodes > 0).to_numpy()], d[m & (steps.first_decodes == 0).to_numpy()]
    if len(a) < 2 or len(b) < 2:
        return {"excess_s": math.nan, "se_s": math.nan, "n_first": int(len(a)), "n_other": int(len(b))}
    return {"excess_s": float(a.mean() - b.mean()),
            "se_s": float(math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))),
            "n_first": int(len(a)), "n_other": int(len(b))}


BUSY_GAP_S = 1e-3        # a gap between two logged steps up to this long is the engine core's between-step work


def inflight_residual(steps: pd.DataFrame) -> float:
    """The mean time a request that reaches the engine core at a random instant waits for the step in flight to
    end (vLLM adds requests between steps), s: by renewal theory ``sum(c_i^2) / (2 T)`` over the engine's busy
    cycles ``c_i`` (a logged step's ``wall_s`` plus the gap after it when that gap is the between-step work, <=
    :data:`BUSY_GAP_S`), ``T`` the logged span (first ``t0`` to last ``t_end``; an idle gap's arrivals wait 0).
    Assumes arrivals independent of the step phase (a closed loop with tool times); NaN without steps."""
    if steps.empty:
        return math.nan
    out = 0.0
    span = 0.0
    for _, g in steps.groupby("instance"):
        g = g.sort_values("t0")
        gap_after = np.append(g.t0.to_numpy()[1:] - g.t_end.to_numpy()[:-1], 0.0)
        c = g.wall_s.to_numpy() + np.where((gap_after >= 0) & (gap_after <= BUSY_GAP_S), gap_after, 0.0)
        out += float((c ** 2).sum()) / 2
        span += float(g.t_end.max() - g.t0.min())
    return out / span if span > 0 else math.nan


def api_frontend(run_dir: Path, steps: Optional[pd.DataFrame] = None) -> dict:
    """The API front end on the server clock, per request: vLLM's TTFT (from the API server's arrival, to when the
    API server processes the first token) minus the engine's (``queued_ts`` to first token: queue + prefill), from
    the spans of ``server_metrics.json``: mean, median, standard error of the mean (s), n. That difference holds the
    API server's own work (in and out) AND the in-flight residual (a request reaching a busy engine core is queued
    only when the step in flight ends); with the run's ``steps`` (:func:`load_step_times`) the residual is estimated
    (:func:`inflight_residual`) and ``net_s`` = mean - residual (>= 0) is the API-server work alone, the value of
    ``HardwareConfig.api_frontend_s`` (the simulator adds the residual itself: counting it in the term too would
    count it twice)."""
    sm = evidence.server_metrics(run_dir)   # server_metrics.json, or its compressed form
    if sm is None:
        return {"n": 0}
    spans = (sm.get("spans") or {}).values()
    d = np.array([r["ttft_s"] - r["queue_s"] - r["prefill_s"] for r in spans
                  if all(isinstance(r.get(k), (int, float)) for k in ("ttft_s", "queue_s", "prefill_s"))])
    if len(d) < 2:
        return {"n": int(len(d))}
    out = {"n": int(len(d)), "mean_s": float(d.mean()), "median_s": float(np.median(d)),
           "se_s": float(d.std(ddof=1) / math.sqrt(len(d)))}
    if steps is not None:
        res = inflight_residual(steps)
        out["inflight_residual_s"] = res
        out["net_s"] = max(0.0, out["mean_s"] - res) if math.isfinite(res) else math.nan
    return out


def with_frontend(hw: HardwareConfig, frontend: dict) -> HardwareConfig:
    """``hw`` with ``api_frontend_s`` set to the fitted front end's ``net_s`` (:func:`api_frontend`), when there is
    one (a run with spans and a step log); else ``hw`` unchanged (0: no front end)."""
    v = frontend.get("net_s", math.nan)
    return dataclasses.replace(hw, api_frontend_s=float(v)) if isinstance(v, float) and math.isfinite(v) else hw


def _frac(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.1%}"


def _pct(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:+.1%}"


def markdown(result: dict) -> str:
    """The per-step report (``steps.md``)."""
    c = result["contention"]
    lines = [f"# Per-step fidelity: `{result['profile']}` vs {result['real_dir']}", "",
             f"- {result['n_steps']} logged steps (first {result['skip_steps']} per instance skipped); error = model / real - 1",
             f"- load average (1 min): {c['loadavg_1min']}; decode dispersion {c['decode_dispersion']:.1%} "
             f"({c['dispersion_steps']} steps); bounds {c['bounds']}",
             f"- decode-start excess (batch 1, first decode step vs others, real - model): "
             f"{result['decode_start']}",
             f"- slow-period figure (busy-time-weighted over step-weighted speed ratio of {SLOW_WINDOW_S:g} s windows "
             f"against the run's own in-sample fit; the protocol's bound {MAX_SLOW_PERIODS:.2f}): "
             f"{result.get('slow_periods', {}).get('figure', math.nan):.3f}", "",
             "| regime | steps | real median | model median | median error | median abs error | total error "
             "| real dispersion (IQR/median) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["regimes"]:
        if not r["n"]:
            continue
        lines.append(f"| {r['regime']} | {r['n']} | {r['real_median_s'] * 1e3:.2f} ms | {r['model_median_s'] * 1e3:.2f} ms"
                     f" | {_pct(r['median_err'])} | {r['median_abs_err']:.1%} | {_pct(r['total_err'])} | "
                     f"{_frac(r['real_dispersion'])} ({r['dispersion_steps']}) |")
    lines += ["", f"Target (on a quiet machine): median |error| <= 10 % in every regime with >= 50 steps: "
                  f"{'met' if result['target_met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def steps_report(real_dir: Path, profile_path: str, out_dir: Optional[Path] = None, skip_steps: int = 8,
                 max_load_per_cpu: float = MAX_LOAD_PER_CPU, max_dispersion: float = MAX_DISPERSION,
                 check: bool = True) -> dict:
    """``python -m harness.tools.fidelity steps``: replay every logged step of ``real_dir`` through the profile's
    step model and write ``steps.json`` / ``steps.md`` into ``out_dir`` (default ``<real_dir>/fidelity``).

    Raises:
        FileNotFoundError: no step-time log, no ``config.yaml``, no such profile.
        Contended: the run was contended (``check``; :func:`contention`).
    """
    from harness.core.recorder import write_json, write_text
    from harness.tools.inputs import load_profile, load_run_config
    real_dir = Path(real_dir)
    cfg = load_run_config(real_dir)
    hw = load_profile(profile_path)
    steps, meta = load_step_times(real_dir, skip_steps)
    if steps.empty:
        raise FileNotFoundError(f"{real_dir}: the step-time logs hold no step after the first {skip_steps}")
    cont = contention(real_dir, steps, meta, max_load_per_cpu, max_dispersion, check)
    model = ModelConfig(**cfg["model"])
    model_s = replay(steps, PerfModel(hw, model))
    table = regime_table(steps, model_s)
    met = all(abs(r["median_err"]) <= 0.10 for r in table if r["n"] >= 50)
    result = {"real_dir": str(real_dir), "profile": hw.name, "profile_path": str(profile_path),
              "n_steps": int(len(steps)), "skip_steps": skip_steps, "contention": cont, "regimes": table,
              "decode_start": decode_start_excess(steps, model_s), "api_frontend": api_frontend(real_dir, steps),
              "slow_periods": slow_period_figure(steps, hw, model),
              "target_met": bool(met)}
    out_dir = Path(out_dir) if out_dir is not None else real_dir / "fidelity"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(result, out_dir / "steps.json")
    write_text(markdown(result), out_dir / "steps.md")
    return result


def steps_main(argv) -> int:
    """CLI of ``python -m harness.tools.fidelity steps`` (exit 0: every regime with >= 50 steps within 10 %
    median error; 1: not; 2: bad input or a contended run, the message naming the figure and its bound)."""
    import sys

    from harness.core import cmdline
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.fidelity steps", description=steps_report.__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 every regime with >= 50 steps has median |error| <= 10 %; 1 not; "
                                       "2 bad input (a bound not finite or out of range, an invalid profile, a run "
                                       "without step logs), or a contended run (load average or step dispersion over "
                                       "its bound); 130 interrupted.")
    ap.add_argument("real_dir", type=Path, help="a backend=vllm run directory written with logger.steps=true")
    ap.add_argument("--profile", required=True, help="hardware profile: a YAML path or a conf/hardware/ name")
    ap.add_argument("--out", type=cmdline.writable(directory=True), default=None,
                    help="report directory (default <real_dir>/fidelity)")
    ap.add_argument("--skip-steps", type=cmdline.number(0, integer=True), default=8,
                    help="first steps per instance to drop (warm-up; >= 0)")
    ap.add_argument("--max-load-per-cpu", type=cmdline.number(0, lo_open=True), default=MAX_LOAD_PER_CPU,
                    help="bound of the 1-min load average per CPU (> 0)")
    ap.add_argument("--max-dispersion", type=cmdline.number(0, lo_open=True), default=MAX_DISPERSION,
                    help="bound of the decode-step IQR / median (> 0)")
    ap.add_argument("--no-check", action="store_true", help="report a contended run anyway (figures shown, not judged)")
    a = ap.parse_args(argv)
    from harness.tools.inputs import load_profile
    try:
        load_profile(a.profile)   # an invalid profile is bad input, named before the run is read
        r = steps_report(a.real_dir, a.profile, a.out, a.skip_steps, a.max_load_per_cpu, a.max_dispersion,
                         check=not a.no_check)
    except Contended as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(r))
    return 0 if r["target_met"] else 1


def steps_profile_yaml(fit: dict, run_dir: Path, base_name: str, contention_fig: dict, extra: dict) -> str:
    """The profile fitted by :func:`fit_steps` as a hardware YAML, its header stating every term's value, standard
    error and status (fitted, or fixed at its prior and why), the contention figures of the run, the
    decode-start excess and the API front-end figure (``extra``)."""
    from harness.tools.inputs import HW_FIELDS
    hw = fit["hw"]
    lines = [f"# {hw.name}: step-time coefficients fitted per step by `python -m harness.tools.calibrate --from-steps`",
             f"# to {run_dir} (objective {fit.get('objective', 'relative')}; {fit['n_steps']} steps, "
             f"{fit['dropped_outliers']} outliers dropped; "
             f"median |relative residual| {fit['residual_median_abs']:.1%}); other fields from conf/hardware/{base_name}.yaml.",
             f"# identification bound: relative standard error <= {fit['rel_se_bound']:.0%}, else fixed at the prior (the base's value)"]
    for k, v in fit["terms"].items():
        se = "" if not math.isfinite(v["se"]) else f" +- {v['se']:.3g} (rel. SE {v['rel_se']:.1%})"
        lines.append(f"#   {k}: {v['value']:.4g}{se}; {v['status']}")
    peaks = {"peak_flops": hw.peak_flops, "mem_bandwidth_bytes_per_s": hw.mem_bandwidth_bytes_per_s}
    if fit.get("base_peaks") and peaks != fit["base_peaks"]:
        lines.append(f"# an efficiency came out above 1 against the base's peaks {fit['base_peaks']}: the peaks are "
                     f"written as {peaks} (raised by the largest efficiency on each side; step times unchanged)")
    lines.append(f"# contention of the run: {json.dumps(contention_fig, default=str)}")
    for k, v in extra.items():
        what = ("api_frontend_s = its net_s: the API server's work net of the in-flight residual"
                if k == "api_frontend_ttft" and "net_s" in v else "not a term of the step model")
        lines.append(f"# {k} ({what}): {json.dumps(v)}")
    d = dataclasses.asdict(hw)
    for k in HW_FIELDS:
        v = d[k]
        lines.append(f"{k}: {json.dumps(v) if not isinstance(v, float) else repr(v)}")
    return "\n".join(lines) + "\n"
