"""The shipped real step log replayed in sample on the simulator, like for like (issue 49): the per-step fit of
``docs/data/twin_cpu/calibration`` under the deciding, sum-preserving objective (``harness.tools.steps`` "sum", with
the decode-start term and the API front end net of the in-flight residual) replays that run's own workload on the
simulator (``harness.tools.fidelity.simulate_run``), once without the busy-timeline terms (``busy_timeline=False``,
``calibrate --no-busy-timeline``) and once with them (the between-step term, 0.152 ms; no after-idle band identified
on this run: what ``calibrate --from-steps`` writes by default). The expected values are the real log's own (its
steps, its spans), independent of the simulator; the bounds are the issue's: summed busy time within 2 %, step count
and mean decode batch within 2 %, engine TTFT / E2E / ITL means within 3 %, the engine rows counted from vLLM's
``queued_ts`` on both sides (``turns.parquet`` ``engine_queued_s``). With the between-step term the step count is
2.1 % short (1,645 against 1,680): stated as a strict expected failure, not loosened."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.core.profiles import ModelConfig
from harness.run.config import PROJECT_ROOT
from harness.tools import fidelity as fd
from harness.tools import steps as st
from harness.tools.insample import busy_figures, fit_in_sample
from harness.tools.inputs import load_profile, load_run_config

RUN = PROJECT_ROOT / "docs" / "data" / "twin_cpu" / "calibration"


def _replay(tmp_path_factory, busy_timeline):
    steps, fit, fe, hw = fit_in_sample(RUN, "cpu", "sum", busy_timeline)
    sim = fd.simulate_run(RUN, hw, tmp_path_factory.mktemp("replay") / "sim")
    return steps, fit, fe, hw, sim


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    return _replay(tmp_path_factory, False)


@pytest.fixture(scope="module")
def replay_busy(tmp_path_factory):
    return _replay(tmp_path_factory, True)


def test_with_the_busy_timeline_terms(replay_busy):
    """The between-step term fitted from the log's gaps (median of the gaps <= 1 ms: 0.1517 ms over 1,613 gaps);
    the after-idle bands not identified on this closed-loop calibration (16 / 18 / 1 / 2 steps after a gap in the
    bands, estimates +5.0 ms (rel. SE 96 %) and -0.85 ms: fixed at 0, said); the replay within the issue's bounds
    but for the step count."""
    steps, fit, fe, hw, sim = replay_busy
    gap = steps.idle_s.to_numpy(float)
    g = gap[(gap >= 0) & (gap <= st.BUSY_GAP_S)]
    assert hw.between_step_s == pytest.approx(np.median(g)) and fit["terms"]["between_step_s"]["status"] == "fitted"
    assert hw.after_idle_s == [] and all(v["status"].startswith("fixed at prior: not fitted")
                                         for k, v in fit["terms"].items() if k.startswith("after_idle_s"))
    f = busy_figures(steps, hw, sim)
    assert abs(f["busy"]) <= 0.02 and abs(f["batch"]) <= 0.02
    # the front end was fitted net of the renewal estimate of the in-flight residual (19.7 ms); the replay's own
    # wait for the step in flight (queued - arrival - front end: 18.0 ms) is an independent reading of it
    t = pd.read_parquet(sim / "turns.parquet")
    t = t[t.status == "ok"]
    waited = (t.engine_queued_s - t.start_s - hw.api_frontend_s).mean()
    assert waited == pytest.approx(fe["inflight_residual_s"], rel=0.2)
    rows = fd.engine_request_rows(RUN, sim)
    for k in ("engine_ttft_mean_s", "engine_e2e_mean_s", "engine_itl_mean_s"):
        assert rows[k]["sim"] == pytest.approx(rows[k]["real"], rel=0.03), k


@pytest.mark.xfail(strict=True, reason="with the between-step term the in-sample replay forms 1,645 steps against the "
                                       "log's 1,680 (-2.1 %): just outside the issue's 2 % (docs/fidelity_cpu.md)")
def test_with_the_busy_timeline_terms_the_step_count(replay_busy):
    steps, _, _, hw, sim = replay_busy
    assert abs(busy_figures(steps, hw, sim)["steps"]) <= 0.02


def test_the_sum_objective_prices_the_logged_steps_at_their_summed_time(replay):
    steps, fit, fe, hw, _ = replay
    model = ModelConfig(**load_run_config(RUN)["model"])
    from harness.sim.perf import PerfModel
    assert fit["dropped_outliers"] > 0        # stalls were left out of the slopes, yet their time is kept
    assert st.replay(steps, PerfModel(hw, model)).sum() == pytest.approx(steps.wall_s.sum(), rel=1e-9)
    # the front end: the spans' server - engine TTFT, less the renewal residual of the logged busy cycles
    w = steps.sort_values("t0")
    gap = np.append(w.t0.to_numpy()[1:] - w.t_end.to_numpy()[:-1], 0.0)
    c = w.wall_s.to_numpy() + np.where((gap >= 0) & (gap <= st.BUSY_GAP_S), gap, 0.0)
    residual = (c ** 2).sum() / 2 / (w.t_end.max() - w.t0.min())
    assert fe["inflight_residual_s"] == pytest.approx(residual, rel=1e-9)
    assert hw.api_frontend_s == pytest.approx(fe["mean_s"] - residual, rel=1e-9) and 0 < hw.api_frontend_s < fe["mean_s"]


def test_the_replay_spends_the_logged_busy_time_in_as_many_steps(replay):
    steps, _, _, _, sim = replay
    s = pd.read_parquet(sim / "steps.parquet")
    assert s.duration_s.sum() == pytest.approx(steps.wall_s.sum(), rel=0.02)
    assert len(s) == pytest.approx(len(steps), rel=0.02)
    # both sides take the same tokens, to the token
    assert s.decode_tokens.sum() == steps.decode_seqs.sum() and s.prefill_tokens.sum() == steps.prefill_tokens.sum()
    real_batch = steps.decode_seqs[steps.decode_seqs > 0].mean()
    assert s.decode_tokens[s.decode_tokens > 0].mean() == pytest.approx(real_batch, rel=0.02)


def test_the_replay_meets_the_engine_clock_like_for_like(replay):
    _, _, _, _, sim = replay
    t = pd.read_parquet(sim / "turns.parquet")
    ok = t[t.status == "ok"]
    # every simulated turn has vLLM's QUEUED event, at or after its arrival at the engine (after the front end)
    assert ok.engine_queued_s.notna().all() and (ok.engine_queued_s >= ok.start_s).all()
    assert (ok.engine_scheduled_s >= ok.engine_queued_s).all() and (ok.first_token_s > ok.engine_scheduled_s).all()
    rows = fd.engine_request_rows(RUN, sim)
    assert rows["engine_requests"]["real"] == 384
    for k in ("engine_ttft_mean_s", "engine_e2e_mean_s", "engine_itl_mean_s"):
        assert rows[k]["sim_queued"] and fd.origin(k, rows[k]["sim_queued"]) != fd.ORIGIN_ENGINE_ARRIVAL
        assert rows[k]["sim"] == pytest.approx(rows[k]["real"], rel=0.03), k


def test_the_slow_period_figure_by_hand():
    """Three windows of 1 s of busy time: steps of 0.45 s priced 0.45 s, then one of 0.9 s priced 0.45 s (the
    machine at half speed), then two more at speed. Window ratios 1, 2, 1 with busy time 0.9 s each and 2, 1, 2
    steps: busy-weighted 4/3, step-weighted 6/5, figure 10/9."""
    steps = pd.DataFrame({"instance": "i0", "t0": [0.0, 1.0, 2.0, 3.0, 4.0], "wall_s": [0.45, 0.45, 0.9, 0.45, 0.45]})
    f = st.slow_periods(steps, np.full(5, 0.45), window_s=1.0)
    assert f["windows"] == 3
    assert f["busy_weighted"] == pytest.approx(4 / 3) and f["step_weighted"] == pytest.approx(6 / 5)
    assert f["figure"] == pytest.approx(10 / 9)
    # the machine's speed constant (every step 1.5 x its price): no slow period, the figure is 1
    assert st.slow_periods(steps.assign(wall_s=steps.wall_s * 1.5), steps.wall_s.to_numpy(), 1.0)["figure"] == \
        pytest.approx(1.0)


def test_the_protocol_accepts_the_shipped_log_and_refuses_correlated_slow_periods():
    """The shipped calibration (1.030: under the 1.10 bound) is accepted on this figure; the same log with the
    machine at half speed for the first 60 of every 200 steps (a second CPU-bound job by turns) is refused, the
    refusal naming the figure and its bound. Independent noise of the same size is not a slow period: it passes."""
    from harness.tools import protocol as pr
    steps, _ = st.load_step_times(RUN, skip_steps=8)
    model = ModelConfig(**load_run_config(RUN)["model"])
    base = load_profile("cpu")
    quiet = st.slow_period_figure(steps, base, model)["figure"]
    assert 1.0 <= quiet < st.MAX_SLOW_PERIODS
    assert pr.contention_problem({"ncpu": 2, "run": "calibration", "slow_periods": quiet}) == ""
    slow = steps.copy()
    w = slow.wall_s.to_numpy().copy()
    for start in range(0, len(w), 200):
        w[start:start + 60] *= 2.0
    slow["wall_s"] = w
    fig = st.slow_period_figure(slow, base, model)["figure"]
    why = pr.contention_problem({"ncpu": 2, "run": "calibration", "slow_periods": fig})
    assert fig > st.MAX_SLOW_PERIODS and why.startswith("slow-period figure") and "bound 1.10" in why
    rng = np.random.default_rng(0)
    iid = steps.assign(wall_s=steps.wall_s * np.exp(0.3 * rng.standard_normal(len(steps))))
    assert st.slow_period_figure(iid, base, model)["figure"] < st.MAX_SLOW_PERIODS
