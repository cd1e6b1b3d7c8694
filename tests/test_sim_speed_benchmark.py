"""``benchmarks/sim_speed.py --quick`` on a tiny workload: the output's structure (every part, every target with
a verdict, the workload check), never a wall-clock number (speed targets live in the benchmark itself)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the issue's "Done when" rows the benchmark measures: 6 schedulers' calls/CPU-s ratios, events/CPU-s, run.py
# warm speed-up and CPU s, peak RSS, MB per conversation, linearity (the 480-run sweep is timed apart)
TARGETS = 12


def _bench(*args: str) -> str:
    r = subprocess.run([sys.executable, "benchmarks/sim_speed.py", "--quick", "--num-conversations", "4",
                        "--schedulers", "conserve", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _targets(out: str) -> list[tuple[str, str, str]]:
    part = out.split("## Targets of issue 21", 1)[1]
    rows = [tuple(c.strip() for c in line.strip("|").split("|")) for line in part.splitlines()
            if line.startswith("| ") and not line.startswith("| target")]
    return rows


def test_quick_without_base_prints_every_part_and_every_target():
    out = _bench("--base", "", "--conversations", "3,6,9", "--rates", "0.05,0.1")
    for heading in ("## Per scheduler", "## Cost vs arrival rate", "## Cost vs conversations", "## python run.py",
                    "## Targets of issue 21"):
        assert heading in out, heading
    assert "QUICK smoke run" in out
    # the worker builds run.py's workload (context limit included): the same number of LLM calls
    m = re.search(r"workload check: the benchmark's worker simulated (\d+) LLM calls, run.py's summary.json "
                  r"counts (\d+) \(the same\)", out)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) > 0
    rows = _targets(out)
    assert len(rows) == TARGETS
    assert all(v in ("met", "missed", "n/a") for _, _, v in rows)
    by = {w: (v, x) for w, v, x in rows}
    # without --base every ratio is n/a; the absolute targets have a measured value
    assert all(x == "n/a" for w, (v, x) in by.items() if "base" in w)
    assert by["python run.py warm <= 5 s CPU"][0].endswith(" s")
    assert by["peak RSS of the main job <= 250 MiB"][0].endswith(" MiB")
    assert any(w.startswith("<= 0.2 MB per conversation") and x in ("met", "missed") for w, (v, x) in by.items())
    linear = "cost linear in conversations (last / previous interval's marginal cost <= 1.5x)"
    assert by[linear][1] in ("met", "missed")
    # the curves: one row per point
    curve = out.split("## Cost vs conversations", 1)[1].split("##", 1)[0]
    assert [line.split("|")[1].strip() for line in curve.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()] == ["3", "6", "9"]


def test_quick_with_a_base_prints_the_ratios():
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout: no --base worktree")
    out = _bench("--base", "HEAD", "--skip", "rates,conversations")
    assert re.search(r"\| conserve \| this \|.*\| \d+\.\d\dx \|", out)
    assert re.search(r"speed-up this vs base, warm cache: CPU \d+\.\d\dx, wall \d+\.\d\dx", out)
    by = {w: x for w, _, x in _targets(out)}
    assert by["LLM calls per CPU-second >= 2x base: conserve"] in ("met", "missed")
    assert by["python run.py whole process >= 1.7x faster warm than base (CPU s)"] in ("met", "missed")
    assert by["LLM calls per CPU-second >= 4x base: wait"] == "n/a"      # not measured here


def test_the_sweep_benchmarks_split_of_the_fixed_cost_by_hand():
    """``benchmarks/sweep_executor.py``: a slice of 12 jobs whose fixed CPU is a one-off 6 s plus 0.4 s a job
    (10.8 s) and, with twice the seeds, 6 + 24 x 0.4 = 15.6 s: the slope gives 0.4 s a job and the one-off 6 s,
    so the 480-run sweep's fixed cost per run is 6 / 480 + 0.4 = 0.4125 s; the marginal split of the same slice
    (process CPU 40.8 s, loop 30 s, marginal 0.3 s: 10.8 - 12 x 0.3 = 7.2 s one-off) gives 7.2 / 480 + 0.3 = 0.315 s."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sweep_executor as se
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    one_off, per_run, per480 = se.slope_split(10.8, 15.6, 12)
    assert (one_off, per_run, per480) == pytest.approx((6.0, 0.4, 0.4125))
    assert se.one_off_split(40.8, 30.0, 0.3, 12) == pytest.approx((7.2, 0.315))
