"""``python -m harness.analysis.report`` on small hand-made sweeps: the tidy table, the per-point seed-level estimate
and 95 % interval (checked against values computed by hand), the markdown, and which figures are drawn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import skip_without  # noqa: E402

skip_without("seaborn", "seaborn not installed")   # without importing it (matplotlib, scipy) at collection
skip_without("scipy", "scipy not installed")

from harness.analysis import report  # noqa: E402

# Student-t 0.975 quantiles from a printed table: 1 and 2 degrees of freedom.
T_1DF, T_2DF = 12.7062, 4.3027


def make_run(root: Path, name: str, config: dict, summary: dict, ttfets=(1.0, 2.0, 4.0)) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    (d / "summary.json").write_text(json.dumps({"num_conversations": len(ttfets), "partial": False, **summary}))
    pd.DataFrame({"conversation_id": [f"c{i}" for i in range(len(ttfets))], "ttfet_s": list(ttfets),
                  "latency_s": [t + 1 for t in ttfets]}).to_parquet(d / "conversations.parquet")
    pd.DataFrame({"conversation_id": ["c0", "c0", "c1"], "turn": [0, 1, 0], "queue_s": [0.0, 0.5, 1.0],
                  "preemptions": [0, 2, 0], "status": ["ok", "ok", "ok"]}).to_parquet(d / "turns.parquet")
    pd.DataFrame({"t_s": [0.0, 1.0, 2.0, 0.0, 1.0, 2.0], "instance": ["decoder0"] * 3 + ["decoder1"] * 3,
                  "kv_used_frac": [0.0, 0.5, 0.25, 0.1, 0.2, 0.3]}).to_parquet(d / "instances.parquet")


def config(scheduler="conserve", rate=0.1, seed=0, cluster="a40_1p3d", sigma=None) -> dict:
    sched = {"name": scheduler}
    if scheduler == "conserve":
        sched["kv_admit_frac"] = 0.9
    if sigma is not None:
        sched["predictor"] = {"sigma": sigma, "seed": 0}
    return {"scheduler": sched, "cluster": {"name": cluster, "instances": [{"role": "decoder", "count": 3,
                                                                            "hardware": cluster}]},
            "model": {"name": "qwen3_0_6b"},
            "workload": {"name": "swebench", "kind": "trace", "rate_per_s": rate, "seed": seed}}


# (scheduler, rate) -> per-seed (ttfet_p95_s, slo_attainment); None = that seed's run is missing a value
RATE_SWEEP = {
    ("conserve", 0.1): [(10.0, 1.0), (12.0, 0.9), (14.0, 0.8)],
    ("conserve", 0.2): [(20.0, 0.5), (20.0, 0.5), (20.0, 0.5)],
    ("ampd", 0.1): [(30.0, 0.7), (None, 0.6), (34.0, 0.5)],
    ("ampd", 0.2): [(40.0, 0.2), (44.0, 0.1)],
}


@pytest.fixture
def rate_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    i = 0
    for (sched, rate), seeds in RATE_SWEEP.items():
        for seed, (p95, slo) in enumerate(seeds):
            make_run(root, f"{i}_{sched}_rate{rate}_seed{seed}", config(sched, rate, seed),
                     {"ttfet_p95_s": math.nan if p95 is None else p95, "slo_attainment": slo,
                      "tokens_per_joule": 60.0 + seed, "preemptions": 0, "energy_j_per_instance": [1.0, 2.0]})
            i += 1
    return root


def test_tidy_table_has_one_row_per_run_with_swept_keys(rate_sweep: Path, tmp_path: Path):
    out = tmp_path / "rep"
    assert report.main([str(rate_sweep), "--out", str(out), "--no-figures"]) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 11 and len(pd.read_parquet(out / "runs.parquet")) == 11
    for col in ("run", "scheduler.name", "workload.rate_per_s", "workload.seed", "variant", "ttfet_p95_s",
                "slo_attainment", "turns_preempted"):
        assert col in runs.columns, col
    assert "energy_j_per_instance" not in runs.columns  # lists are not table cells
    assert set(runs["variant"]) == {"conserve", "ampd"}
    assert runs["turns_preempted"].eq(1).all() and runs["queue_mean_s"].eq(0.5).all()
    sw = report.load_sweep(rate_sweep)
    assert sw.x == "workload.rate_per_s" and sw.seeds == ["workload.seed"] and sw.facets == []
    assert sw.variant_keys == ["scheduler.name"]
    assert "scheduler.kv_admit_frac" in sw.swept and "scheduler.kv_admit_frac" not in sw.dims  # set by the name


def _t_back(z, t, back=math.exp):
    """By hand: (back(mean), back(mean - t sd / sqrt n), back(mean + t sd / sqrt n)) of the values z."""
    z = np.asarray(z, dtype=float)
    half = t * z.std(ddof=1) / math.sqrt(len(z))
    return back(z.mean()), back(z.mean() - half), back(z.mean() + half)


def _expit(z):
    return 1 / (1 + math.exp(-z))


def test_points_seed_level_intervals_by_hand(rate_sweep: Path, tmp_path: Path):
    res = report.report(rate_sweep, tmp_path / "rep", draw=False)
    pts = res["points"].set_index(["workload.rate_per_s", "variant"])
    c = pts.loc[(0.1, "conserve")]
    # a positive time over the seeds 10, 12, 14: the t-interval (t(0.975, 2) = 4.3027) of the logs, back
    # through exp: the geometric mean 11.888 [7.823, 18.07]
    g, lo, hi = _t_back(np.log([10.0, 12.0, 14.0]), T_2DF)
    assert g == pytest.approx(11.8878, abs=1e-3)
    assert (c.ttfet_p95_s_mean, c.ttfet_p95_s_lo, c.ttfet_p95_s_hi) == pytest.approx((g, lo, hi), rel=1e-4)
    assert c.ttfet_p95_s_ci95 == pytest.approx(hi - g, rel=1e-4) and c.ttfet_p95_s_n == 3
    # SLO attainment 1.0, 0.9, 0.8 on runs of 3 conversations: the seed at 1 is moved half a conversation
    # inside (1 - 0.5 / 3), then the t-interval of the logits log(p / (1 - p)), back through 1 / (1 + e^-z)
    q = np.array([1 - 0.5 / 3, 0.9, 0.8])
    e, elo, ehi = _t_back(np.log(q / (1 - q)), T_2DF, _expit)
    assert (c.slo_attainment_mean, c.slo_attainment_lo, c.slo_attainment_hi) == pytest.approx((e, elo, ehi), rel=1e-4)
    assert 0 < c.slo_attainment_lo < c.slo_attainment_hi < 1
    # the pooled Wilson interval stays as a descriptive column: 8.1 of 9 met, p = 0.9, z = 1.96: centre
    # (0.9 + 3.8415/18) / (1 + 3.8415/9) = 0.78034, half-width 1.96 sqrt(0.9 x 0.1 / 9 + 3.8415 / 324) / 1.42683
    # = 0.20308 -> [0.57726, 0.98342]
    assert c.slo_attainment_pooled == pytest.approx(0.9)
    assert c.slo_attainment_pooled_lo == pytest.approx(0.57726, abs=1e-4)
    assert c.slo_attainment_pooled_hi == pytest.approx(0.98342, abs=1e-4)
    # identical values: zero width
    assert pts.loc[(0.2, "conserve")].ttfet_p95_s_ci95 == pytest.approx(0.0)
    assert pts.loc[(0.2, "conserve")].slo_attainment_lo == pytest.approx(0.5)
    # a count (all 0): log(1 + x) = 0 on every seed, so 0 [0, 0]; never negative
    assert c.preemptions_mean == 0 and c.preemptions_lo == 0 and c.preemptions_hi == 0
    # a missing value is left out (n = 2), not counted as 0: 30, 34 with t(0.975, 1) = 12.7062 on the logs
    a = pts.loc[(0.1, "ampd")]
    g2, lo2, hi2 = _t_back(np.log([30.0, 34.0]), T_1DF)
    assert (a.ttfet_p95_s_mean, a.ttfet_p95_s_lo, a.ttfet_p95_s_hi) == pytest.approx((g2, lo2, hi2), rel=1e-4)
    assert a.ttfet_p95_s_n == 2 and a.slo_attainment_n == 3 and a.runs == 3
    # 0.2, 0.1 over two seeds: the plain t interval (0.15 +- 0.635) would reach -0.49; on the logit scale it
    # stays inside (0, 1)
    b = pts.loc[(0.2, "ampd")]
    e3, lo3, hi3 = _t_back([math.log(0.2 / 0.8), math.log(0.1 / 0.9)], T_1DF, _expit)
    assert (b.slo_attainment_mean, b.slo_attainment_lo, b.slo_attainment_hi) == pytest.approx((e3, lo3, hi3), rel=1e-4)
    assert 0 < b.slo_attainment_lo and b.slo_attainment_hi < 1
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| `workload.rate_per_s` | x axis | 0.1, 0.2 |" in md
    assert "| `workload.seed` | repetition (seed) | 0, 1, 2 |" in md
    row = next(l for l in md.splitlines() if l.startswith("| 0.1 | conserve |"))
    assert f"{g:.4g} [{lo:.4g}, {hi:.4g}] (n=3)" in row and f"{e:.4g} [{elo:.4g}, {ehi:.4g}] (n=3)" in row
    row = next(l for l in md.splitlines() if l.startswith("| 0.1 | ampd |"))
    assert f"{g2:.4g} [{lo2:.4g}, {hi2:.4g}] (n=2)" in row


def test_conserve_three_seeds_interval_by_hand():
    """ConServe's three seeds at 0.10 conv/s (issue 18: 0.714, 0.945, 0.965; 200 conversations each):
    the pooled Wilson interval [0.816, 0.917] holds none of them; the seed-level one is computed here by
    hand: logits ln(p / (1 - p)) = 0.91489, 2.84385, 3.31678; mean 2.35851, sd 1.27237, half-width
    4.3027 x 1.27237 / sqrt 3 = 3.16079 -> expit(2.35851) = 0.91361 [expit(-0.80228) = 0.30954,
    expit(5.51930) = 0.99601], with expit(z) = 1 / (1 + e^-z)."""
    from harness.analysis.stats import point_interval
    e, lo, hi, n = point_interval("slo_attainment_first", [0.714, 0.945, 0.965], [200, 200, 200])
    assert n == 3
    assert e == pytest.approx(0.91361, abs=2e-4)
    assert lo == pytest.approx(0.30954, abs=2e-4) and hi == pytest.approx(0.99601, abs=2e-5)
    assert lo < 0.714 and 0.965 < hi < 1


def test_no_interval_leaves_its_range():
    """A count whose log(1 + x) interval reaches below 0 is cut at 0; a proportion with 0 and 1 seeds stays
    inside (0, 1); a time that spans decades stays positive."""
    from harness.analysis.stats import point_interval
    assert point_interval("preemptions", [0, 0, 30])[1] == 0.0
    _, lo, hi, _ = point_interval("slo_attainment_visible", [0.0, 1.0, 1.0], [10, 10, 10])
    assert 0 < lo < hi < 1
    assert point_interval("ttfet_first_p95_s", [1.0, 1.2, 21.2])[1] > 0


def test_single_seed_has_no_interval():
    assert report.mean_ci([3.0]) == (3.0, pytest.approx(math.nan, nan_ok=True), 1)
    m, h, n = report.mean_ci([math.nan, None])
    assert math.isnan(m) and math.isnan(h) and n == 0
    assert report.t_quantile(3) == pytest.approx(T_2DF, abs=1e-4)
    assert report.t_quantile(2) == pytest.approx(T_1DF, abs=1e-4)


def test_rate_sweep_figures(rate_sweep: Path, tmp_path: Path):
    out = tmp_path / "rep"
    assert report.main([str(rate_sweep), "--out", str(out)]) == 0
    figs = {p.name for p in (out / "figures").iterdir()}
    for name in ("ttfet_cdf", "p95_ttfet_vs_rate", "slo_attainment_vs_rate", "kv_occupancy"):
        assert {f"{name}.png", f"{name}.pdf"} <= figs, name
        assert (out / "figures" / f"{name}.png").stat().st_size > 5_000
    # inputs that do not vary in (or are missing from) this sweep: no tier, no prediction error, no
    # preemptions (all 0), no latency (not in these summaries)
    assert not any(n.startswith(("tokens_per_joule", "metrics_vs_prediction_error", "preemptions", "latency"))
                   for n in figs)
    assert "![p95_ttfet_vs_rate](figures/p95_ttfet_vs_rate.png)" in (out / "report.md").read_text()


def test_tier_and_prediction_error_figures(tmp_path: Path, unrendered_figures):
    """Which figures a sweep gets (built, not rendered: tests/conftest.py ``unrendered_figures``)."""
    root = tmp_path / "sweep"
    i = 0
    for cluster, tpj in (("a40_1p3d", 60.0), ("a40_1p3d_hetero", 70.0)):
        for sched in ("conserve", "ampd"):
            for seed in range(2):
                make_run(root, f"{i}_x", config(sched, 0.05, seed, cluster),
                         {"ttfet_p95_s": 10.0, "slo_attainment": 1.0, "tokens_per_joule": tpj + seed})
                i += 1
    sw = report.load_sweep(root)
    assert sw.x is None and sw.facets == ["cluster.name"] and "cluster.instances" not in sw.dims
    figs = {p.stem for p in report.figures(sw, tmp_path / "f1")}
    assert figs == {"ttfet_cdf", "tokens_per_joule", "kv_occupancy"}

    root = tmp_path / "sigma"
    for i, sigma in enumerate((0.0, 0.5, 1.0)):
        make_run(root, f"{i}_ampd", config("ampd", 0.06, 0, sigma=sigma), {"ttfet_p95_s": 10 + sigma,
                                                                          "slo_attainment": 1 - sigma / 4,
                                                                          "tokens_per_joule": 60.0})
    make_run(root, "3_conserve", config("conserve", 0.06, 0), {"ttfet_p95_s": 10.5, "slo_attainment": 0.9,
                                                               "tokens_per_joule": 61.0})
    sw = report.load_sweep(root)
    assert sw.x == "scheduler.predictor.sigma" and sw.variant_keys == ["scheduler.name"]
    assert "scheduler.predictor.seed" not in sw.seeds  # absent for conserve, fixed by scheduler.name
    figs = {p.stem for p in report.figures(sw, tmp_path / "f2")}
    assert figs == {"ttfet_cdf", "metrics_vs_prediction_error", "kv_occupancy"}


def test_empty_directory_is_a_clean_error(tmp_path: Path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no run directories" in capsys.readouterr().err



def test_a_hardware_profile_no_instance_uses_is_not_a_sweep_dimension(tmp_path: Path):
    """Runs whose configs differ in the ``cpu`` profile (recalibrated between two parts of a sweep) on
    clusters of ``a40`` GPUs only: not a dimension; a difference in the ``a40`` profile they run on is one."""
    for i, (cpu_overhead, a40_idle) in enumerate([(0.003, 30.0), (0.0028, 30.0), (0.003, 70.0)]):
        c = config(seed=i % 2, cluster="a40")
        c["hardware"] = {"cpu": {"step_overhead_s": cpu_overhead}, "a40": {"idle_w": a40_idle}}
        make_run(tmp_path, f"{i}_run", c, {"ttfet_p95_s": 1.0})
    sw = report.load_sweep(tmp_path)
    assert "hardware.cpu.step_overhead_s" not in sw.swept
    assert "hardware.a40.idle_w" in sw.dims


def test_the_results_api_snippet_of_docs_outputs_runs(rate_sweep: Path, capsys):
    """docs/outputs.md's Python snippet (load_sweep, points_table, runs.parquet, points.parquet), run as written on
    the hand-made sweep: conserve at 0.2 conv/s has ttfet_p95_s 20 s on all three seeds, so its estimate and both
    interval ends are 20 (n=3); the files hold one row per run (11) and per point (4)."""
    import re
    text = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text()
    code = re.search(r"## Reading results from Python.*?```python\n(.*?)```", text, re.S).group(1)
    assert 'SWEEP = "results/sweeps/<time>_<pid>"' in code
    assert report.main([str(rate_sweep), "--no-figures"]) == 0
    ns: dict = {}
    exec(code.replace('SWEEP = "results/sweeps/<time>_<pid>"', f"SWEEP = {str(rate_sweep)!r}"), ns)
    pts = ns["pts"]
    row = pts[(pts["variant"] == "conserve") & (pts["workload.rate_per_s"] == 0.2)].iloc[0]
    assert (row["ttfet_p95_s_mean"], row["ttfet_p95_s_lo"], row["ttfet_p95_s_hi"], row["ttfet_p95_s_n"]) == \
        pytest.approx((20.0, 20.0, 20.0, 3))
    assert len(ns["runs"]) == len(ns["runs_file"]) == 11 and len(ns["points_file"]) == 4
