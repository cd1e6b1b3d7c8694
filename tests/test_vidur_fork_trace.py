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


def _attention_rows():
    with open(ROOT / "docs" / "data" / "vidur_llama3_8b_a100_attention_ms.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_pool_decode_rows_counts_by_hand(tmp_path):
    """The shipped subset has decode rows at batch sizes 1-128, then 136-512 by 8 (1 + 127 + 48 = 176 sizes),
    and prefill rows at chunks 64, 128, 192, 256, 512, 544, 1024, 1088, 1152: they meet at 64, 128, 192, 256
    and 512. 30 copies each: 5 x 30 = 150 rows ('meet'), 176 x 30 = 5,280 ('all')."""
    from scripts.vidur_reference_predictions import write_vidur_inputs
    _, attn = write_vidur_inputs(tmp_path)
    n0 = len(_attention_rows())
    assert fork.pool_decode_rows(attn, tmp_path / "meet.csv", "meet") == 150
    assert fork.pool_decode_rows(attn, tmp_path / "all.csv", "all") == 5280
    with open(tmp_path / "meet.csv", newline="") as f:
        meet = list(csv.DictReader(f))
    assert len(meet) == n0 + 150
    # Vidur drops duplicate rows on load (pandas drop_duplicates): every added row must survive it
    keys = [tuple(r.values()) for r in meet]
    assert len(set(keys[n0:])) == 150 and not set(keys[n0:]) & set(keys[:n0])
    # Vidur's pooled KV-write rows at 512 tokens (max(chunk, batch) = 512): 32 prefill + 1 decode as shipped,
    # 32 + 31 after pooling; at 504 the one decode row stays one ('meet') and becomes 31 ('all')
    def at(rows, n):
        return sum(1 for r in rows if max(int(r["batch_size"]), int(r["prefill_chunk_size"])) == n)
    assert at(meet, 512) == 63 and at(meet, 504) == 1
    with open(tmp_path / "all.csv", newline="") as f:
        assert at(list(csv.DictReader(f)), 504) == 31
    with pytest.raises(ValueError, match="where"):
        fork.pool_decode_rows(attn, tmp_path / "x.csv", "some")


def test_ratio_summary_spread_over_forest_seeds_by_hand():
    # two forest seeds x two workload seeds; central means (s): ratios -10 %, -20 % (seed 0), -30 %, -40 % (1)
    sar = {0: [(10.0, 10.0), (10.0, 10.0)], 1: [(10.0, 10.0), (10.0, 10.0)]}
    wcp = {0: [(9.0, 9.0), (8.0, 8.0)], 1: [(7.0, 7.0), (6.0, 6.0)]}
    st = fork.ratio_summary(sar, wcp)
    assert st["per_fs"] == pytest.approx([-0.15, -0.35])
    assert st["mean"] == pytest.approx(-0.25) and st["lo"] == pytest.approx(-0.35) and st["hi"] == pytest.approx(-0.15)
    # per workload seed averaged over forest seeds: -20 %, -30 %: mean -25 %, sd 0.0707, t(0.975, 1) = 12.7062
    m, lo, hi = st["t"]
    assert m == pytest.approx(-0.25) and hi - m == pytest.approx(12.7062 * 0.070711 / 2 ** 0.5, rel=1e-4)


def test_table_has_the_vllm_like_arm_with_its_spread(capsys):
    """A row per comparison whose arms ran: with a vLLM-like arm, WAIT-CP / vLLM-like and Sarathi / vLLM-like are
    printed beside WAIT-CP / Sarathi, each with its spread over forest seeds. By hand: vLLM-like 20 s on every
    seed, Sarathi 10 s, WAIT-CP 9 / 8 s (forest seed 0) and 7 / 6 s (1): WAIT-CP / vLLM-like per forest seed
    -57.5 %, -67.5 %; Sarathi / vLLM-like -50 % on both."""
    ten, twenty = [(10.0, 10.0), (10.0, 10.0)], [(20.0, 20.0), (20.0, 20.0)]
    table = {("fork:public", 22.0): {"sarathi": {0: ten, 1: ten}, "vllm": {0: twenty, 1: twenty},
                                     "wait_cp": {0: [(9.0, 9.0), (8.0, 8.0)], 1: [(7.0, 7.0), (6.0, 6.0)]}},
             ("ours:roofline", 22.0): {"sarathi": {None: ten}, "wait_cp": {None: ten}}}
    fork.print_table(table, [22.0], [0, 1], [0, 1], type("A", (), {"n": 4, "vidur_grid": "reduced"})())
    out = capsys.readouterr().out
    assert "| fork:public | 22 | WAIT-CP / vLLM-like | 7.500 | 20.000 | -62.50% | [-67.50%, -57.50%] |" in out
    assert "| fork:public | 22 | Sarathi / vLLM-like | 10.000 | 20.000 | -50.00% | [-50.00%, -50.00%] |" in out
    assert "| fork:public | 22 | WAIT-CP / Sarathi | 7.500 | 10.000 | -25.00% | [-35.00%, -15.00%] |" in out
    # ours ran no vLLM-like arm here: its one row, no spread (no forest)
    assert "| ours:roofline | 22 | WAIT-CP / Sarathi |" in out and "ours:roofline | 22 | Sarathi / vLLM" not in out
    assert "n/a (no forest)" in out


def test_changed_profile_file_is_named(tmp_path):
    import shutil
    for name in fork.PROFILE_SHA256:
        shutil.copy(ROOT / "docs" / "data" / name, tmp_path / name)
    assert fork.check_profile(tmp_path) == []
    p = tmp_path / "vidur_llama3_8b_a100_attention_ms.csv"
    p.write_text(p.read_text() + "1,64,0,True,0.011,0.0,0.019,0\n")
    (bad,) = fork.check_profile(tmp_path)
    assert bad.startswith("vidur_llama3_8b_a100_attention_ms.csv: sha256 ")
