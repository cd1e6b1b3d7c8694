"""Export a harness run (or every run of a sweep) in the result formats of ``vllm bench serve`` and AIPerf,
so their readers and plot tools (``vllm bench sweep plot``, dashboards reading AIPerf exports) take our runs.

Usage::

    python -m harness.analysis.export RUN_DIR --format vllm-bench      # -> RUN_DIR/export/vllm-bench/
    python -m harness.analysis.export SWEEP_DIR --format aiperf --goodput 'ttft:200 tpot:50'

One request = one turn (``turns.parquet``). Times: our run clock (s from the run's start) -- the harness
records no wall-clock origin (a simulated run has none), so AIPerf's ``*_ns`` timestamps are run-clock ns and
its ``start_time`` / ``end_time`` are omitted.

**vllm-bench** (vLLM 0.32.0, ``vllm/benchmarks/serve.py``: ``benchmark`` builds the result dict,
``main`` adds the setup keys and ``--save-result`` writes it; ``--save-detailed`` keeps the per-request
arrays): ``<label>.json`` with ``date``, ``endpoint_type``, ``backend``, ``label``, ``model_id``,
``tokenizer_id``, ``num_prompts``, ``request_rate`` (the offered rate in vLLM's unit, requests/s,
:func:`offered_load`: vLLM's ``--request-rate``; the harness's conversations/s times the turns per conversation,
``"inf"`` for all-at-once and closed loads; with a ramp vLLM's ``ramp_up_*`` keys, converted the same way),
``burstiness``, ``max_concurrency``, ``duration`` (s),
``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``
(req/s), ``request_goodput`` (req/s or null), ``output_throughput``, ``total_token_throughput`` (tok/s),
``max_output_tokens_per_s``, ``max_concurrent_requests``, ``rtfx``, ``{mean,median,std,p<q>}_{ttft,tpot,itl,
e2el}_ms`` (ms), ``latencies`` (s), ``queue_times`` (s: the admission holds, :func:`admission_holds`; vLLM's
are its client's ``--max-concurrency`` semaphore waits, ``client_queue_time``), and with ``--detailed``
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (s lists), ``start_times`` (s), ``generated_texts``,
``errors``. The same dict,
with ``run_number`` and the harness's point keys, is written as a one-element list to ``summary.json``:
the file ``vllm bench sweep serve`` writes per parameter combination and ``vllm bench sweep plot``
globs (``vllm/benchmarks/sweep/serve.py``, ``sweep/plot.py``).

**aiperf** (aiperf 0.13.0, the release on PyPI): ``profile_export_aiperf.json`` (``JsonExportData`` of
``aiperf/common/models/export_models.py``, ``schema_version`` "1.4": one ``JsonMetricResult`` {unit, avg,
min, max, sum, p1, p5, p10, p25, p50, p75, p90, p95, p99, std, count} per record metric and {unit, avg} per
system metric, in display units; ``input_config``, a ``BenchmarkConfig`` of ``aiperf/config/config.py`` as
its ``MetricsJsonExporter`` dumps it: model, endpoint, dataset, the load shape as one profiling phase of
``aiperf/config/phases.py``, SLOs, :func:`aiperf_input_config`; ``run_info``, ``was_cancelled``,
``is_complete``, ``error_summary``), ``profile_export_aiperf.csv`` (``aiperf/exporters/metrics_csv_exporter.py``:
a request-metrics section ``Metric`` + ``STAT_KEYS`` of ``aiperf/common/constants.py`` and a
system-metrics section ``Metric,Value``, numbers with 2 decimals) and ``profile_export.jsonl``
(``MetricRecordInfo`` of ``aiperf/common/models/record_models.py``: ``metadata`` with the request's
timestamps, ``metrics`` {tag: {value, unit}}, ``error``), one line per request. What AIPerf's own loader
(``aiperf/plot/core/data_loader.py`` ``DataLoader.load_run``, behind ``aiperf plot``) reads of them:
tests/test_export_aiperf.py.

Field-by-field mapping to the harness's own: ``docs/metrics.md`` ("Exports").

**Partial runs** (``summary.json`` ``"partial": true``: the run failed or was interrupted, so its turns stop
early and its statistics may be biased or empty, e.g. ``mean_ttft_ms`` 0.0 with no completed turn) are
refused (:class:`PartialRun`, exit status 2, naming the run directory) unless ``allow_partial`` /
``--allow-partial``; then their exports are marked: ``"partial": true`` and ``"partial_error"`` (the run's
error) in both vllm-bench files and in ``profile_export_aiperf.json`` (beside AIPerf's own ``was_cancelled``,
true for them, ``is_complete`` false and ``incomplete_reason`` the error), and a warning names the run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from harness.analysis.goodput import good_turns, parse_goodput
from harness.core import cmdline
from harness.core.recorder import strict_json, write_json, write_text

FORMATS = ("vllm-bench", "aiperf")
AIPERF_STATS = ("avg", "min", "max", "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "std")


class ExportError(ValueError):
    """A run directory that cannot be exported (missing files), with the path named."""


class PartialRun(ExportError):
    """A partial run (``summary.json`` ``"partial": true``) exported without ``allow_partial``."""


def _partial_mark(summary: dict) -> dict:
    """The keys that mark the export of a partial run (module docstring); ``{}`` for a complete one."""
    if not summary.get("partial"):
        return {}
    return {"partial": True, "partial_error": str(summary.get("error") or "no error recorded")}


def _refuse_partial(run_dirs: Sequence[Path]) -> None:
    """Raise :class:`PartialRun` naming every partial run among ``run_dirs`` (checked before anything is written).

    Raises:
        PartialRun: one or more of them is partial.
    """
    from harness.analysis.validity import partial_run   # the rule calibrate refuses a partial run by
    bad = [f"{r} ({why})" for r in run_dirs if Path(r).is_dir() for why in [partial_run(r)] if why]
    if bad:
        raise PartialRun(f"partial run{'s' if len(bad) > 1 else ''} (summary.json \"partial\": true; the run failed or "
                         f"was interrupted, its statistics may be biased or empty): {'; '.join(bad)}; pass "
                         f"--allow-partial to export {'them' if len(bad) > 1 else 'it'} marked partial")


def _read_run(run_dir: Path) -> tuple[dict, pd.DataFrame, Optional[pd.DataFrame], dict]:
    s_p, t_p = run_dir / "summary.json", run_dir / "turns.parquet"
    if not s_p.is_file() or not t_p.is_file():
        raise ExportError(f"{run_dir}: not a run directory (needs summary.json and turns.parquet)")
    summary = json.loads(s_p.read_text())
    turns = pd.read_parquet(t_p).sort_values(["submit_s", "conversation_id", "turn"], kind="stable")
    tok_p = run_dir / "tokens.parquet"
    tokens = pd.read_parquet(tok_p) if tok_p.is_file() else None
    config = {}
    c_p = run_dir / "config.yaml"
    if c_p.is_file():
        from harness.core.yamlfile import read_yaml_container
        config = read_yaml_container(c_p, resolve=False)
    return summary, turns.reset_index(drop=True), tokens, config


def _token_gaps(turns: pd.DataFrame, tokens: Optional[pd.DataFrame]) -> Optional[list[list[float]]]:
    """Per turn (rows of ``turns``), the gaps between successive output tokens, s; None without
    ``tokens.parquet`` (``logger.steps=true``)."""
    if tokens is None:
        return None
    by = {k: np.diff(np.sort(g.t_s.to_numpy(dtype=float))).tolist()
          for k, g in tokens.groupby(["conversation_id", "turn"], sort=False)}
    return [by.get((c, t), []) if s == "ok" else [] for c, t, s in zip(turns.conversation_id, turns.turn, turns.status)]


def _stats_ms(v: np.ndarray, percentiles: Sequence[float], name: str) -> dict:
    """vLLM's ``mean/median/std/p<q>_<name>_ms`` (``np.mean(x or 0)`` etc.: 0 for an empty list)."""
    v = v[np.isfinite(v)] if len(v) else v
    x = v if len(v) else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(x)) * 1e3, f"median_{name}_ms": float(np.median(x)) * 1e3,
           f"std_{name}_ms": float(np.std(x)) * 1e3}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(x, p)) * 1e3
    return out


