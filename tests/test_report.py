"""``python -m harness.report`` on small hand-made sweeps: the tidy table, the per-point mean and 95 %
t-interval (checked against values computed by hand), the markdown, and which figures are drawn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip("seaborn")
pytest.importorskip("scipy")

from harness import report  # noqa: E402

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


def test_points_mean_and_t_interval_by_hand(rate_sweep: Path, tmp_path: Path):
    res = report.report(rate_sweep, tmp_path / "rep", draw=False)
    pts = res["points"].set_index(["workload.rate_per_s", "variant"])
    c = pts.loc[(0.1, "conserve")]
    # 10, 12, 14: mean 12, sd 2, half-width = t(0.975, 2) * 2 / sqrt(3) = 4.3027 * 1.15470 = 4.9683
    assert c.ttfet_p95_s_mean == pytest.approx(12.0)
    assert c.ttfet_p95_s_ci95 == pytest.approx(4.9683, abs=1e-3)
    assert c.ttfet_p95_s_n == 3
    # SLO attainment is a proportion: pooled over the 3 runs x 3 conversations, 8.1 of 9 met, p = 0.9, with a
    # Wilson interval (z = 1.96): centre (0.9 + 3.8415/18) / (1 + 3.8415/9) = 0.78034, half-width
    # 1.96 sqrt(0.9 x 0.1 / 9 + 3.8415 / 324) / 1.42683 = 0.20308 -> [0.57726, 0.98342]: inside [0, 1], where
    # the t interval of the three values (0.9 +- 0.248) would pass 1
    assert c.slo_attainment_mean == pytest.approx(0.9)
    assert c.slo_attainment_lo == pytest.approx(0.57726, abs=1e-4)
    assert c.slo_attainment_hi == pytest.approx(0.98342, abs=1e-4)
    # identical values: zero width
    assert pts.loc[(0.2, "conserve")].ttfet_p95_s_ci95 == pytest.approx(0.0)
    # a missing value is left out (n = 2), not counted as 0: 30, 34 -> mean 32, sd 2.8284,
    # half-width = t(0.975, 1) * 2.8284 / sqrt(2) = 12.7062 * 2 = 25.4124
    # a count's interval is a bootstrap of the mean: within the values' range, never negative
    assert c.preemptions_lo == 0 and c.preemptions_hi == 0
    a = pts.loc[(0.1, "ampd")]
    assert a.ttfet_p95_s_mean == pytest.approx(32.0) and a.ttfet_p95_s_n == 2
    assert a.ttfet_p95_s_ci95 == pytest.approx(25.4124, abs=1e-3)
    assert a.slo_attainment_n == 3 and a.runs == 3
    # 0.2, 0.1 over two runs of 3 conversations: the t interval (0.15 +- 12.7062 x 0.070711 / 1.41421 = 0.635)
    # would reach -0.49; pooled, 0.9 of 6 met (p = 0.15), Wilson: centre (0.15 + 3.8415/12) / (1 + 3.8415/6)
    # = 0.28662, half-width 1.96 sqrt(0.15 x 0.85 / 6 + 3.8415 / 144) / 1.64025 = 0.26159 -> [0.02502, 0.54821]
    b = pts.loc[(0.2, "ampd")]
    assert b.slo_attainment_lo == pytest.approx(0.02502, abs=1e-4) and b.slo_attainment_hi == pytest.approx(0.54821, abs=1e-4)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| `workload.rate_per_s` | x axis | 0.1, 0.2 |" in md
    assert "| `workload.seed` | repetition (seed) | 0, 1, 2 |" in md
    row = next(l for l in md.splitlines() if l.startswith("| 0.1 | conserve |"))
    assert "12 [7.032, 16.97] (n=3)" in row and "0.9 [0.5773, 0.9834] (n=3)" in row
    row = next(l for l in md.splitlines() if l.startswith("| 0.1 | ampd |"))
    assert "32 [6.588, 57.41] (n=2)" in row      # 32 -+ 25.41 (the t half-width above)


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


def test_tier_and_prediction_error_figures(tmp_path: Path):
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
