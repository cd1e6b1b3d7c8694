"""The metric catalog: one entry per headline metric of ``summary.json``, with its label, unit, format
and a description. The printed run table, the sweep ``comparison.md`` (``harness.run.callbacks``), the
sweep report (``harness.analysis.report``: tables and figure axes) and the README tables all read it, so a metric
is named, scaled and rounded the same way everywhere. Definitions: ``harness.analysis.metrics`` and
``docs/metrics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Metric:
    """One summary metric.

    key: the ``summary.json`` key (its unit suffix: ``_s`` seconds, ``_j`` joules, ...);
    label: the short table label, with the unit it is *shown* in; scale, per: the shown value is
    ``value * scale / per`` (e.g. scale 1e3 for s -> ms, per 1e3 for J -> kJ); digits: decimals shown; axis: a longer label for figure
    axes and report headers; log_y: plotted on a log axis when it spans decades.
    """

    key: str
    label: str
    digits: int
    scale: float = 1.0
    per: float = 1.0
    axis: str = ""
    log_y: bool = False

    def fmt(self, v: Any) -> str:
        """``v`` as the tables show it (``nan`` for a missing or non-finite value)."""
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "nan"
        return f"{v * self.scale / self.per:.{self.digits}f}"

    @property
    def axis_label(self) -> str:
        """The figure-axis label (falls back to ``label``)."""
        return self.axis or self.label


CATALOG: tuple[Metric, ...] = (
    Metric("num_conversations", "conversations", 0, axis="conversations (count)"),
    Metric("num_turns", "turns", 0, axis="turns completed (count)"),
    Metric("num_conversations_failed", "failed conversations", 0, axis="failed conversations (count)"),
    Metric("ttfet_p50_s", "TTFET p50 (s)", 2, log_y=True),
    Metric("ttfet_p95_s", "TTFET p95 (s)", 2, log_y=True),
    Metric("ttfet_p99_s", "TTFET p99 (s)", 2, log_y=True),
    Metric("ttfet_first_p50_s", "TTFET first-turn p50 (s)", 3, log_y=True),
    Metric("ttfet_first_p95_s", "TTFET first-turn p95 (s)", 3, log_y=True),
    Metric("ttfet_first_p99_s", "TTFET first-turn p99 (s)", 3, log_y=True),
    Metric("ttfet_visible_p50_s", "TTFET visible-turn p50 (s)", 2, log_y=True),
    Metric("ttfet_visible_p95_s", "TTFET visible-turn p95 (s)", 2, log_y=True),
    Metric("ttfet_visible_p99_s", "TTFET visible-turn p99 (s)", 2, log_y=True),
    Metric("last_turn_tpot_p50_s", "last-turn TBT p50 (ms)", 2, scale=1e3, axis="last-turn TBT (TPOT) p50 (s)"),
    Metric("last_turn_tpot_p95_s", "last-turn TBT p95 (ms)", 2, scale=1e3, axis="last-turn TBT (TPOT) p95 (s)"),
    Metric("slo_attainment_first", "SLO attainment (first)", 3,
           axis="SLO attainment, first-turn TTFET (fraction of conversations)"),
    Metric("slo_attainment_visible", "SLO attainment (visible)", 3,
           axis="SLO attainment, visible-turn TTFET (fraction of conversations)"),
    Metric("ampd_decision_flip_frac", "AMPD decision flips", 3,
           axis="AMPD remote/local decisions flipped vs the error-free predictor (fraction of turns >= 1)"),
    Metric("ampd_remote_frac", "AMPD remote frac", 3, axis="AMPD turns >= 1 prefilled remotely (fraction)"),
    Metric("ampd_misrouted_frac", "AMPD misrouted frac", 3,
           axis="AMPD remote/local decisions inverted on purpose (scheduler.misroute_frac; fraction of turns >= 1)"),
    Metric("ampd_decision_error_frac", "AMPD decision errors", 3,
           axis="AMPD remote/local decisions differing from the error-free rule's (fraction of turns >= 1)"),
    Metric("ampd_migrations", "AMPD migrations", 0, axis="AMPD decodes moved to another decoder (count)"),
    Metric("admission_held_conversations", "held at admission", 0,
           axis="conversations held at admission (turn 0 admitted after submission; count)"),
    Metric("admission_hold_s_total", "admission hold total (s)", 1, axis="admission hold of turn 0, summed (s)"),
    Metric("admission_hold_p95_s", "admission hold p95 (s)", 2, axis="admission hold of the held conversations, p95 (s)"),
    Metric("decoder_kv_peak_frac", "decoder KV peak", 3, axis="decoder KV occupancy, peak (fraction of capacity)"),
    Metric("decoder_kv_mean_frac", "decoder KV mean", 3,
           axis="decoder KV occupancy, time-weighted mean over the window (fraction of capacity)"),
    Metric("ttft_p95_s", "TTFT p95 (s)", 3, log_y=True),
    Metric("tpot_p50_s", "TPOT p50 (ms)", 2, scale=1e3, axis="TPOT p50 (s)"),
    Metric("slo_attainment", "SLO attainment", 3, axis="SLO attainment (fraction of conversations)"),
    Metric("goodput_conv_per_s", "goodput (conv/s)", 4, axis="goodput (conversations/s)"),
    Metric("preemptions", "preemptions", 0, axis="preemptions (count)"),
    # per-request goodput (harness.analysis.goodput): vLLM's / AIPerf's --goodput semantics, beside the conversation-level one
    Metric("request_goodput_per_s", "request goodput (req/s)", 4,
           axis="request goodput (req/s, vLLM rule)"),
    Metric("request_goodput_aiperf_per_s", "request goodput, AIPerf rule (req/s)", 4,
           axis="request goodput (req/s, AIPerf rule)"),
    Metric("good_request_frac", "good requests (fraction)", 3,
           axis="good requests (fraction of turns)"),
    # throughput and ITL (harness.analysis.validity.serving_metrics), for the sweep's points.csv
    Metric("request_throughput_per_s", "request throughput (req/s)", 4, axis="request throughput (turns/s)"),
    Metric("output_token_throughput_per_s", "output throughput (tok/s)", 1,
           axis="output token throughput (tokens/s)"),
    Metric("total_token_throughput_per_s", "total throughput (tok/s)", 1,
           axis="total token throughput (prompt + output tokens/s)"),
    Metric("itl_mean_s", "ITL mean (ms)", 2, scale=1e3, axis="ITL mean (s)"),
    Metric("itl_p50_s", "ITL p50 (ms)", 2, scale=1e3, axis="ITL p50 (s)"),
    Metric("itl_p99_s", "ITL p99 (ms)", 2, scale=1e3, axis="ITL p99 (s)", log_y=True),
    Metric("ttft_p50_s", "TTFT p50 (s)", 3, log_y=True),
    Metric("ttft_p99_s", "TTFT p99 (s)", 3, log_y=True),
    Metric("tpot_p99_s", "TPOT p99 (ms)", 2, scale=1e3, axis="TPOT p99 (s)"),
    Metric("e2e_p50_s", "E2E p50 (s)", 3, log_y=True),
    Metric("preemptions_per_turn", "preemptions / turn", 4, axis="preemptions (eviction-restarts) per turn"),
    Metric("e2e_central_mean_s", "E2E mean, central (s)", 3, log_y=True,
           axis="turn E2E latency, mean over the central 50 % by arrival (s)"),
    Metric("ttft_central_mean_s", "TTFT mean, central (s)", 3, log_y=True,
           axis="TTFT, mean over the central 50 % by arrival (s)"),
    Metric("prefix_hit_frac", "prefix hit frac", 3, axis="prefix-cache hit fraction of prompt tokens"),
    Metric("energy_j", "energy (kJ)", 1, per=1e3, axis="energy (J)"),
    Metric("tokens_per_joule", "tokens served / J", 1, axis="tokens per joule (tokens/J)"),
    Metric("output_tokens_per_joule", "output tokens / J", 3, axis="output tokens per joule (tokens/J)"),
    Metric("sim_wall_s", "run wall (s)", 1, axis="run wall time (s)"),
    # what the run cost the machine (harness.analysis.cost; docs/speed.md, "Cost accounting")
    Metric("cost_run_cpu_s", "CPU, run (s)", 1, axis="CPU of the run, user + system (s)"),
    Metric("cost_loop_cpu_s", "CPU, loop (s)", 1, axis="CPU of the simulation loop, user + system (s)"),
    Metric("cost_events_per_call", "events / LLM call", 1, axis="clock events per LLM call"),
    Metric("cost_peak_rss_bytes", "peak RSS (MiB)", 0, per=2 ** 20, axis="peak resident set size (bytes)"),
    Metric("latency_p50_s", "latency p50 (s)", 2, axis="conversation latency p50 (s)", log_y=True),
    Metric("latency_p95_s", "latency p95 (s)", 2, axis="conversation latency p95 (s)", log_y=True),
    Metric("latency_p99_s", "latency p99 (s)", 2, axis="conversation latency p99 (s)", log_y=True),
)
BY_KEY: Mapping[str, Metric] = {m.key: m for m in CATALOG}

# The rows of the printed run table and of the sweep comparison.md, in order.
TABLE: tuple[str, ...] = ("num_conversations", "num_turns", "num_conversations_failed", "ttfet_p50_s", "ttfet_p95_s", "ttfet_first_p50_s",
                          "ttfet_first_p95_s", "ttfet_first_p99_s", "ttfet_visible_p50_s", "ttfet_visible_p95_s",
                          "ttfet_visible_p99_s", "latency_p95_s", "last_turn_tpot_p50_s", "ttft_p95_s", "tpot_p50_s",
                          "slo_attainment", "slo_attainment_first", "slo_attainment_visible", "goodput_conv_per_s",
                          "request_goodput_per_s", "request_goodput_aiperf_per_s", "good_request_frac",
                          "preemptions", "prefix_hit_frac", "energy_j", "tokens_per_joule", "output_tokens_per_joule",
                          "admission_held_conversations", "admission_hold_s_total", "admission_hold_p95_s",
                          "decoder_kv_peak_frac", "decoder_kv_mean_frac",
                          "ampd_remote_frac", "ampd_decision_flip_frac", "ampd_misrouted_frac",
                          "ampd_decision_error_frac", "ampd_migrations", "sim_wall_s", "cost_run_cpu_s",
                          "cost_loop_cpu_s", "cost_events_per_call", "cost_peak_rss_bytes")
# The rows README.md's main-job table shows ("What the main job prints"), in ``TABLE`` order: a stated subset of
# the printed table, so a metric added to ``TABLE`` is printed without README.md being edited
# (tests/test_install.py compares README.md's rows with the printed ones for exactly these keys).
README_TABLE: tuple[str, ...] = ("num_conversations", "num_turns", "num_conversations_failed", "ttfet_p50_s",
                                 "ttfet_p95_s", "ttfet_first_p50_s", "ttfet_first_p95_s", "ttfet_first_p99_s",
                                 "ttfet_visible_p50_s", "ttfet_visible_p95_s", "ttfet_visible_p99_s", "latency_p95_s",
                                 "last_turn_tpot_p50_s", "ttft_p95_s", "tpot_p50_s", "slo_attainment",
                                 "slo_attainment_first", "slo_attainment_visible", "goodput_conv_per_s", "preemptions",
                                 "prefix_hit_frac", "energy_j", "tokens_per_joule", "output_tokens_per_joule",
                                 "admission_held_conversations", "admission_hold_s_total", "admission_hold_p95_s",
                                 "decoder_kv_peak_frac", "decoder_kv_mean_frac", "sim_wall_s")
# Rows a table shows only when at least one of its runs has the key (a policy's own summary, e.g. AMPD's).
OPTIONAL: frozenset[str] = frozenset({"ampd_remote_frac", "ampd_decision_flip_frac", "ampd_misrouted_frac",
                                      "ampd_decision_error_frac", "ampd_migrations", "admission_held_conversations",
                                      "admission_hold_s_total", "admission_hold_p95_s", "decoder_kv_peak_frac",
                                      "decoder_kv_mean_frac", "request_goodput_per_s", "request_goodput_aiperf_per_s",
                                      "good_request_frac", "cost_run_cpu_s", "cost_loop_cpu_s",
                                      "cost_events_per_call", "cost_peak_rss_bytes"})
# The metrics a sweep report aggregates (points.csv) and plots against the x axis, and the subset of its
# markdown table.
REPORT: tuple[str, ...] = ("ttfet_p50_s", "ttfet_p95_s", "ttfet_first_p50_s", "ttfet_first_p95_s", "ttfet_first_p99_s",
                           "ttfet_visible_p50_s", "ttfet_visible_p95_s", "ttfet_visible_p99_s", "slo_attainment",
                           "slo_attainment_first", "slo_attainment_visible", "goodput_conv_per_s", "latency_p50_s",
                           "latency_p95_s", "latency_p99_s", "last_turn_tpot_p50_s", "last_turn_tpot_p95_s",
                           "ttft_p95_s", "tpot_p50_s", "preemptions", "preemptions_per_turn", "e2e_central_mean_s",
                           "ttft_central_mean_s", "tokens_per_joule", "energy_j",
                           "ampd_decision_flip_frac", "ampd_remote_frac", "ampd_misrouted_frac",
                           "ampd_decision_error_frac", "ampd_migrations", "admission_held_conversations",
                           "admission_hold_s_total", "admission_hold_p95_s", "decoder_kv_peak_frac",
                           "decoder_kv_mean_frac",
                           # per-request goodput, throughput and ITL (present in runs that have them)
                           "request_goodput_per_s", "request_goodput_aiperf_per_s", "good_request_frac",
                           "request_throughput_per_s", "output_token_throughput_per_s",
                           "total_token_throughput_per_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "ttft_p50_s",
                           "ttft_p99_s", "tpot_p99_s", "e2e_p50_s")
REPORT_TABLE: tuple[str, ...] = ("ttfet_p95_s", "ttfet_first_p95_s", "ttfet_visible_p95_s", "slo_attainment",
                                 "slo_attainment_first", "slo_attainment_visible", "latency_p95_s",
                                 "last_turn_tpot_p50_s", "preemptions", "tokens_per_joule")


def summary_table(summaries: Mapping[str, Mapping[str, Any]], rows: Sequence[str] = TABLE) -> str:
    """A markdown table: one column per run (label -> summary), one row per metric of ``rows`` (a key of
    ``OPTIONAL`` only when some run has it)."""
    labels = list(summaries)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for key in rows:
        if key in OPTIONAL and not any(key in summaries[l] for l in labels):
            continue
        m = BY_KEY[key]
        lines.append(f"| {m.label} | " + " | ".join(m.fmt(summaries[l].get(key)) for l in labels) + " |")
    return "\n".join(lines)