def _percentiles(config: dict, summary: dict) -> list[float]:
    ps = (config.get("logger") or {}).get("percentiles")
    return [float(p) for p in ps] if ps else [50.0, 90.0, 95.0, 99.0]


def vllm_bench_result(summary: dict, turns: pd.DataFrame, tokens: Optional[pd.DataFrame], config: dict,
                      goodput_ms: Optional[dict] = None, detailed: bool = True) -> dict:
    """The ``vllm bench serve --save-result`` dict of one run (module docstring; ms for the statistics, s for
    ``duration`` and the per-request arrays). ``goodput_ms``: thresholds for ``request_goodput``
    (default: the run's ``goodput_thresholds_ms``; null without any)."""
    ok = (turns.status == "ok").to_numpy()
    n = len(turns)
    window = float(summary.get("window_s") or math.nan)
    per_s = (lambda x: x / window) if window > 0 else (lambda x: math.nan)
    gp = goodput_ms if goodput_ms is not None else (summary.get("goodput_thresholds_ms") or {})
    out_lens = np.where(ok, turns.output_tokens.to_numpy(), 0).astype(int)
    in_lens = turns.prompt_tokens.to_numpy().astype(int)
    total_in, total_out = int(in_lens[ok].sum()), int(out_lens.sum())
    gaps = _token_gaps(turns, tokens)
    wl = config.get("workload") or {}
    convs = turns.conversation_id.nunique() if len(turns) else 0
    load = offered_load(summary, config, n / convs if convs else 1.0)
    res: dict[str, Any] = {
        "date": summary.get("date", ""),
        "endpoint_type": f"harness-{summary.get('backend', 'sim')}", "backend": f"harness-{summary.get('backend', 'sim')}",
        "label": summary.get("scheduler"), "model_id": summary.get("model"),
        "tokenizer_id": (config.get("model") or {}).get("hf_name") or summary.get("model"), "num_prompts": n,
        # vLLM's request_rate is its --request-rate, the offered rate (an input, not the achieved one), requests/s
        "request_rate": load["request_rate"], "burstiness": float(wl.get("burstiness", 1.0) or 1.0),
        "max_concurrency": wl.get("concurrency") if wl.get("arrival") == "closed" else wl.get("max_concurrency"),
        **{k: v for k, v in load.items() if k.startswith("ramp_up_")},
        "duration": window, "completed": int(ok.sum()), "failed": int((~ok).sum()),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(int(ok.sum())),
        "request_goodput": per_s(int(good_turns(turns, gp, "vllm").sum())) if gp else None,
        "output_throughput": per_s(total_out), "total_token_throughput": per_s(total_in + total_out),
    }
    if detailed:  # the arrays vLLM drops without --save-detailed
        res.update({
            "input_lens": in_lens.tolist(), "output_lens": out_lens.tolist(),
            "ttfts": np.where(ok, turns.ttft_s.to_numpy(dtype=float), 0.0).tolist(),
            "itls": gaps if gaps is not None else [[] for _ in range(n)],
            "start_times": turns.submit_s.to_numpy(dtype=float).tolist(),
            "generated_texts": [""] * n, "errors": ["" if s == "ok" else str(e) for s, e in zip(turns.status, turns.error)],
        })
    # kept by vLLM either way
    res["latencies"] = np.where(ok, turns.e2e_s.to_numpy(dtype=float), 0.0).tolist()
    res["queue_times"] = admission_holds(turns).tolist()
    res.update(_max_rates(turns, tokens))
    res["rtfx"] = 0.0
    ps = _percentiles(config, summary)
    okt = turns[ok]
    res.update(_stats_ms(okt.ttft_s.to_numpy(dtype=float), ps, "ttft"))
    tpot = okt.tpot_s.to_numpy(dtype=float)[okt.output_tokens.to_numpy() > 1]
    res.update(_stats_ms(tpot, ps, "tpot"))
    if gaps is not None:
        res.update(_stats_ms(np.asarray([g for row in gaps for g in row], dtype=float), ps, "itl"))
    else:  # the run's pooled ITL statistics (harness.analysis.validity.serving_metrics); no std without the gaps
        from harness.analysis.validity import pname
        res.update({"mean_itl_ms": _ms(summary.get("itl_mean_s")), "median_itl_ms": _ms(summary.get("itl_p50_s")),
                    "std_itl_ms": None})
        for p in ps:
            word = str(int(p)) if int(p) == p else str(p)
            res[f"p{word}_itl_ms"] = _ms(summary.get(f"itl_{pname(p)}_s"))
    res.update(_stats_ms(okt.e2e_s.to_numpy(dtype=float), ps, "e2el"))
    return res


