"""``python -m harness.analysis.seeds``: the stopping rule on hand-made log ratios, the rounds with a fake runner
(seconds), and the real run.py multirun into one sweep directory with resume on a tiny workload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from harness.analysis import seeds
from harness.analysis.seeds import adapt, decide, metric_state, next_seeds

T_2DF, T_3DF = 4.3027, 3.1824  # Student-t 0.975 quantiles, 2 and 3 degrees of freedom (printed table)


def test_metric_state_and_next_seeds_by_hand():
    z = [-0.2, -0.15, -0.25]  # mean -0.2, sd 0.05: half-width 4.3027 x 0.05 / sqrt 3 = 0.12421
    s = metric_state("m", z, -51.08, target=0.1)
    assert s.halfwidth == pytest.approx(T_2DF * 0.05 / math.sqrt(3), abs=1e-4)
    assert s.estimate == pytest.approx((math.exp(-0.2) - 1) * 100) and s.n == 3 and s.k == 3
    # exp(-0.2 -+ 0.12421) - 1 = [-27.7, -7.3] %: below 0, and its far end -27.7 % reaches half of -51.08 %
    # (-25.54 %): reproduced (the interval decides; the old rule read the estimate -18.1 % as "smaller")
    assert s.low == pytest.approx((math.exp(-0.32421) - 1) * 100, abs=1e-3)
    assert s.verdict == "reproduced" and s.why == "decided" and s.alpha == 0.05
    # a narrower spread, sd 0.025: exp(-0.2 -+ 0.06211) - 1 = [-23.1, -12.9] %, wholly short of -25.54 %
    assert metric_state("m", [-0.2, -0.175, -0.225], -51.08, 0.1).verdict == "same direction, smaller"
    assert metric_state("m", z, -51.08, 0.1, stop_on_verdict=False).why == ""
    assert metric_state("m", z, None, 0.1).why == ""             # no paper: only the half-width decides
    assert metric_state("m", z, None, 0.13).why == "target"      # 0.1242 <= 0.13
    wide = [-0.2, -0.1, -0.3]                                     # sd 0.1: crosses 0 -> inconclusive
    assert metric_state("m", wide, -51.08, 0.1).verdict == "inconclusive"
    # a smaller nominal level widens the interval: t(1 - 0.01 / 2, 2) = 9.9248 (printed table)
    assert metric_state("m", z, None, 0.1, alpha=0.01).halfwidth == pytest.approx(9.9248 * 0.05 / math.sqrt(3), abs=1e-4)
    # the planned looks: min doubled until max, max last
    assert seeds.planned_looks(3, 20) == (3, 6, 12, 20) and seeds.planned_looks(5, 5) == (5,)
    assert seeds.planned_looks(2, 16) == (2, 4, 8, 16) and seeds.planned_looks(4, 9) == (4, 8, 9)
    with pytest.raises(ValueError, match="--min-seeds"):
        seeds.planned_looks(1, 20)
    assert next_seeds(3, (3, 6, 12, 20)) == 6 and next_seeds(12, (3, 6, 12, 20)) == 20
    assert next_seeds(20, (3, 6, 12, 20)) == 20
    st = metric_state("m", z, None, 0.1)
    assert decide([st], 3, 20) == "" and decide([st], 20, 20) == "cap"
    assert decide([metric_state("m", z, None, 0.13)], 3, 20) == "target"


def fake_runner(values_a, values_b):
    """A runner that writes the summary.json run.py would, from per-seed values of ``m``."""
    calls = []

    def run(cell_dir: Path, arm, overrides, n):
        calls.append((tuple(arm), n))
        vals = values_a if arm == ["scheduler=conserve"] else values_b
        for s in range(n):
            d = cell_dir / f"{seeds._label(arm)}_seed{s}"
            if not (d / "summary.json").is_file():
                d.mkdir(parents=True, exist_ok=True)
                (d / "summary.json").write_text(json.dumps({"m": vals[s]}))
    return run, calls


def test_adapt_adds_seeds_until_the_half_width_is_reached(tmp_path: Path):
    """Log ratios alternating +0.1, -0.1 at the planned looks 3, 6, 12, 20, each interval at the design's
    nominal level a' (seeds.sequential_alpha, checked against Pocock's table in test_seeds_sequential.py):
    n = 3: sd 0.11547; n = 6: sd sqrt(0.06 / 5) = 0.10954; n = 12: sd sqrt(0.12 / 11) = 0.10445; the half-width
    t(1 - a'/2, n - 1) sd / sqrt(n) is 0.538, 0.162 (> 0.1, go on) and 0.087 (<= 0.1: stop, target) with
    t = 8.07, 3.63, 2.88."""
    from scipy import stats
    z = np.array([0.1, -0.1] * 10)
    run, calls = fake_runner(list(100.0 * np.exp(z)), [100.0] * 20)
    rec = adapt(tmp_path, ["scheduler=conserve"], ["scheduler=ampd"], ["workload.rate_per_s=0.1"], [("m", None)],
                min_seeds=3, max_seeds=20, target_halfwidth=0.1, runner=run, log=lambda *_: None)
    a = seeds.sequential_alpha((3, 6, 12, 20))
    want = [stats.t.ppf(1 - a / 2, n - 1) * sd / math.sqrt(n) for n, sd in ((3, 0.11547), (6, 0.10954), (12, 0.10445))]
    assert want == pytest.approx([0.538, 0.162, 0.087], abs=2e-3)
    assert [r["seeds"] for r in rec.rounds] == [3, 6, 12] and (rec.seeds, rec.stopped) == (12, "target")
    assert [r["m"]["halfwidth"] for r in rec.rounds] == pytest.approx(want, abs=2e-4)
    assert rec.looks == [3, 6, 12, 20] and rec.alpha == a
    assert [n for arm, n in calls if arm == ("scheduler=conserve",)] == [3, 6, 12]
    rows = (tmp_path / "seeds.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("workload.rate-per-s-0.1,12,target,m,")
    md = seeds.seeds_markdown(tmp_path)
    assert "| workload.rate-per-s-0.1 | 12 | target | `m` |" in md


def test_adapt_stops_at_the_cap_and_on_a_decided_verdict(tmp_path: Path):
    spread = [100.0, 200.0, 50.0, 400.0, 25.0, 100.0]    # log ratios +-0.69 ...: never narrow
    run, _ = fake_runner(spread, [100.0] * 6)
    rec = adapt(tmp_path / "cap", ["scheduler=conserve"], ["scheduler=ampd"], [], [("m", -51.08)], 3, 5, 0.01,
                runner=run, log=lambda *_: None)
    assert (rec.seeds, rec.stopped) == (5, "cap") and rec.metrics[0]["verdict"] == "inconclusive"
    run, _ = fake_runner([40.0, 42.0, 38.0, 41.0] * 3, [100.0] * 12)   # -60 % on every seed, tight
    rec = adapt(tmp_path / "dec", ["scheduler=conserve"], ["scheduler=ampd"], [], [("m", -51.08)], 3, 20, 0.01,
                runner=run, log=lambda *_: None)
    # decided already at 3 seeds, but a decided verdict stops a cell only from MIN_DECIDE_SEEDS = 10 seeds on:
    # the first look at or past 10 of 3, 6, 12, 20 is 12
    assert (rec.seeds, rec.stopped) == (12, "decided") and rec.metrics[0]["verdict"] == "reproduced"


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, capsys):
    # argparse's refusal (one ``error:`` line, harness.core.cmdline) is SystemExit(2)
    for bad, says in ((["--metric", "m", "--min-seeds", "1"], "--min-seeds"),
                      (["workload.seed=3", "--metric", "m"], "workload.seed=3"),
                      (["--metric", "m:abc"], "m:abc")):
        with pytest.raises(SystemExit) as e:
            seeds.main([str(tmp_path), "--a", "scheduler=conserve", "--b", "scheduler=ampd", *bad])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_run_arm_drives_run_py_into_one_sweep_dir_and_resumes(tmp_path: Path):
    """Two seeds of a tiny cell through the real ``python run.py -m``, then three: the first two are
    skipped (resume), only seed 2 runs."""
    cell = tmp_path / "cell"
    tiny = ["workload.num_conversations=2", "workload.max_turns=2", "logger.progress=false"]
    seeds.run_arm(cell, ["scheduler=conserve"], tiny, 2)
    first = {s: (cell / f"scheduler-conserve_seed{s}" / "summary.json").stat().st_mtime_ns for s in range(2)}
    seeds.run_arm(cell, ["scheduler=conserve"], tiny, 3)
    for s in range(2):
        assert (cell / f"scheduler-conserve_seed{s}" / "summary.json").stat().st_mtime_ns == first[s]
    vals = seeds.read_arm(cell, ["scheduler=conserve"], 3, ["ttfet_first_p95_s", "num_conversations"])
    assert [vals[s]["num_conversations"] for s in range(3)] == [2.0, 2.0, 2.0]
    assert all(vals[s]["ttfet_first_p95_s"] > 0 for s in range(3))
