"""Per-request (per-turn) goodput with the semantics of ``vllm bench serve --goodput`` and AIPerf ``--goodput``.

A request is one turn. A turn is *good* when it completed and meets **every** given threshold:
``TTFT <= ttft``, ``TPOT <= tpot``, ``E2E <= e2el`` (thresholds in ms, as both tools take them on the
command line). Goodput = good turns / the measured window (first arrival to last finish, s), requests/s.

Sources (read from their code, not their docs):

* vLLM 0.32.0, ``vllm/benchmarks/serve.py``: ``calculate_metrics`` counts a request good when
  ``all(slo >= value)`` over the chosen metrics among the *successful* requests (a failed request is never
  good); a request with ``output_len <= 1`` has TPOT = 0 "for goodput" (so it passes any TPOT threshold);
  ``request_goodput = good_completed / dur_s`` with ``dur_s`` the benchmark's wall time (first dispatch to
  the last request's end). Keys: ``ttft``, ``tpot``, ``e2el``; ``--goodput "ttft:200 tpot:50"``.
* AIPerf (github ai-dynamo/aiperf @ db4f639, ``aiperf/metrics/types/good_request_count_metric.py``,
  ``goodput_metric.py``, ``inter_token_latency_metric.py``, ``benchmark_duration_metric.py``): a record
  is good when every threshold holds (``value <= threshold`` for latencies); a record without the metric's
  value is *not* good -- its ``inter_token_latency`` = (request_latency - TTFT) / (OSL - 1) has no value
  for OSL < 2, so a 1-token response fails an ITL threshold; goodput = good_request_count /
  benchmark_duration, the duration from the first request to the last response. Tags:
  ``time_to_first_token``, ``inter_token_latency``, ``request_latency``.

The two differ only on 1-token outputs under a TPOT threshold, so both are reported
(``request_goodput_per_s`` with vLLM's rule, ``request_goodput_aiperf_per_s`` with AIPerf's). The window is
the harness's measured window (``summary.json`` ``window_s``), which is AIPerf's benchmark duration and,
up to the client's start-up before the first request, vLLM's ``duration``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd

# accepted names -> canonical (vLLM's keys); AIPerf's tags are aliases
GOODPUT_KEYS: dict[str, str] = {
    "ttft": "ttft", "tpot": "tpot", "e2el": "e2el",
    "time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2el",
}
# canonical key -> the turns.parquet column it reads (s)
_COLUMN = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}


def parse_goodput(spec: Any, where: str = "slo.goodput") -> dict[str, float]:
    """Goodput thresholds from ``spec``: None / ``""`` / ``{}`` (no per-request goodput), a string of
    ``KEY:VALUE`` pairs separated by spaces or commas (``"ttft:200 tpot:50 e2el:2000"``, the form of vLLM's
    and AIPerf's ``--goodput``), or a mapping ``{ttft: 200, ...}``. Keys: ``ttft``, ``tpot``, ``e2el`` or
    AIPerf's ``time_to_first_token``, ``inter_token_latency``, ``request_latency``. Values: ms, > 0.

    Returns ``{canonical key: threshold ms}`` in the order ttft, tpot, e2el.

    Raises:
        ValueError: naming ``where`` for an unknown key, a repeated key, or a value that is not a number > 0.
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return {}
    if isinstance(spec, str):
        pairs = []
        for item in spec.replace(",", " ").split():
            key, sep, val = item.partition(":")
            if not sep:
                raise ValueError(f'{where}: {item!r} is not KEY:VALUE (e.g. "ttft:200 tpot:50 e2el:2000", ms)')
            pairs.append((key.strip(), val.strip()))
    elif isinstance(spec, Mapping):
        pairs = [(str(k), v) for k, v in spec.items()]
    else:
        raise ValueError(f"{where} must be a string of KEY:VALUE pairs or a mapping, got {spec!r}")
    out: dict[str, float] = {}
    for key, val in pairs:
        canon = GOODPUT_KEYS.get(key.lower())
        if canon is None:
            raise ValueError(f"{where}: unknown goodput key {key!r} (allowed: {', '.join(GOODPUT_KEYS)})")
        if canon in out:
            raise ValueError(f"{where}: {key!r} given twice")
        try:
            v = float(val)
        except (TypeError, ValueError):
            raise ValueError(f"{where}.{key} must be a number of ms, got {val!r}") from None
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{where}.{key} must be > 0 (ms), got {val!r}")
        out[canon] = v
    return {k: out[k] for k in ("ttft", "tpot", "e2el") if k in out}


def good_turns(turns: pd.DataFrame, thresholds_ms: Mapping[str, float], one_token_tpot: str = "vllm") -> np.ndarray:
    """Boolean mask over the rows of ``turns`` (``turns.parquet``): completed (``status == "ok"``) and every
    threshold met. ``one_token_tpot``: ``vllm`` (a 1-token turn's TPOT is 0: it passes) or ``aiperf`` (it has
    no ITL value: it fails a TPOT threshold). A NaN TTFT or E2E fails its threshold. Shape ``(len(turns),)``.

    Raises:
        ValueError: ``one_token_tpot`` is neither ``vllm`` nor ``aiperf``.
    """
    if one_token_tpot not in ("vllm", "aiperf"):
        raise ValueError(f"one_token_tpot must be 'vllm' or 'aiperf', got {one_token_tpot!r}")
    n = len(turns)
    if not n:
        return np.zeros(0, dtype=bool)
    ok = (turns.status == "ok").to_numpy().copy()
    for key, ms in thresholds_ms.items():
        v = turns[_COLUMN[key]].to_numpy(dtype=float)
        if key == "tpot":
            one = turns.output_tokens.to_numpy() <= 1
            v = np.where(one, 0.0 if one_token_tpot == "vllm" else np.nan, v)
        with np.errstate(invalid="ignore"):
            ok &= v <= ms / 1e3  # NaN compares False
    return ok


def goodput_summary(turns: pd.DataFrame, thresholds_ms: Mapping[str, float], window_s: float) -> dict:
    """The per-request goodput keys of ``summary.json`` (empty without thresholds):

    ``goodput_thresholds_ms`` (the canonical thresholds, ms), ``good_request_count`` and
    ``good_request_frac`` (good turns / all turns submitted, every status), ``request_goodput_per_s``
    (vLLM's rule, requests/s over ``window_s``), ``good_request_count_aiperf``,
    ``request_goodput_aiperf_per_s`` (AIPerf's rule). NaN rates when ``window_s <= 0``.
    """
    if not thresholds_ms:
        return {}
    good_v = int(good_turns(turns, thresholds_ms, "vllm").sum())
    good_a = int(good_turns(turns, thresholds_ms, "aiperf").sum())
    rate = (lambda x: x / window_s) if window_s > 0 else (lambda x: math.nan)
    return {"goodput_thresholds_ms": dict(thresholds_ms), "good_request_count": good_v,
            "good_request_frac": good_v / len(turns) if len(turns) else math.nan,
            "request_goodput_per_s": rate(good_v),
            "good_request_count_aiperf": good_a, "request_goodput_aiperf_per_s": rate(good_a)}


def threshold_label(thresholds_ms: Optional[Mapping[str, float]]) -> str:
    """``"ttft:200 tpot:50"``: the thresholds in the ``--goodput`` form (``""`` without any)."""
    return " ".join(f"{k}:{v:g}" for k, v in (thresholds_ms or {}).items())