# the arrivals whose gaps are drawn at a configured rate (harness.workload.workload, "Arrival processes")
RATED_ARRIVALS = ("poisson", "gamma", "constant")


def offered_load(summary: dict, config: dict, turns_per_conversation: float = 1.0) -> dict:
    """vLLM's traffic keys of one run: ``request_rate``, the offered rate as ``vllm bench serve`` writes its
    ``--request-rate`` (vLLM 0.32.0 ``vllm/benchmarks/serve.py`` ``main``: the number when finite, else the
    string ``"inf"``), and with a ramp vLLM's ``ramp_up_strategy``, ``ramp_up_start_rps``, ``ramp_up_end_rps``.

    Units: vLLM's rates are requests/s; the harness's (``workload.rate_per_s``) are conversations/s, each
    conversation bringing ``turns_per_conversation`` requests (the run's turns submitted / conversations; 1 for
    a single-turn workload), its later turns following their predecessor's finish. Every finite rate written
    here is the conversation rate times ``turns_per_conversation``: the offered requests/s over the run (a
    conversation's turns are not independent arrivals, so this is the long-run mean request rate, not a
    Poisson request process; ``summary.json``'s point keys keep ``workload_rate_per_s`` in conversations/s).

    ``request_rate``: ``workload.rate_per_s`` (converted) for a ``poisson`` / ``gamma`` / ``constant`` arrival
    without a ramp;
    ``"inf"`` for ``closed`` (every agent at once, as ``--request-rate inf --max-concurrency N``), ``fixed``
    (all at t = 0), ``trace`` (the trace's own timestamps: vLLM's self-timed replay leaves
    ``--request-rate`` at its default, inf) and a ramp (vLLM refuses ``--request-rate`` with
    ``--ramp-up-strategy``: the rate is the ramp's, from ``workload.ramp_start_rate_per_s`` to
    ``workload.rate_per_s``). Read from the run's ``config.yaml`` (``workload``), else from ``summary.json``
    (``workload_arrival``, ``workload_rate_per_s``; no ramp there)."""
    wl = config.get("workload") or {}
    arrival = wl.get("arrival", summary.get("workload_arrival", "poisson"))
    rate = _number(wl.get("rate_per_s"), summary.get("workload_rate_per_s"))
    ramp = wl.get("ramp")
    k = float(turns_per_conversation)
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"offered_load: turns_per_conversation must be a finite number > 0, got {turns_per_conversation!r}")
    per_req = (lambda r: r * k if r is not None else None)
    if ramp:
        return {"request_rate": "inf", "ramp_up_strategy": str(ramp),
                "ramp_up_start_rps": per_req(_number(wl.get("ramp_start_rate_per_s"))), "ramp_up_end_rps": per_req(rate)}
    if arrival in RATED_ARRIVALS and rate is not None and math.isfinite(rate):
        return {"request_rate": per_req(rate)}
    return {"request_rate": "inf"}


