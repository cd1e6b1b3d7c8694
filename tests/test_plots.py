"""``python -m harness.analysis.report SWEEP --x ... --y ...`` (harness/analysis/plots.py): points, filters, facets and
Pareto fronts on a hand-made sweep whose values are written here."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import skip_without  # noqa: E402

skip_without("seaborn", "seaborn not installed")   # without importing it (matplotlib, scipy) at collection

from harness.analysis import plots, report  # noqa: E402
from tests.test_report import config, make_run  # noqa: E402

# (scheduler, cluster, rate) -> per-seed (output tokens/s, TTFT p99 s)
VALUES = {
    ("conserve", "a40_1p3d", 0.1): [(100.0, 1.0), (120.0, 3.0)],
    ("conserve", "a40_1p3d", 0.2): [(200.0, 2.0), (220.0, 2.0)],
    ("ampd", "a40_1p3d", 0.1): [(90.0, 0.5), (110.0, 0.5)],
    ("ampd", "a40_1p3d", 0.2): [(150.0, 4.0), (150.0, 6.0)],
    ("conserve", "a40_2p6d", 0.1): [(300.0, 1.5), (300.0, 1.5)],
    ("conserve", "a40_2p6d", 0.2): [(400.0, 1.0), (400.0, 1.0)],
}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    i = 0
    for (sched, cluster, rate), seeds in VALUES.items():
        for seed, (tput, ttft) in enumerate(seeds):
            make_run(root, f"{i}_{sched}", config(sched, rate, seed, cluster),
                     {"output_token_throughput_per_s": tput, "ttft_p99_s": ttft, "slo_attainment": 1.0})
            i += 1
    return root


def test_pareto_mask_by_hand():
    # A(1, 1) B(2, 2) C(2, 3) D(3, 1.5) E(0.5, 0.5), x higher and y lower better: D dominates B and C
    x, y = np.array([1, 2, 2, 3, 0.5]), np.array([1, 2, 3, 1.5, 0.5])
    assert plots.pareto_mask(x, y).tolist() == [True, False, False, True, True]
    # both lower better: only E (0.5, 0.5) survives
    assert plots.pareto_mask(x, y, "low", "low").tolist() == [False, False, False, False, True]
    assert plots.pareto_mask(np.array([1.0, math.nan]), np.array([1.0, 0.0])).tolist() == [True, False]
    assert plots.better("request_goodput_per_s") == "high" and plots.better("ttft_p99_s") == "low"


def test_xy_points_are_means_over_seeds_and_pareto_per_facet(sweep, tmp_path):
    out = tmp_path / "r"
    rc = report.main([str(sweep), "--out", str(out), "--no-figures", "--x", "output_token_throughput_per_s",
                      "--y", "ttft_p99_s", "--facet", "cluster.name", "--pareto"])
    assert rc == 0
    csv = out / "figures" / "pareto_ttft_p99_s_vs_output_token_throughput_per_s_by_cluster.name.csv"
    pts = pd.read_csv(csv)
    by = {(r["cluster.name"], r.variant, r["workload.rate_per_s"]): r for _, r in pts.iterrows()}
    c1 = by[("a40_1p3d", "conserve", 0.1)]
    assert (c1.output_token_throughput_per_s, c1.ttft_p99_s, c1.runs) == (110.0, 2.0, 2)
    a2 = by[("a40_1p3d", "ampd", 0.2)]
    assert (a2.output_token_throughput_per_s, a2.ttft_p99_s) == (150.0, 5.0)
    # 1p3d means: conserve (110, 2) (210, 2); ampd (100, 0.5) (150, 5) -> overall front: (210, 2) and (100, 0.5)
    front = {(r.variant, r["workload.rate_per_s"]) for _, r in pts.iterrows()
             if r["cluster.name"] == "a40_1p3d" and r.pareto_all}
    assert front == {("conserve", 0.2), ("ampd", 0.1)}
    # ampd's own front keeps both of its points (150 > 100 but 5 > 0.5)
    assert by[("a40_1p3d", "ampd", 0.2)].pareto_variant and by[("a40_1p3d", "ampd", 0.1)].pareto_variant
    # 2p6d: (400, 1) dominates (300, 1.5)
    assert by[("a40_2p6d", "conserve", 0.2)].pareto_all and not by[("a40_2p6d", "conserve", 0.1)].pareto_all
    assert (csv.with_suffix(".png")).is_file()


def test_filters_and_errors(sweep, tmp_path, capsys):
    out = tmp_path / "r"
    assert report.main([str(sweep), "--out", str(out), "--no-figures", "--x", "output_token_throughput_per_s",
                        "--y", "ttft_p99_s", "--filter", "scheduler.name==ampd",
                        "--filter", "workload.rate_per_s<0.15"]) == 0
    pts = pd.read_csv(out / "figures" / "xy_ttft_p99_s_vs_output_token_throughput_per_s.csv")
    assert pts.variant.tolist() == ["ampd"] and pts.output_token_throughput_per_s.tolist() == [100.0]
    for bad, needle in ((["--x", "nope", "--y", "ttft_p99_s"], "no such column"),
                        (["--x", "ttft_p99_s"], "both --x and --y"),
                        (["--x", "ttft_p99_s", "--y", "ttft_p99_s", "--filter", "x~1"], "expected KEY OP VALUE"),
                        (["--pareto"], "need --x and --y")):
        assert report.main([str(sweep), "--out", str(out), "--no-figures", *bad]) == 2
        assert needle in capsys.readouterr().err


def test_seeds_note_by_hand():
    from harness.analysis.plotting import seeds_note
    assert seeds_note([3, 3, 3]) == "n = 3 seeds per point"
    assert seeds_note([3, 10, 5]) == "n = 3–10 seeds per point"
    assert seeds_note([1]) == "n = 1 seed per point"


def test_pareto_points_carry_their_rate_and_the_figure_states_n(sweep, tmp_path, monkeypatch):
    """Each plotted point is labelled with its arrival rate (the sweep's axis, not an axis of the figure),
    and the title states the seeds per point: VALUES has 2 seeds at every point."""
    from harness.analysis import plotting
    figs = []

    def keep(fig, out, name):
        figs.append(fig)
        return []
    monkeypatch.setattr(plotting, "_save", keep)
    sw = report.load_sweep(sweep)
    plots.xy_figure(sw, "output_token_throughput_per_s", "ttft_p99_s", tmp_path, facet="cluster.name", pareto=True)
    (fig,) = figs
    by_panel = {ax.get_title(): sorted(t.get_text() for t in ax.texts) for ax in fig.axes}
    # a40_1p3d: conserve and ampd at 0.1 and 0.2 conv/s; a40_2p6d: conserve at both
    assert by_panel == {"cluster.name = a40_1p3d": ["0.1", "0.1", "0.2", "0.2"],
                        "cluster.name = a40_2p6d": ["0.1", "0.2"]}
    assert "n = 2 seeds per point" in fig._suptitle.get_text()
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "Pareto front (all variants)" in labels


def test_pareto_front_artist_holds_exactly_the_non_dominated_points(sweep, tmp_path, monkeypatch):
    """The starred points of each panel are the overall front by hand (VALUES' means; x higher, y lower better):
    a40_1p3d: conserve (110, 2) (210, 2), ampd (100, 0.5) (150, 5) -> (210, 2) and (100, 0.5); a40_2p6d:
    (400, 1) dominates (300, 1.5)."""
    from harness.analysis import plotting
    figs = []
    monkeypatch.setattr(plotting, "_save", lambda fig, out, name: figs.append(fig) or [])
    plots.xy_figure(report.load_sweep(sweep), "output_token_throughput_per_s", "ttft_p99_s", tmp_path,
                    facet="cluster.name", pareto=True)
    (fig,) = figs
    want = {"cluster.name = a40_1p3d": {(210.0, 2.0), (100.0, 0.5)}, "cluster.name = a40_2p6d": {(400.0, 1.0)}}
    for ax in fig.axes:
        (stars,) = [c for c in ax.collections if c.get_label() == "on the Pareto front (all variants)"]
        assert {tuple(map(float, o)) for o in stars.get_offsets()} == want[ax.get_title()]
