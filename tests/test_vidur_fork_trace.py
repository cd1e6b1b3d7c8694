"""scripts/vidur_fork_side_by_side.py without Vidur: the exported request trace reads back exactly (arrival
times bit for bit, prompt and output lengths) in Vidur's trace-replay columns; the central window and the
t interval against values worked out by hand; a missing fork checkout stops the script with exit 2."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from harness.workload.workload import build_workload
from tests.conftest import compose_run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "vidur_fork_side_by_side.py"
_spec = importlib.util.spec_from_file_location("vidur_fork_side_by_side", SCRIPT)
fork = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fork)


def test_trace_round_trips_the_generator_exactly(tmp_path):
    run = compose_run(["+experiment=wait_paper", "workload=wait_single", "workload.rate_per_s=22",
                       "workload.num_conversations=300", "workload.seed=3", "+experiment/arm=wait_sarathi_llama3"])
    convs, _ = build_workload([], run.cfg.workload)
    rows = [(t, rec.turns[0].new_input_tokens + rec.turns[0].reused_tokens, rec.turns[0].output_tokens)
            for t, rec in convs]
    p = tmp_path / "trace.csv"
    fork.write_trace(p, rows)
    with open(p, newline="") as f:
        assert next(csv.reader(f)) == ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
    back = fork.read_trace(p)
    assert len(back) == 300
    assert [t for t, _, _ in back] == [float(t) for t, _, _ in rows]      # exact float equality
    assert {(pr, o) for _, pr, o in back} == {(512, 20)}                  # wait_single: 512 in, 20 out
    assert all(a < b for (a, _, _), (b, _, _) in zip(back, back[1:]))      # Poisson arrivals, sorted


def test_trace_rejects_rows_vidur_would_clip(tmp_path):
    with pytest.raises(ValueError, match="bad trace row"):
        fork.write_trace(tmp_path / "t.csv", [(0.0, 512, 0)])             # Vidur clips 0 output to 1


def test_central_window_and_t_interval_by_hand():
    # 8 prompts given out of arrival order; by arrival the e2e are 10, 20, ..., 80; the window is
    # prompts 2..5 (8 // 4 = 2 to 3 * 8 // 4 = 6): (30 + 40 + 50 + 60) / 4 = 45
    rows = [(float(i), 10.0 * (i + 1)) for i in range(8)]
    assert fork.central_mean(rows[::-1]) == 45.0
    # x = 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.302653 -> half-width 4.302653 / sqrt(3) = 2.484138
    m, lo, hi = fork.t_interval([1.0, 2.0, 3.0])
    assert m == 2.0
    assert hi - m == pytest.approx(2.484138, abs=1e-6) and m - lo == pytest.approx(2.484138, abs=1e-6)


def test_missing_fork_checkout_exits_2(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--fork-src", str(tmp_path / "absent"),
                        "--trace-dir", str(tmp_path / "t")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "--fork-src" in r.stderr and "general_nested_chunked_replica_scheduler.py" in r.stderr
    assert not (tmp_path / "t").exists()                                  # stopped before any work