def _number(*vals: Any) -> Optional[float]:
    """The first of ``vals`` that is a number (a config value left as an interpolation string is skipped)."""
    for v in vals:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def admission_holds(turns: pd.DataFrame) -> np.ndarray:
    """Per turn (rows of ``turns``), s: how long the scheduler's admission held it, ``admit_s - submit_s``
    (``turns.parquet``'s ``queue_s``: from the turn's release by the replay -- its conversation's arrival or
    its predecessor's finish plus the tool time -- to the policy admitting it; 0 under admit-all policies);
    0.0 where ``admit_s`` is missing. Shape ``(len(turns),)``."""
    hold = turns.admit_s.to_numpy(dtype=float) - turns.submit_s.to_numpy(dtype=float)
    return np.where(np.isfinite(hold), np.maximum(hold, 0.0), 0.0)


def _ms(v: Any) -> Optional[float]:
    return None if v is None or not math.isfinite(float(v)) else float(v) * 1e3


def _max_rates(turns: pd.DataFrame, tokens: Optional[pd.DataFrame]) -> dict:
    """vLLM's ``max_output_tokens_per_s`` (most tokens in one 1-s bucket from the first start) and
    ``max_concurrent_requests`` (most requests active in one bucket); the first needs token times
    (``tokens.parquet``), else null."""
    ok = turns[turns.status == "ok"]
    if not len(ok):
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = float(ok.submit_s.min())
    nb = int(np.ceil(float(ok.finish_s.max()) - t0)) + 1
    conc = np.zeros(nb)
    for a, b in zip(ok.submit_s.to_numpy(dtype=float), ok.finish_s.to_numpy(dtype=float)):
        conc[int(a - t0): int(b - t0) + 1] += 1
    mx_tok = None
    if tokens is not None and len(tokens):
        keys = set(zip(ok.conversation_id, ok.turn))
        tt = tokens[[k in keys for k in zip(tokens.conversation_id, tokens.turn)]].t_s.to_numpy(dtype=float)
        b = (tt - t0).astype(int)
        b = b[(b >= 0) & (b < nb)]
        mx_tok = float(np.bincount(b, minlength=nb).max()) if len(b) else 0.0
    return {"max_output_tokens_per_s": mx_tok, "max_concurrent_requests": int(conc.max())}


# ---- AIPerf -------------------------------------------------------------------------------------------

