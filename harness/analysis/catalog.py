"""The metric catalog: one entry per headline metric of ``summary.json``, with its label, unit, format
and its definition (``Metric.definition``, with ``unit`` and ``source``). The printed run table, the sweep ``comparison.md`` (``harness.run.callbacks``), the
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
    unit: the unit of the ``summary.json`` value (before ``scale`` / ``per``); definition: what it measures, in the
    field's terms; source: the code that computes it and the docs section that defines it. The generated metric
    reference (``docs/reference/metrics.md``, ``python -m harness.tools.reference``) prints these three.
    """

    key: str
    label: str
    digits: int
    scale: float = 1.0
    per: float = 1.0
    axis: str = ""
    log_y: bool = False
    unit: str = ""
    definition: str = ""
    source: str = ""

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
    Metric("num_conversations", "conversations", 0, axis="conversations (count)",
           unit="count",
           definition="conversations of the workload (the SLO attainment's denominator), finished or not",
           source="harness.analysis.metrics.summarize"),
    Metric("num_turns", "turns", 0, axis="turns completed (count)",
           unit="count",
           definition="turns (LLM calls) completed (status ok)",
           source="harness.analysis.metrics.summarize"),
    Metric("num_conversations_failed", "failed conversations", 0, axis="failed conversations (count)",
           unit="count",
           definition="conversations with a failed turn (counted as SLO violations)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Failures\""),
    Metric("ttfet_p50_s", "TTFET p50 (s)", 2, log_y=True,
           unit="s",
           definition="50th percentile over conversations of TTFET (time to first effective token): the headline "
                      "TTFET (the reading `slo.ttfet_definition` names; default `visible`)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_p95_s", "TTFET p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of TTFET (time to first effective token): the headline "
                      "TTFET (the reading `slo.ttfet_definition` names; default `visible`)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_p99_s", "TTFET p99 (s)", 2, log_y=True,
           unit="s",
           definition="99th percentile over conversations of TTFET (time to first effective token): the headline "
                      "TTFET (the reading `slo.ttfet_definition` names; default `visible`)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_first_p50_s", "TTFET first-turn p50 (s)", 3, log_y=True,
           unit="s",
           definition="50th percentile over conversations of TTFET (time to first effective token): turn 0's first "
                      "output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_first_p95_s", "TTFET first-turn p95 (s)", 3, log_y=True,
           unit="s",
           definition="95th percentile over conversations of TTFET (time to first effective token): turn 0's first "
                      "output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_first_p99_s", "TTFET first-turn p99 (s)", 3, log_y=True,
           unit="s",
           definition="99th percentile over conversations of TTFET (time to first effective token): turn 0's first "
                      "output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_visible_p50_s", "TTFET visible-turn p50 (s)", 2, log_y=True,
           unit="s",
           definition="50th percentile over conversations of TTFET (time to first effective token): the first "
                      "user-visible turn's first output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_visible_p95_s", "TTFET visible-turn p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of TTFET (time to first effective token): the first "
                      "user-visible turn's first output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_visible_p99_s", "TTFET visible-turn p99 (s)", 2, log_y=True,
           unit="s",
           definition="99th percentile over conversations of TTFET (time to first effective token): the first "
                      "user-visible turn's first output token − the conversation's arrival",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("ttfet_serving_p50_s", "TTFET serving-only p50 (s)", 2, log_y=True,
           unit="s",
           definition="50th percentile over conversations of the serving-only TTFET: the visible-turn TTFET minus the "
                      "conversation's replayed tool and think time before that turn, i.e. the time its turns up to "
                      "the first user-visible one spent in the serving system (each earlier turn's E2E plus the "
                      "visible turn's TTFT)",
           source="harness.analysis.metrics.serving_ttfet; docs/metrics.md \"Serving-only TTFET\""),
    Metric("ttfet_serving_p95_s", "TTFET serving-only p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of the serving-only TTFET: the visible-turn TTFET minus the "
                      "conversation's replayed tool and think time before that turn, i.e. the time its turns up to "
                      "the first user-visible one spent in the serving system (each earlier turn's E2E plus the "
                      "visible turn's TTFT)",
           source="harness.analysis.metrics.serving_ttfet; docs/metrics.md \"Serving-only TTFET\""),
    Metric("ttfet_serving_p99_s", "TTFET serving-only p99 (s)", 2, log_y=True,
           unit="s",
           definition="99th percentile over conversations of the serving-only TTFET: the visible-turn TTFET minus the "
                      "conversation's replayed tool and think time before that turn, i.e. the time its turns up to "
                      "the first user-visible one spent in the serving system (each earlier turn's E2E plus the "
                      "visible turn's TTFT)",
           source="harness.analysis.metrics.serving_ttfet; docs/metrics.md \"Serving-only TTFET\""),
    Metric("ttfet_first_from_admission_p95_s", "TTFET first-turn from admission p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of the first-turn TTFET minus the conversation's admission "
                      "hold (turn 0's admit − submit): TTFET from admission rather than from arrival (equal under "
                      "admit-all policies)",
           source="harness.analysis.metrics.admission_readings; docs/metrics.md \"KV and admission pressure\""),
    Metric("ttfet_visible_from_admission_p95_s", "TTFET visible-turn from admission p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of the visible-turn TTFET minus the conversation's admission "
                      "hold (turn 0's admit − submit): TTFET from admission rather than from arrival (equal under "
                      "admit-all policies)",
           source="harness.analysis.metrics.admission_readings; docs/metrics.md \"KV and admission pressure\""),
    Metric("ttfet_serving_from_admission_p95_s", "TTFET serving-only from admission p95 (s)", 2, log_y=True,
           unit="s",
           definition="95th percentile over conversations of the serving-only TTFET minus the conversation's admission "
                      "hold (turn 0's admit − submit): TTFET from admission rather than from arrival (equal under "
                      "admit-all policies)",
           source="harness.analysis.metrics.admission_readings; docs/metrics.md \"KV and admission pressure\""),
    Metric("last_turn_tpot_p50_s", "last-turn TBT p50 (ms)", 2, scale=1e3, axis="last-turn TBT (TPOT) p50 (s)",
           unit="s",
           definition="median over conversations of the final turn's TPOT (last-turn time between tokens: (last − "
                      "first token) / (output tokens − 1))",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("last_turn_tpot_p95_s", "last-turn TBT p95 (ms)", 2, scale=1e3, axis="last-turn TBT (TPOT) p95 (s)",
           unit="s",
           definition="95th percentile over conversations of the final turn's TPOT",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("slo_attainment_first", "SLO attainment (first)", 3,
           axis="SLO attainment, first-turn TTFET (fraction of conversations)",
           unit="fraction",
           definition="conversations whose first-turn TTFET meets its SLO (`slo.ttfet_first_*`) / all conversations "
                      "(failed ones count as violations); NaN without an SLO",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("slo_attainment_visible", "SLO attainment (visible)", 3,
           axis="SLO attainment, visible-turn TTFET (fraction of conversations)",
           unit="fraction",
           definition="conversations whose visible-turn TTFET meets its SLO (`slo.ttfet_visible_*`) / all "
                      "conversations; NaN without an SLO",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("slo_attainment_serving", "SLO attainment (serving-only)", 3,
           axis="SLO attainment, serving-only TTFET (fraction of conversations)",
           unit="fraction",
           definition="conversations whose serving-only TTFET meets its SLO (`slo.ttfet_serving_*`; relative: a "
                      "multiple of the same conversation's unloaded serving-only TTFET) / all conversations; NaN "
                      "without an SLO",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Serving-only TTFET\""),
    Metric("ampd_decision_flip_frac", "AMPD decision flips", 3,
           axis="AMPD remote/local decisions flipped vs the error-free predictor (fraction of turns >= 1)",
           unit="fraction",
           definition="AMPD's turns ≥ 1 whose remote/local choice differs from the error-free predictor's on the "
                      "same view (0 for the oracle arm)",
           source="baselines.ampd.Ampd.summary; docs/schedulers.md"),
    Metric("ampd_remote_frac", "AMPD remote frac", 3, axis="AMPD turns >= 1 prefilled remotely (fraction)",
           unit="fraction",
           definition="AMPD's turns ≥ 1 whose append-prefill ran on the prefiller (remote)",
           source="baselines.ampd.Ampd.summary; docs/schedulers.md"),
    Metric("ampd_misrouted_frac", "AMPD misrouted frac", 3,
           axis="AMPD remote/local decisions inverted on purpose (scheduler.misroute_frac; fraction of turns >= 1)",
           unit="fraction",
           definition="AMPD's turns ≥ 1 whose remote/local choice was inverted on purpose (`scheduler.misroute_frac`"
                      " > 0 only)",
           source="baselines.ampd.Ampd.summary; docs/schedulers.md"),
    Metric("ampd_decision_error_frac", "AMPD decision errors", 3,
           axis="AMPD remote/local decisions differing from the error-free rule's (fraction of turns >= 1)",
           unit="fraction",
           definition="AMPD's turns ≥ 1 whose final choice differs from the error-free rule's (prediction error and "
                      "misroute together; `scheduler.misroute_frac` > 0 only)",
           source="baselines.ampd.Ampd.summary; docs/schedulers.md"),
    Metric("ampd_migrations", "AMPD migrations", 0, axis="AMPD decodes moved to another decoder (count)",
           unit="count",
           definition="decodes AMPD moved off a decoder predicted to overflow its KV cache",
           source="baselines.ampd.Ampd.summary; docs/schedulers.md; docs/metrics.md \"KV and admission "
                  "pressure\""),
    Metric("admission_held_conversations", "held at admission", 0,
           axis="conversations held at admission (turn 0 admitted after submission; count)",
           unit="count",
           definition="conversations whose turn 0 was admitted after its submission (ConServe's admission gate; 0 "
                      "under admit-all policies)",
           source="harness.analysis.metrics.pressure_metrics; docs/metrics.md \"KV and admission pressure\""),
    Metric("admission_hold_s_total", "admission hold total (s)", 1, axis="admission hold of turn 0, summed (s)",
           unit="s",
           definition="admission hold of turn 0 (admission − submission), summed over the held conversations",
           source="harness.analysis.metrics.pressure_metrics; docs/metrics.md \"KV and admission pressure\""),
    Metric("admission_hold_p95_s", "admission hold p95 (s)", 2, axis="admission hold of the held conversations, p95 (s)",
           unit="s",
           definition="95th percentile of turn 0's admission hold over the held conversations; NaN when none was "
                      "held",
           source="harness.analysis.metrics.pressure_metrics; docs/metrics.md \"KV and admission pressure\""),
    Metric("decoder_kv_peak_frac", "decoder KV peak", 3, axis="decoder KV occupancy, peak (fraction of capacity)",
           unit="fraction of KV capacity",
           definition="highest sampled KV-cache occupancy of any decoding instance in the measured window",
           source="harness.analysis.metrics.pressure_metrics; docs/metrics.md \"KV and admission pressure\""),
    Metric("decoder_kv_mean_frac", "decoder KV mean", 3,
           axis="decoder KV occupancy, time-weighted mean over the window (fraction of capacity)",
           unit="fraction of KV capacity",
           definition="time-weighted mean KV-cache occupancy of the decoding instances over the measured window "
                      "(each `instances.parquet` sample held to that instance's next)",
           source="harness.analysis.metrics.pressure_metrics; docs/metrics.md \"KV and admission pressure\""),
    Metric("ttft_p95_s", "TTFT p95 (s)", 3, log_y=True,
           unit="s",
           definition="95th percentile over completed turns of TTFT (first output token − the turn's submission)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per turn\""),
    Metric("tpot_p50_s", "TPOT p50 (ms)", 2, scale=1e3, axis="TPOT p50 (s)",
           unit="s",
           definition="median over completed turns of TPOT ((last − first token) / (output tokens − 1); NaN for "
                      "1-token outputs)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per turn\""),
    Metric("slo_attainment", "SLO attainment", 3, axis="SLO attainment (fraction of conversations)",
           unit="fraction",
           definition="conversations meeting the SLO of the headline TTFET reading (and `slo.tbt_s` if set) / all "
                      "conversations of the workload",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("goodput_conv_per_s", "goodput (conv/s)", 4, axis="goodput (conversations/s)",
           unit="conversations/s",
           definition="conversations meeting the SLO / the measured window (first arrival to last finish)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("preemptions", "preemptions", 0, axis="preemptions (count)",
           unit="count",
           definition="preemptions (KV evictions with restart by recompute) over the run, all instances",
           source="harness.analysis.metrics.summarize; docs/simulator.md"),
    # per-request goodput (harness.analysis.goodput): vLLM's / AIPerf's --goodput semantics, beside the conversation-level one
    Metric("request_goodput_per_s", "request goodput (req/s)", 4,
           axis="request goodput (req/s, vLLM rule)",
           unit="requests/s",
           definition="turns meeting every `slo.goodput` threshold under vLLM's `bench serve --goodput` rule / the "
                      "measured window",
           source="harness.analysis.goodput.goodput_summary; docs/metrics.md \"Per-request goodput\""),
    Metric("request_goodput_aiperf_per_s", "request goodput, AIPerf rule (req/s)", 4,
           axis="request goodput (req/s, AIPerf rule)",
           unit="requests/s",
           definition="turns meeting every `slo.goodput` threshold under AIPerf's `--goodput` rule / the measured "
                      "window",
           source="harness.analysis.goodput.goodput_summary; docs/metrics.md \"Per-request goodput\""),
    Metric("good_request_frac", "good requests (fraction)", 3,
           axis="good requests (fraction of turns)",
           unit="fraction",
           definition="turns meeting every `slo.goodput` threshold (vLLM's rule) / all turns submitted, every status",
           source="harness.analysis.goodput.goodput_summary; docs/metrics.md \"Per-request goodput\""),
    # throughput and ITL (harness.analysis.validity.serving_metrics), for the sweep's points.csv
    Metric("request_throughput_per_s", "request throughput (req/s)", 4, axis="request throughput (turns/s)",
           unit="requests/s",
           definition="completed turns / the measured window",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\""),
    Metric("output_token_throughput_per_s", "output throughput (tok/s)", 1,
           axis="output token throughput (tokens/s)",
           unit="tokens/s",
           definition="generated tokens of the completed turns / the measured window",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\""),
    Metric("total_token_throughput_per_s", "total throughput (tok/s)", 1,
           axis="total token throughput (prompt + output tokens/s)",
           unit="tokens/s",
           definition="prompt + generated tokens of the completed turns / the measured window",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\""),
    Metric("itl_mean_s", "ITL mean (ms)", 2, scale=1e3, axis="ITL mean (s)",
           unit="s",
           definition="mean inter-token latency: the gaps between successive output tokens of every completed turn, "
                      "pooled",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("itl_p50_s", "ITL p50 (ms)", 2, scale=1e3, axis="ITL p50 (s)",
           unit="s",
           definition="median of the pooled inter-token gaps of the completed turns",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("itl_p99_s", "ITL p99 (ms)", 2, scale=1e3, axis="ITL p99 (s)", log_y=True,
           unit="s",
           definition="99th percentile of the pooled inter-token gaps of the completed turns",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("ttft_p50_s", "TTFT p50 (s)", 3, log_y=True,
           unit="s",
           definition="median over completed turns of TTFT (first output token − the turn's submission)",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("ttft_p99_s", "TTFT p99 (s)", 3, log_y=True,
           unit="s",
           definition="99th percentile over completed turns of TTFT",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("tpot_p99_s", "TPOT p99 (ms)", 2, scale=1e3, axis="TPOT p99 (s)",
           unit="s",
           definition="99th percentile over completed turns of TPOT",
           source="harness.analysis.validity.serving_metrics; docs/metrics.md \"Serving throughput and percentiles\"; "
                  "docs/metrics.md \"Per turn\""),
    Metric("e2e_p50_s", "E2E p50 (s)", 3, log_y=True,
           unit="s",
           definition="median over completed turns of E2E (last output token − the turn's submission)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per turn\""),
    Metric("preemptions_per_turn", "preemptions / turn", 4, axis="preemptions (eviction-restarts) per turn",
           unit="count per turn",
           definition="preemptions (eviction-restarts) / turns submitted",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per turn\""),
    Metric("e2e_central_mean_s", "E2E mean, central (s)", 3, log_y=True,
           axis="turn E2E latency, mean over the central 50 % by arrival (s)",
           unit="s",
           definition="mean E2E of the completed turns submitted in the central half of the run (positions n/4 to "
                      "3n/4 by submission): the WAIT paper's steady-state reading",
           source="harness.analysis.metrics.central_window; docs/metrics.md \"Per turn\""),
    Metric("ttft_central_mean_s", "TTFT mean, central (s)", 3, log_y=True,
           axis="TTFT, mean over the central 50 % by arrival (s)",
           unit="s",
           definition="mean TTFT of the completed turns submitted in the central half of the run",
           source="harness.analysis.metrics.central_window; docs/metrics.md \"Per turn\""),
    Metric("prefix_hit_frac", "prefix hit frac", 3, axis="prefix-cache hit fraction of prompt tokens",
           unit="fraction of prompt tokens",
           definition="prompt tokens served from the prefix cache / prompt tokens, completed turns",
           source="harness.analysis.metrics.summarize; docs/prefix_caching.md"),
    Metric("energy_j", "energy (kJ)", 1, per=1e3, axis="energy (J)",
           unit="J",
           definition="energy of every instance over the measured window, idle power included (simulator: the power "
                      "model per step; real vLLM: NVML counters, NaN without NVIDIA GPUs)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Energy\""),
    Metric("tokens_per_joule", "tokens served / J", 1, axis="tokens per joule (tokens/J)",
           unit="tokens/J",
           definition="prompt + generated tokens of the completed turns (tokens served) / energy",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Energy\""),
    Metric("output_tokens_per_joule", "output tokens / J", 3, axis="output tokens per joule (tokens/J)",
           unit="tokens/J",
           definition="generated tokens of the completed turns / energy",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Energy\""),
    Metric("sim_wall_s", "run wall (s)", 1, axis="run wall time (s)",
           unit="s",
           definition="wall-clock time of the session (the simulation, or the real run's serving), without set-up "
                      "and the SLO baseline",
           source="harness.run.runner (SessionResult.wall_s); docs/speed.md"),
    # what the run cost the machine (harness.analysis.cost; docs/speed.md, "Cost accounting")
    Metric("cost_run_cpu_s", "CPU, run (s)", 1, axis="CPU of the run, user + system (s)",
           unit="s",
           definition="this process's CPU (user + system) from the start of the run to its summary, the process's "
                      "imports and Hydra's composes left out",
           source="harness.analysis.cost.run_cost; docs/speed.md \"Cost accounting\""),
    Metric("cost_loop_cpu_s", "CPU, loop (s)", 1, axis="CPU of the simulation loop, user + system (s)",
           unit="s",
           definition="this process's CPU (user + system, every thread; time.process_time) while the session's "
                      "loop ran",
           source="harness.analysis.cost.run_cost; docs/speed.md \"Cost accounting\""),
    Metric("cost_events_per_call", "events / LLM call", 1, axis="clock events per LLM call",
           unit="events per call",
           definition="the run's clock events (sim_events) / LLM calls (turns completed + failed)",
           source="harness.analysis.cost.run_cost; docs/speed.md \"Cost accounting\""),
    Metric("cost_peak_rss_bytes", "peak RSS (MiB)", 0, per=2 ** 20, axis="peak resident set size (bytes)",
           unit="bytes",
           definition="the process's peak resident set size so far (getrusage ru_maxrss, KiB on Linux, times 1024)",
           source="harness.analysis.cost.run_cost; docs/speed.md \"Cost accounting\""),
    Metric("latency_p50_s", "latency p50 (s)", 2, axis="conversation latency p50 (s)", log_y=True,
           unit="s",
           definition="median over conversations of conversation latency (last token of the last turn − arrival)",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("latency_p95_s", "latency p95 (s)", 2, axis="conversation latency p95 (s)", log_y=True,
           unit="s",
           definition="95th percentile over conversations of conversation latency",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
    Metric("latency_p99_s", "latency p99 (s)", 2, axis="conversation latency p99 (s)", log_y=True,
           unit="s",
           definition="99th percentile over conversations of conversation latency",
           source="harness.analysis.metrics.summarize; docs/metrics.md \"Per conversation\""),
)
BY_KEY: Mapping[str, Metric] = {m.key: m for m in CATALOG}

# The rows of the printed run table and of the sweep comparison.md, in order.
TABLE: tuple[str, ...] = ("num_conversations", "num_turns", "num_conversations_failed", "ttfet_p50_s", "ttfet_p95_s", "ttfet_first_p50_s",
                          "ttfet_first_p95_s", "ttfet_first_p99_s", "ttfet_visible_p50_s", "ttfet_visible_p95_s",
                          "ttfet_visible_p99_s", "ttfet_serving_p50_s", "ttfet_serving_p95_s", "ttfet_serving_p99_s",
                          "latency_p95_s", "last_turn_tpot_p50_s", "ttft_p95_s", "tpot_p50_s",
                          "slo_attainment", "slo_attainment_first", "slo_attainment_visible", "slo_attainment_serving",
                          "goodput_conv_per_s", "request_goodput_per_s", "request_goodput_aiperf_per_s", "good_request_frac",
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
                           "ttfet_visible_p50_s", "ttfet_visible_p95_s", "ttfet_visible_p99_s", "ttfet_serving_p50_s",
                           "ttfet_serving_p95_s", "ttfet_serving_p99_s", "slo_attainment",
                           "slo_attainment_first", "slo_attainment_visible", "slo_attainment_serving",
                           "goodput_conv_per_s", "latency_p50_s",
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
