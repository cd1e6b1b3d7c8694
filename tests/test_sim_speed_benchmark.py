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