AIPERF_VERSION = "0.13.0"      # the AIPerf release whose models the export follows (module docstring)
AIPERF_SCHEMA_VERSION = "1.4"  # aiperf 0.13.0 JsonExportData.SCHEMA_VERSION
# tag -> (header, display unit, turns column or None, scale to the display unit)
_AIPERF_RECORD = {
    "time_to_first_token": ("Time to First Token", "ms", "ttft_s", 1e3),
    "request_latency": ("Request Latency", "ms", "e2e_s", 1e3),
    "inter_token_latency": ("Inter Token Latency", "ms", "tpot_s", 1e3),
    "output_token_throughput_per_user": ("Output Token Throughput Per User", "tokens/sec/user", None, 1.0),
    "output_sequence_length": ("Output Sequence Length", "tokens", "output_tokens", 1.0),
    "input_sequence_length": ("Input Sequence Length", "tokens", "prompt_tokens", 1.0),
}
# our goodput keys (harness.analysis.goodput) -> AIPerf's metric tags, as its `slos` / --goodput name them
_AIPERF_SLO = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "e2el": "request_latency"}


def _aiperf_stats(v: np.ndarray, unit: str) -> dict:
    """AIPerf's ``JsonMetricResult`` of one record metric: ``avg, min, max, sum, p1 ... p99, std`` (``std``:
    numpy's population std, as AIPerf's ``MetricArray`` computes it) and ``count`` (the values behind it;
    aiperf 0.13.0 ``MetricResult.to_json_result`` keeps it for record metrics only). Token metrics keep
    integer ``min``, ``max``, ``sum``, as AIPerf's integer-valued records do."""
    v = v[np.isfinite(v)]
    if not len(v):
        return {"unit": unit}
    whole = unit == "tokens"
    num = (lambda x: int(round(x))) if whole else float
    out: dict[str, Any] = {"unit": unit, "avg": float(v.mean()), "min": num(v.min()), "max": num(v.max()),
                           "sum": num(v.sum())}
    for p in (1, 5, 10, 25, 50, 75, 90, 95, 99):
        out[f"p{p}"] = float(np.percentile(v, p))
    out["std"] = float(v.std())
    out["count"] = int(len(v))
    return out


