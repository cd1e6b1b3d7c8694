"""SLO-scale curves (``harness.analysis.metrics.slo_scale_curve``, ``slo.scales``; issue 18): hand-made
per-conversation TTFETs and references, every attainment counted by hand in the comments; the config
checks; a run's curve beside its headline; the report's attainment-vs-scale figure."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.metrics import SloConfig, scale_key, slo_scale_curve
from tests.conftest import compose_run

SCALES = [0.5, 1, 2, 3]


def conv(first, visible, completed, tpot=None) -> pd.DataFrame:
    n = len(first)
    return pd.DataFrame({"conversation_id": [f"c{i}" for i in range(n)], "ttfet_first_s": first,
                         "ttfet_visible_s": visible, "completed": completed,
                         "last_turn_tpot_s": tpot if tpot is not None else [0.01] * n})


# the reference's unloaded TTFETs (s): first turn 1 s everywhere; visible 10, 10, 15, 10 s
UNLOADED = {"c0": {"first": 1.0, "visible": 10.0}, "c1": {"first": 1.0, "visible": 10.0},
            "c2": {"first": 1.0, "visible": 15.0}, "c3": {"first": 1.0, "visible": 10.0}}
# variant A: c3 failed (never meets an SLO)
A = conv([1.0, 2.0, 3.0, math.nan], [10.0, 20.0, 30.0, math.nan], [True, True, True, False])


def test_relative_curve_by_hand():
    got = slo_scale_curve(A, SloConfig(scales=SCALES), UNLOADED)
    assert got["slo_scales"] == [0.5, 1.0, 2.0, 3.0]
    # first: thresholds x * 1 s -> 0.5: none; 1: c0 (1 <= 1); 2: c0, c1; 3: c0, c1, c2 -- of 4 conversations
    assert [got[scale_key("first", x)] for x in SCALES] == [0.0, 0.25, 0.5, 0.75]
    # visible: 0.5 -> 5, 5, 7.5 s: none; 1 -> 10, 10, 15: c0; 2 -> 20, 20, 30: c0, c1, c2; 3: the same three
    assert [got[scale_key("visible", x)] for x in SCALES] == [0.0, 0.25, 0.75, 0.75]
    assert scale_key("visible", 1.5) == "slo_attainment_visible_x1.5" and scale_key("first", 1) == "slo_attainment_first_x1"


def test_one_threshold_for_every_variant():
    # variant B, judged against the same reference: first 0.4, 5, 0.9, 1.2 s, all completed
    b = conv([0.4, 5.0, 0.9, 1.2], [4.0, 50.0, 16.0, 29.0], [True] * 4)
    got = slo_scale_curve(b, SloConfig(scales=SCALES), UNLOADED)
    # first: 0.5 s: c0; 1 s: c0, c2; 2 s: c0, c2, c3; 3 s: the same
    assert [got[scale_key("first", x)] for x in SCALES] == [0.25, 0.5, 0.75, 0.75]
    # visible: 0.5 -> 5, 5, 7.5, 5: c0; 1 -> 10, 10, 15, 10: c0; 2 -> 20, 20, 30, 20: c0, c2; 3 -> 30, 30, 45, 30: c0, c2, c3
    assert [got[scale_key("visible", x)] for x in SCALES] == [0.25, 0.25, 0.5, 0.75]


def test_absolute_reading_scales_its_seconds_and_tbt_applies():
    slo = SloConfig(scales=SCALES, ttfet_visible_mode="absolute", ttfet_visible_s=20.0)
    got = slo_scale_curve(A, slo, UNLOADED)
    # visible thresholds 10, 20, 40, 60 s (the same for every conversation): c0 | c0, c1 | c0-c2 | c0-c2
    assert [got[scale_key("visible", x)] for x in SCALES] == [0.25, 0.5, 0.75, 0.75]
    # the first reading keeps its relative base
    assert [got[scale_key("first", x)] for x in SCALES] == [0.0, 0.25, 0.5, 0.75]
    # a last-turn TBT SLO of 50 ms fails c0 (100 ms) at every scale
    slow = conv([1.0, 2.0, 3.0, math.nan], [10.0, 20.0, 30.0, math.nan], [True, True, True, False],
                tpot=[0.1, 0.01, 0.01, 0.01])
    got = slo_scale_curve(slow, SloConfig(scales=SCALES, tbt_s=0.05), UNLOADED)
    assert [got[scale_key("first", x)] for x in SCALES] == [0.0, 0.0, 0.25, 0.5]
    # all-absolute curve needs no unloaded TTFETs; no scales: no keys
    both = SloConfig(scales=[1], ttfet_mode="absolute", ttfet_s=20.0, ttfet_first_mode="absolute", ttfet_first_s=2.0,
                     ttfet_serving_mode="absolute", ttfet_serving_s=10.0)
    assert not both.needs_scale_unloaded()
    assert slo_scale_curve(A, both, None) == {"slo_scales": [1.0], "slo_attainment_first_x1": 0.5,
                                             "slo_attainment_visible_x1": 0.5}
    assert slo_scale_curve(A, SloConfig(), UNLOADED) == {}
    with pytest.raises(ValueError, match="needs the unloaded"):
        slo_scale_curve(A, SloConfig(scales=[1]), None)


@pytest.mark.parametrize("bad", [[], [0], [1, -2], [1, 1.0], [float("inf")]])
def test_bad_scales_name_the_field(bad):
    with pytest.raises(ValueError, match=r"slo\.scales"):
        SloConfig(scales=bad).validate()


def test_run_curve_matches_the_headline_at_its_multiple(tmp_path: Path):
    """Default slo=relative (visible <= 1.5 x collocated's unloaded TTFET, scales 0.5 ... 10): the curve at
    1.5 is the headline's visible attainment (both readings share the threshold rule); an unknown
    scale_reference fails before the run."""
    from harness.run.config import ConfigError
    from harness.run.runner import execute
    base = ["scheduler=ampd", "workload.num_conversations=12", "logger.progress=false"]
    s = execute(compose_run(base), tmp_path / "r")
    assert s["slo_scales"] == [0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0]
    assert s["slo_attainment_visible_x1.5"] == s["slo_attainment_visible"]
    curve = [s[scale_key("visible", x)] for x in s["slo_scales"]]
    assert curve == sorted(curve) and s["slo_scale_reference"] == "unloaded TTFET under collocated"
    # against ampd's own unloaded TTFETs instead (a second replay); first-turn curve non-decreasing too
    s2 = execute(compose_run(base + ["slo.scale_reference=same"]), tmp_path / "same")
    assert s2["slo_scale_reference"] == "unloaded TTFET under ampd (the same variant)"
    first = [s2[scale_key("first", x)] for x in s2["slo_scales"]]
    assert first == sorted(first) and s2["slo_attainment_visible"] == s["slo_attainment_visible"]
    with pytest.raises(ConfigError, match="scale_reference"):
        compose_run(base + ["slo.scale_reference=nonesuch"])


def test_report_draws_attainment_vs_scale(tmp_path: Path, request):
    pytest.importorskip("seaborn")
    request.getfixturevalue("unrendered_figures")   # built, not rendered (after the skip: it imports matplotlib)
    from harness.analysis import report
    from tests.test_report import config, make_run
    root = tmp_path / "sweep"
    i = 0
    for sched in ("conserve", "ampd"):
        for seed in range(2):
            curve = {scale_key(r, x): min(1.0, 0.2 * x + 0.1 * seed) for r in ("first", "visible") for x in SCALES}
            make_run(root, f"{i}_{sched}_seed{seed}", config(sched, 0.1, seed),
                     {"slo_attainment": 0.5, "ttfet_p95_s": 1.0, "tokens_per_joule": 60.0, "preemptions": 0, "slo_scales": SCALES,
                      "slo_scale_reference": "unloaded TTFET under collocated", **curve})
            i += 1
    out = report.report(root, tmp_path / "out")
    names = {Path(p).name for p in out["figures"]}
    assert "slo_attainment_vs_scale.png" in names
