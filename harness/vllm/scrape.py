"""Parse vLLM's Prometheus ``/metrics`` text into the numbers a policy may observe.

Metric names (vLLM V1, all prefixed ``vllm:``): ``kv_cache_usage_perc`` (a 0-1 fraction despite the
name), ``num_requests_running``, ``num_requests_waiting``, ``prefix_cache_queries_total``,
``prefix_cache_hits_total``, ``external_prefix_cache_hits_total``, ``num_preemptions_total``,
``time_to_first_token_seconds`` (histogram), and ``cache_config_info`` (labels ``num_gpu_blocks``,
``block_size``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Gauges that are fractions per engine: averaged over label sets (engines), never summed.
FRACTION_GAUGES = frozenset({"vllm:kv_cache_usage_perc"})


@dataclass
class Scrape:
    """One parsed scrape: ``values[name]`` sums samples over label sets (engines, models), except the
    fraction gauges (``FRACTION_GAUGES``), which are averaged; ``labels[name]`` keeps the first sample's
    labels. Histogram samples keep their ``_sum`` / ``_count`` names (buckets are not kept)."""

    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, name: str, default: float = math.nan) -> float:
        """Value of ``name`` (with or without the ``vllm:`` prefix)."""
        if name in self.values:
            return self.values[name]
        return self.values.get("vllm:" + name, default)


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text exposition format with ``prometheus_client``'s parser (so label values
    holding ``}`` or escaped quotes parse right); samples are summed across label sets, fraction gauges
    averaged.

    Raises:
        ValueError: the text is not valid exposition format.
    """
    out = Scrape()
    counts: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            name = smp.name
            if name.endswith("_bucket") or name.endswith("_created"):
                continue
            # the parser strips a counter's ``_total``; the sample name keeps it
            out.values[name] = out.values.get(name, 0.0) + float(smp.value)
            counts[name] = counts.get(name, 0) + 1
            out.labels.setdefault(name, dict(smp.labels))
    for name in FRACTION_GAUGES & out.values.keys():
        out.values[name] /= counts[name]
    return out


def kv_capacity_tokens(s: Scrape) -> int:
    """KV capacity from ``vllm:cache_config_info`` labels (num_gpu_blocks x block_size), tokens.

    Raises:
        ValueError: if the labels are missing.
    """
    lab = s.labels.get("vllm:cache_config_info", {})
    try:
        return int(lab["num_gpu_blocks"]) * int(lab["block_size"])
    except (KeyError, ValueError):
        raise ValueError("vllm:cache_config_info with num_gpu_blocks and block_size not found in /metrics") from None


def histogram_mean(s: Scrape, name: str) -> tuple[float, float]:
    """``(sum, count)`` of a histogram (e.g. ``vllm:time_to_first_token_seconds``)."""
    return s.get(name + "_sum", math.nan), s.get(name + "_count", math.nan)


# The histograms ``server_metrics.json`` keeps (``logger.steps``): per engine step (iteration tokens) and
# per request (prefill, decode, queue, inference time; TTFT, ITL, E2E), all clocked inside vLLM's engine.
STEP_HISTOGRAMS = ("vllm:iteration_tokens_total", "vllm:request_prefill_time_seconds",
                   "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds",
                   "vllm:request_inference_time_seconds", "vllm:time_to_first_token_seconds",
                   "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                   "vllm:request_prefill_kv_computed_tokens")


# Per-request histograms (one observation per finished request): what ``finish_scrapes`` keeps.
REQUEST_HISTOGRAMS = ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens",
                      "vllm:request_generation_tokens", "vllm:request_prefill_kv_computed_tokens")


def parse_histograms(text: str, names=STEP_HISTOGRAMS) -> dict[str, dict]:
    """The histograms ``names`` of a ``/metrics`` text, summed over label sets (engines):
    ``{name: {"le": [upper bounds], "cumulative": [counts], "sum": float, "count": float}}`` (the units are
    the metric's: s for ``*_seconds``, tokens otherwise; ``le`` ends with ``inf``). Missing ones are absent.

    Raises:
        ValueError: the text is not valid exposition format.
    """
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in names and fam.name + "_total" not in names:
            continue
        name = fam.name if fam.name in names else fam.name + "_total"
        h = out.setdefault(name, {"le": [], "cumulative": [], "sum": 0.0, "count": 0.0})
        buckets: dict[float, float] = dict(zip(h["le"], h["cumulative"]))
        for smp in fam.samples:
            if smp.name.endswith("_bucket"):
                le = float(smp.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + float(smp.value)
            elif smp.name.endswith("_sum"):
                h["sum"] += float(smp.value)
            elif smp.name.endswith("_count"):
                h["count"] += float(smp.value)
        h["le"] = sorted(buckets)
        h["cumulative"] = [buckets[k] for k in h["le"]]
    return out


def histogram_delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """``after - before`` of two :func:`parse_histograms` results (what accrued in between), with the mean
    (``sum / count``, NaN for no observation) of each; histograms absent before count from zero."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {"le": a["le"], "cumulative": [0.0] * len(a["le"]), "sum": 0.0, "count": 0.0})
        prev = dict(zip(b["le"], b["cumulative"]))
        cum = [c - prev.get(le, 0.0) for le, c in zip(a["le"], a["cumulative"])]
        n = a["count"] - b["count"]
        s = a["sum"] - b["sum"]
        out[name] = {"le": a["le"], "cumulative": cum, "sum": s, "count": n, "mean": s / n if n > 0 else math.nan}
    return out