def _record_values(turns: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per request (completed turns only; AIPerf computes record metrics on valid records), display units."""
    ok = turns[turns.status == "ok"]
    vals = {}
    for tag, (_, _, col, scale) in _AIPERF_RECORD.items():
        if col is None:
            continue
        v = ok[col].to_numpy(dtype=float) * scale
        if tag == "inter_token_latency":  # needs OSL >= 2 (no value otherwise)
            v = np.where(ok.output_tokens.to_numpy() >= 2, v, np.nan)
        vals[tag] = v
    itl_s = vals["inter_token_latency"] / 1e3
    with np.errstate(divide="ignore", invalid="ignore"):
        vals["output_token_throughput_per_user"] = np.where(itl_s > 0, 1.0 / itl_s, np.nan)
    return vals


def aiperf_load_phase(summary: dict, config: dict, sessions: int, requests: int) -> dict:
    """The run's load shape as AIPerf's profiling phase (aiperf 0.13.0 ``aiperf/config/phases.py``
    ``PhaseConfig``): ``closed`` -> ``concurrency`` with ``concurrency`` = ``workload.concurrency`` (agents);
    ``fixed`` (all at t = 0) -> ``concurrency`` with every conversation at once; ``poisson`` / ``constant`` ->
    that type with ``rate`` = ``workload.rate_per_s``; ``gamma`` -> ``gamma`` with ``smoothness`` (AIPerf's
    Gamma shape) = ``1 / workload.burstiness**2`` (our shape, harness.workload.workload); ``trace`` ->
    ``fixed_schedule``. ``workload.max_concurrency`` -> ``concurrency`` (AIPerf: a cap on a rate phase),
    ``workload.duration_s`` -> ``duration`` (s); ``sessions`` = the conversations replayed and ``requests`` =
    the turns submitted (AIPerf's stop conditions; each left out when 0). A ramp is not expressed (AIPerf's ``rate_ramp`` ramps over a duration, ours over the
    conversations' index): ``rate`` is then the ramp's end rate. Concurrency counts conversations here;
    AIPerf's counts in-flight requests (the same for single-turn workloads)."""
    wl = config.get("workload") or {}
    arrival = wl.get("arrival", summary.get("workload_arrival", "poisson"))
    rate = _number(wl.get("rate_per_s"), summary.get("workload_rate_per_s"))
    phase: dict[str, Any] = {"name": "profiling", "kind": "profiling"}
    if arrival == "closed":
        phase.update(type="concurrency", concurrency=int(wl.get("concurrency") or 1))
    elif arrival == "fixed":
        phase.update(type="concurrency", concurrency=max(1, int(sessions)))
    elif arrival == "trace":
        phase.update(type="fixed_schedule")
    elif arrival in RATED_ARRIVALS and rate is not None and rate > 0:
        phase.update(type=arrival, rate=rate)
        burst = _number(wl.get("burstiness"))
        if arrival == "gamma" and burst:
            phase["smoothness"] = 1.0 / burst ** 2
    else:
        raise ExportError(f"workload.arrival={arrival!r} with rate_per_s={rate!r}: no AIPerf load phase for it")
    cap = wl.get("max_concurrency")
    if arrival != "closed" and isinstance(cap, int) and cap >= 1:
        phase["concurrency"] = cap
    if requests >= 1:
        phase["requests"] = int(requests)
    if sessions >= 1:
        phase["sessions"] = int(sessions)
    dur = _number(wl.get("duration_s"))
    if dur and dur > 0:
        phase["duration"] = dur
    return phase


def aiperf_input_config(summary: dict, config: dict, sessions: int, requests: int, goodput_ms: dict) -> dict:
    """AIPerf's ``input_config`` (aiperf 0.13.0 ``aiperf/config/config.py`` ``BenchmarkConfig``, as its
    ``MetricsJsonExporter`` dumps it: set fields only) of one run: ``models`` (``model.hf_name``, else the
    summary's model), ``endpoint`` (``backend.endpoints`` where the run used running servers, else
    ``http://<backend>.invalid/<cluster>``: AIPerf requires an http URL and the harness does not record the
    addresses of servers it launched, nor has a simulated run any -- ``.invalid`` never resolves, RFC 2606;
    type ``completions``, streaming: the harness's ``/v1/completions`` stream), ``datasets`` (``synthetic``,
    or the trace file as a ``multi_turn`` file -- the harness's trace format, which AIPerf cannot replay),
    ``phases`` (:func:`aiperf_load_phase`), ``slos`` (the goodput thresholds, ms, under AIPerf's tags) and
    ``tokenizer`` (``{}``, as AIPerf writes it by default)."""
    wl = config.get("workload") or {}
    model = (config.get("model") or {}).get("hf_name") or summary.get("model") or "unknown"
    backend = config.get("backend") or {}
    urls = [str(u) for u in (backend.get("endpoints") or [])]
    if not urls:
        cluster = (config.get("cluster") or {}).get("name") or summary.get("cluster") or "cluster"
        urls = [f"http://{summary.get('backend') or backend.get('name') or 'sim'}.invalid/{cluster}"]
    if wl.get("kind", "trace") == "synthetic":
        dataset: dict[str, Any] = {"name": "default", "type": "synthetic"}
    else:
        dataset = {"name": "default", "type": "file", "path": str(wl.get("trace") or summary.get("workload") or ""),
                   "format": "multi_turn"}
        if isinstance(wl.get("num_conversations"), int) and wl["num_conversations"] >= 1:
            dataset["entries"] = wl["num_conversations"]
    seed = wl.get("seed") if isinstance(wl.get("seed"), int) else config.get("seed", summary.get("seed"))
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        dataset["random_seed"] = seed
    cfg: dict[str, Any] = {"models": {"items": [{"name": str(model)}]},
                           "endpoint": {"urls": urls, "type": "completions", "streaming": True},
                           "datasets": [dataset], "phases": [aiperf_load_phase(summary, config, sessions, requests)]}
    if goodput_ms:
        cfg["slos"] = {_AIPERF_SLO[k]: float(v) for k, v in goodput_ms.items()}
    cfg["tokenizer"] = {}
    return cfg


def aiperf_export(summary: dict, turns: pd.DataFrame, goodput_ms: Optional[dict] = None,
                  config: Optional[dict] = None, run_name: str = "") -> tuple[dict, str, str]:
    """``(profile_export_aiperf.json dict, profile_export_aiperf.csv text, profile_export.jsonl text)`` of one
    run (module docstring). ``goodput_ms``: thresholds for ``goodput`` / ``good_request_count`` (default:
    the run's; omitted without any). ``config``: the run's ``config.yaml`` (``input_config``'s model,
    endpoint and load shape; without it the summary's model, arrival and rate). ``run_name``: the run
    directory's name (``run_info.run_label``).

    Raises:
        ExportError: a load shape AIPerf has no phase for (:func:`aiperf_load_phase`).
    """
    config = config or {}
    ok = turns.status == "ok"
    window = float(summary.get("window_s") or math.nan)
    vals = _record_values(turns)
    gp = goodput_ms if goodput_ms is not None else (summary.get("goodput_thresholds_ms") or {})
    data: dict[str, Any] = {"schema_version": AIPERF_SCHEMA_VERSION}
    for tag, (_, unit, _, _) in _AIPERF_RECORD.items():
        data[tag] = _aiperf_stats(vals[tag], unit)
    n_ok, osl = int(ok.sum()), int(turns.output_tokens[ok].sum())
    isl = int(turns.prompt_tokens[ok].sum())
    system = {
        "request_throughput": ("Request Throughput", "requests/sec", n_ok / window if window > 0 else math.nan),
        "output_token_throughput": ("Output Token Throughput", "tokens/sec", osl / window if window > 0 else math.nan),
        "request_count": ("Request Count", "requests", n_ok),
        "error_request_count": ("Error Request Count", "requests", int((~ok).sum())),
        "benchmark_duration": ("Benchmark Duration", "sec", window),
        "total_output_tokens": ("Total Output Tokens", "tokens", osl),
        "total_osl": ("Total Output Sequence Length", "tokens", osl),
        "total_isl": ("Total Input Sequence Length", "tokens", isl),
    }
    if gp:
        good = int(good_turns(turns, gp, "aiperf").sum())
        system["good_request_count"] = ("Good Request Count", "requests", good)
        system["goodput"] = ("Goodput", "requests/sec", good / window if window > 0 else math.nan)
    for tag, (_, unit, v) in system.items():
        data[tag] = {"unit": unit, "avg": v}
    errs: dict[str, int] = {}
    for e in turns.error[~ok]:
        errs[str(e)] = errs.get(str(e), 0) + 1
    sessions = int(turns.conversation_id.nunique())
    data["input_config"] = aiperf_input_config(summary, config, sessions, len(turns), gp)
    seed = config.get("seed", summary.get("seed"))
    data["run_info"] = {k: v for k, v in (("random_seed", seed if isinstance(seed, int) and seed >= 0 else None),
                                           ("run_label", run_name or None)) if v is not None}
    data["was_cancelled"] = bool(summary.get("partial"))
    data["is_complete"] = not summary.get("partial")
    if summary.get("partial"):
        data["incomplete_reason"] = str(summary.get("error") or "partial run")
    data["error_summary"] = [{"error_details": {"code": None, "type": m.split(":")[0][:40] or None, "message": m},
                              "count": c} for m, c in sorted(errs.items())]
    data = strict_json(data)
    # CSV (aiperf 0.13.0 exporters/metrics_csv_exporter.py): request metrics (those with percentiles) sorted by
    # tag under "Metric" + STAT_KEYS, a blank row, then system metrics under "Metric,Value"
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["Metric", *AIPERF_STATS])
    fmt = (lambda v: "" if v is None else (f"{int(v)}" if isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                           else f"{float(v):.2f}"))
    for tag in sorted(_AIPERF_RECORD):
        header, unit = _AIPERF_RECORD[tag][:2]
        w.writerow([f"{header} ({unit})" if unit not in ("count", "requests") else header,
                    *(fmt(data[tag].get(k)) for k in AIPERF_STATS)])
    w.writerow([])
    w.writerow(["Metric", "Value"])
    for tag in sorted(system):
        header, unit, _ = system[tag]
        w.writerow([f"{header} ({unit})" if unit not in ("count", "requests") else header, fmt(data[tag].get("avg"))])
    # JSONL (MetricRecordInfo): every request, its metrics in display units, its run-clock timestamps (ns)
    lines = []
    conv_index = {c: i for i, c in enumerate(dict.fromkeys(turns.conversation_id))}
    okv = ok.to_numpy()
    pos = np.cumsum(okv) - 1
    for i, r in enumerate(turns.itertuples(index=False)):
        metrics = {}
        if okv[i]:
            for tag, (_, unit, _, _) in _AIPERF_RECORD.items():
                v = vals[tag][pos[i]]
                if np.isfinite(v):
                    metrics[tag] = {"value": int(v) if unit == "tokens" else float(v), "unit": unit}
        end = r.finish_s if np.isfinite(r.finish_s) else r.submit_s
        start_ns = int(round(r.submit_s * 1e9))
        rec = {"metadata": {"session_num": conv_index[r.conversation_id], "x_request_id": f"{r.conversation_id}:{r.turn}",
                            "x_correlation_id": str(r.conversation_id), "conversation_id": str(r.conversation_id),
                            "turn_index": int(r.turn), "credit_issued_ns": start_ns, "request_start_ns": start_ns,
                            "request_ack_ns": None, "request_end_ns": int(round(end * 1e9)),
                            "worker_id": "harness", "record_processor_id": "harness",
                            "benchmark_phase": "profiling", "phase_index": 0, "profiling_index": 0,
                            "phase_name": "profiling", "phase_kind": "profiling",
                            "was_cancelled": False, "cancellation_time_ns": None},
               "metrics": metrics,
               "error": None if okv[i] else {"code": None, "type": str(r.error).split(":")[0][:40] or None,
                                             "message": str(r.error)}}
        lines.append(json.dumps(rec, allow_nan=False))
    return data, buf.getvalue(), "\n".join(lines) + ("\n" if lines else "")


# ---- runs and sweeps ----------------------------------------------------------------------------------

def _point_keys(summary: dict) -> dict:
    return {k: summary.get(k) for k in ("scheduler", "cluster", "model", "workload", "workload_rate_per_s",
                                        "workload_arrival", "seed") if k in summary}


def export_run(run_dir: Path, fmt: str, out: Path, goodput: Any = None, detailed: bool = True,
               allow_partial: bool = False) -> list[Path]:
    """Write ``run_dir``'s export in ``fmt`` (``vllm-bench`` | ``aiperf``) under ``out``; returns the files.
    A partial run is refused unless ``allow_partial``, and then its export is marked (module docstring).

    Raises:
        ExportError: ``run_dir`` is not a run directory, or ``fmt`` is unknown.
        PartialRun: ``run_dir`` is a partial run and ``allow_partial`` is false.
        ValueError: ``goodput`` is malformed (``harness.analysis.goodput.parse_goodput``).
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not allow_partial:
        _refuse_partial([Path(run_dir)])
    summary, turns, tokens, config = _read_run(Path(run_dir))
    mark = _partial_mark(summary)
    if mark:
        print(f"warning: {run_dir} is a partial run ({mark['partial_error']}); its export is marked "
              f"\"partial\": true", file=sys.stderr)
    gp = parse_goodput(goodput, "--goodput") if goodput is not None else None
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "vllm-bench":
        # vLLM's "date" is when the benchmark ended ("%Y%m%d-%H%M%S"): our summary.json's write time
        date = datetime.fromtimestamp((Path(run_dir) / "summary.json").stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        res = {**vllm_bench_result({**summary, "date": date}, turns, tokens, config, gp, detailed), **mark}
        label = str(res.get("label") or "run")
        write_json(res, out / f"{label}.json")
        write_json([{**res, "run_number": 0, **_point_keys(summary)}], out / "summary.json")
        return [out / f"{label}.json", out / "summary.json"]
    data, csv_text, jsonl = aiperf_export(summary, turns, gp, config, Path(run_dir).name)
    write_json({**data, **mark}, out / "profile_export_aiperf.json")
    write_text(csv_text, out / "profile_export_aiperf.csv")
    write_text(jsonl, out / "profile_export.jsonl")
    return [out / "profile_export_aiperf.json", out / "profile_export_aiperf.csv", out / "profile_export.jsonl"]


def export(path: Path, fmt: str, out: Optional[Path] = None, goodput: Any = None, detailed: bool = True,
           allow_partial: bool = False) -> list[Path]:
    """Export a run directory, or every run directory under a sweep directory (each into
    ``<out>/<run dir name>/``). ``out`` defaults to ``<path>/export/<fmt>``. Partial runs: refused (all of
    them named, before anything is written) unless ``allow_partial``, then marked (module docstring).

    Raises:
        ExportError: nothing to export under ``path``.
        PartialRun: a partial run among them and ``allow_partial`` false.
    """
    path = Path(path)
    out = Path(out) if out else path / "export" / fmt
    if (path / "summary.json").is_file():
        return export_run(path, fmt, out, goodput, detailed, allow_partial)
    runs = sorted(p.parent for p in path.glob("*/summary.json") if (p.parent / "turns.parquet").is_file())
    if not runs:
        raise ExportError(f"{path}: neither a run directory nor a sweep directory holding run directories")
    if not allow_partial:
        _refuse_partial(runs)
    files: list[Path] = []
    for r in runs:
        files += export_run(r, fmt, out / r.name, goodput, detailed, allow_partial=True)
    return files


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = cmdline.ArgumentParser(prog="python -m harness.analysis.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="a run directory, or a sweep directory of run directories")
    ap.add_argument("--format", required=True, choices=FORMATS, help="the peer tool's result format")
    ap.add_argument("--out", type=cmdline.writable(directory=True), default=None,
                    help="output directory (default: PATH/export/FORMAT)")
    ap.add_argument("--goodput", default=None,
                    help="goodput thresholds, ms, as vLLM/AIPerf take them ('ttft:200 tpot:50 e2el:2000'); "
                         "default: the run's slo.goodput")
    ap.add_argument("--no-detailed", action="store_true",
                    help="vllm-bench: leave out the per-request arrays (as without --save-detailed)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="export partial runs (summary.json \"partial\": true: failed or interrupted), marked "
                         "\"partial\": true in the export; else refused")
    ap.epilog = ("Exit status: 0 exported; 2 bad input: not a run or sweep directory, malformed --goodput, an --out "
                 "that cannot be written, or a partial run without --allow-partial (nothing is written then); 130 "
                 "interrupted.")
    args = ap.parse_args(argv)
    try:
        files = export(args.path, args.format, args.out, args.goodput, not args.no_detailed, args.allow_partial)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
