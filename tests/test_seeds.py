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
    assert s.verdict == "reproduced" and s.why == "decided"
    # a narrower spread, sd 0.025: exp(-0.2 -+ 0.06211) - 1 = [-23.1, -12.9] %, wholly short of -25.54 %
    assert metric_state("m", [-0.2, -0.175, -0.225], -51.08, 0.1).verdict == "same direction, smaller"
    assert metric_state("m", z, -51.08, 0.1, stop_on_verdict=False).why == ""
    assert metric_state("m", z, None, 0.1).why == ""             # no paper: only the half-width decides
    assert metric_state("m", z, None, 0.13).why == "target"      # 0.1242 <= 0.13
    wide = [-0.2, -0.1, -0.3]                                     # sd 0.1: crosses 0 -> inconclusive
    assert metric_state("m", wide, -51.08, 0.1).verdict == "inconclusive"
    # the seeds the spread asks for: (4.3027 x 0.05 / 0.1)^2 = 4.63 -> 5 (between n + 1 = 4 and 2 n = 6)
    st = metric_state("m", z, None, 0.1)
    assert next_seeds([st], 3, 20, 0.1, {"m": z}) == 5
    assert next_seeds([st], 3, 4, 0.1, {"m": z}) == 4              # the cap
    assert next_seeds([st], 3, 20, 0.3, {"m": z}) == 4             # asks for fewer (0.51): at least n + 1
    # (4.3027 x 0.1 / 0.1)^2 = 18.5 -> 19, but at most 2 n = 6
    assert next_seeds([metric_state("m", wide, None, 0.1)], 3, 20, 0.1, {"m": wide}) == 6
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
    """Log ratios alternating +0.1, -0.1, by hand: n = 3: sd 0.11547, half-width 4.3027 x 0.11547 / sqrt 3 =
    0.2868 > 0.1, the spread asks for (4.3027 x 0.11547 / 0.1)^2 = 24.7 seeds -> at most 2 n = 6; n = 6: sd
    0.10954, t(0.975, 5) = 2.5706, half-width 0.1150 > 0.1, asks for (2.5706 x 0.10954 / 0.1)^2 = 7.93 -> 8;
    n = 8: sd 0.10690, t(0.975, 7) = 2.3646, half-width 0.0894 <= 0.1: stop (target)."""
    z = np.array([0.1, -0.1] * 10)
    run, calls = fake_runner(list(100.0 * np.exp(z)), [100.0] * 20)
    rec = adapt(tmp_path, ["scheduler=conserve"], ["scheduler=ampd"], ["workload.rate_per_s=0.1"], [("m", None)],
                min_seeds=3, max_seeds=20, target_halfwidth=0.1, runner=run, log=lambda *_: None)
    assert [r["seeds"] for r in rec.rounds] == [3, 6, 8] and (rec.seeds, rec.stopped) == (8, "target")
    assert [r["m"]["halfwidth"] for r in rec.rounds] == pytest.approx([0.2868, 0.1150, 0.0894], abs=2e-4)
    assert [n for arm, n in calls if arm == ("scheduler=conserve",)] == [3, 6, 8]
    rows = (tmp_path / "seeds.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("workload.rate-per-s-0.1,8,target,m,")
    md = seeds.seeds_markdown(tmp_path)
    assert "| workload.rate-per-s-0.1 | 8 | target | `m` |" in md


def test_adapt_stops_at_the_cap_and_on_a_decided_verdict(tmp_path: Path):
    spread = [100.0, 200.0, 50.0, 400.0, 25.0, 100.0]    # log ratios +-0.69 ...: never narrow
    run, _ = fake_runner(spread, [100.0] * 6)
    rec = adapt(tmp_path / "cap", ["scheduler=conserve"], ["scheduler=ampd"], [], [("m", -51.08)], 3, 5, 0.01,
                runner=run, log=lambda *_: None)
    assert (rec.seeds, rec.stopped) == (5, "cap") and rec.metrics[0]["verdict"] == "inconclusive"
    run, _ = fake_runner([40.0, 42.0, 38.0, 41.0], [100.0] * 4)   # -60 % on every seed, tight
    rec = adapt(tmp_path / "dec", ["scheduler=conserve"], ["scheduler=ampd"], [], [("m", -51.08)], 3, 20, 0.01,
                runner=run, log=lambda *_: None)
    assert (rec.seeds, rec.stopped) == (3, "decided") and rec.metrics[0]["verdict"] == "reproduced"


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, capsys):
    assert seeds.main([str(tmp_path), "--a", "scheduler=conserve", "--b", "scheduler=ampd", "--metric", "m",
                       "--min-seeds", "1"]) == 2
    assert "--min-seeds" in capsys.readouterr().err
    assert seeds.main([str(tmp_path), "workload.seed=3", "--a", "scheduler=conserve", "--b", "scheduler=ampd",
                       "--metric", "m"]) == 2
    assert seeds.main([str(tmp_path), "--a", "x=1", "--b", "y=2", "--metric", "m:abc"]) == 2
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
