"""Parse vLLM's Prometheus ``/metrics`` text into the numbers a policy may observe.

Metric names (vLLM V1, all prefixed ``vllm:``): ``kv_cache_usage_perc`` (a 0-1 fraction despite the
name), ``num_requests_running``, ``num_requests_waiting``, ``prefix_cache_queries_total``,
``prefix_cache_hits_total``, ``external_prefix_cache_hits_total``, ``num_preemptions_total``,
``time_to_first_token_seconds`` (histogram), and ``cache_config_info`` (labels ``num_gpu_blocks``,
``block_size``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+([^\s]+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Scrape:
    """One parsed scrape: ``values[name]`` sums samples over label sets (engines, models);
    ``labels[name]`` keeps the first sample's labels; ``buckets[name]`` maps ``le`` -> cumulative count
    for histogram ``_bucket`` series (summed over label sets)."""

    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    def get(self, name: str, default: float = math.nan) -> float:
        """Value of ``name`` (with or without the ``vllm:`` prefix)."""
        if name in self.values:
            return self.values[name]
        return self.values.get("vllm:" + name, default)


def parse_metrics(text: str) -> Scrape:
    """Parse Prometheus text exposition format (comments skipped, samples summed across labels)."""
    out = Scrape()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels_s, value_s = m.groups()
        try:
            value = float(value_s)
        except ValueError:
            continue
        labels = dict(_LABEL.findall(labels_s or ""))
        if name.endswith("_bucket") and "le" in labels:
            le = math.inf if labels["le"] in ("+Inf", "inf") else float(labels["le"])
            b = out.buckets.setdefault(name[: -len("_bucket")], {})
            b[le] = b.get(le, 0.0) + value
            continue
        out.values[name] = out.values.get(name, 0.0) + value
        out.labels.setdefault(name, labels)
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
