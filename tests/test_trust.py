"""Results a researcher can trust: never silent, never lost, never ambiguous.

Each test is one way a user could misuse the harness (or one way a run could go wrong) and the behaviour a
careful user expects: bounded memory and time, runs that never overwrite each other, interrupts that keep
what was measured, failures that are counted and shown, a validity verdict, strict JSON, atomic files,
checked names, honest provenance, servers that die with the harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.run.config import PROJECT_ROOT, ConfigError
from harness.run.runner import completed_run, execute
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation, pid_alive, run_py_in_process

TINY = ["workload.num_conversations=4", "workload.max_turns=3", "logger.progress=false", "slo=absolute"]


def run_cli(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


# ---- bounded memory and time -------------------------------------------------------------------------

def test_a_very_low_rate_keeps_the_instance_samples_bounded(tmp_path):
    """At 1e-6 conv/s the 3 arrivals span ~ 3e6 s of mostly idle time; sampling every simulated second would
    write ~ 4 instances x 3e6 rows. Idle stretches get no samples, so the rows are bounded by the events."""
    run = compose_run(["workload.rate_per_s=1e-6", "workload.num_conversations=3", "logger.progress=false",
                       "model.max_model_len=0"])
    s = execute(run, tmp_path)
    inst = pd.read_parquet(tmp_path / "instances.parquet")
    assert s["num_conversations"] == 3 and not s["partial"]
    assert s["window_s"] > 1e5                                   # the span really is huge
    assert len(inst) < 4 * (s["sim_events"] + 10)               # bounded by events, not by the span


def test_a_tool_time_that_is_an_epoch_timestamp_stops_the_run_naming_the_limit(tmp_path, monkeypatch):
    """A trace whose tool time is a Unix timestamp (1.7e9 s) would keep the clock running for 54 years: the
    run stops at backend.max_sim_time_s (a year), partial, with the key in the error."""
    conv = conversation("epoch", [(0, 100, 5, 1.7e9), (105, 10, 5, 0.0)])
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: [conv])
    run = compose_run(["workload.num_conversations=1", "logger.progress=false", "slo=absolute"])
    with pytest.raises(RuntimeError, match="backend.max_sim_time_s"):
        execute(run, tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["partial"] is True and s["num_turns"] == 1        # the first turn was measured and kept


# ---- run directories: unique, never overwritten, resumable -----------------------------------------------

def test_two_runs_in_the_same_second_get_different_directories():
    from tests.conftest import compose_cfg
    cfg = compose_cfg(return_hydra_config=True)
    # the run directory holds this process's id besides the time (to the second)
    assert str(os.getpid()) in str(cfg.hydra.run.dir) and str(os.getpid()) in str(cfg.hydra.sweep.dir)


def test_a_directory_holding_another_config_is_never_overwritten(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"partial": False, "x": 1}))
    (tmp_path / "config.yaml").write_text("a: 1\n")
    assert completed_run(tmp_path, "a: 1\n") == {"partial": False, "x": 1}     # same config: skip
    with pytest.raises(ConfigError, match="another config"):
        completed_run(tmp_path, "a: 2\n")
    (tmp_path / "summary.json").write_text(json.dumps({"partial": True}))
    assert completed_run(tmp_path, "a: 1\n") is None                          # partial: run it again
    assert completed_run(tmp_path / "new", "a: 1\n") is None


def test_a_sweep_rerun_skips_complete_jobs_and_an_invalid_job_stops_it_before_anything_runs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "scheduler=collocated,conserve", *TINY, f"hydra.sweep.dir={sweep}"]
    r1 = run_cli(*args)
    assert r1.returncode == 0, r1.stderr[-2000:]
    r2 = run_cli(*args)
    assert r2.returncode == 0 and r2.stdout.count("already complete") == 2, r2.stdout[-2000:]
    bad = tmp_path / "bad"
    r3 = run_cli("-m", "scheduler=collocated", "workload.rate_per_s=0.5,-1", *TINY, f"hydra.sweep.dir={bad}")
    assert r3.returncode == 2 and "1 of 2 sweep jobs are invalid" in r3.stderr, r3.stderr[-2000:]
    assert "workload.rate_per_s" in r3.stderr and not bad.exists()


def test_sigterm_mid_run_writes_partial_results(tmp_path):
    # SIGTERM as the 6th conversation finishes (HARNESS_TEST_INTERRUPT, harness.run.runner._test_interrupt), not
    # after a timer: a timer could land after the loop, where the run is complete (tests/test_interrupt.py)
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "run.py", "logger.progress=false", "slo=absolute", "workload.num_conversations=20",
                        f"hydra.run.dir={out}"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HARNESS_TEST_INTERRUPT": "run:5:TERM"})
    err = p.stderr
    assert p.returncode == 130, err[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["partial"] is True and "SIGTERM" in s["error"]
    assert (out / "turns.parquet").is_file() and len(pd.read_parquet(out / "turns.parquet")) > 0


# ---- failures are counted and shown ----------------------------------------------------------------------

def _single(monkeypatch, convs):
    import harness.run.runner as runner
    monkeypatch.setattr(runner, "load_trace", lambda path: convs)


def test_a_prompt_bigger_than_the_kv_cache_is_a_counted_failure_and_an_invalid_run(tmp_path, monkeypatch):
    # 400,000 + 10 tokens need 25,001 blocks of 16; an A40 holds 347,552 / 16 = 21,722 blocks (docs/hardware.md)
    _single(monkeypatch, [conversation("big", [(0, 400_000, 10, 0.0)]), conversation("ok", [(0, 100, 5, 0.0)])])
    run = compose_run(["workload.num_conversations=2", "logger.progress=false", "slo=absolute",
                       "model.max_model_len=0", "scheduler=collocated", "cluster=a40_4x"])
    s = execute(run, tmp_path)
    assert s["num_conversations_failed"] == 1 and s["num_turns_failed"] == 1
    assert s["failed_turns_by_reason"] == {"needs": 1}
    assert s["valid"] is False and any("1 of 2 conversations failed" in r for r in s["invalid_reasons"])


@pytest.mark.parametrize(("policy", "kept_turns", "failed"), [("drop", None, 0), ("truncate", 2, 0), ("fail", 3, 1)])
def test_context_overflow_policies(policy, kept_turns, failed, tmp_path, monkeypatch):
    """Turn prompts + outputs of 105, 205, 5005 tokens against a 1,000-token context: drop removes the
    conversation, truncate keeps its first 2 turns (the second becomes the visible one), fail runs it and the
    third turn fails as a server would reject it."""
    conv = conversation("long", [(0, 100, 5, 1.0), (105, 95, 5, 1.0), (205, 4795, 5, 0.0)])
    short = conversation("short", [(0, 50, 5, 0.0)])
    _single(monkeypatch, [conv, short])
    run = compose_run(["workload.num_conversations=2", "workload.sample=first", "logger.progress=false",
                       "slo=absolute", "model.max_model_len=1000", f"workload.context_overflow={policy}",
                       "scheduler=collocated", "cluster=a40_4x"])
    s = execute(run, tmp_path)
    t = pd.read_parquet(tmp_path / "turns.parquet")
    mine = t[t.conversation_id == "long"]
    if kept_turns is None:
        assert mine.empty and s["num_conversations_context_dropped"] == 1 and s["num_conversations"] == 1
    else:
        assert len(mine) == kept_turns and s["num_conversations"] == 2
    if policy == "truncate":
        assert s["num_conversations_context_truncated"] == 1 and mine.visible.tolist() == [False, True]
    assert s["num_conversations_failed"] == failed
    if failed:
        assert s["failed_turns_by_reason"] == {"context_length": 1}


# ---- statistics that mean what they say ----------------------------------------------------------------

def test_the_top_level_seed_changes_the_workload():
    a, b = (compose_run([f"seed={k}"]).cfg.workload for k in (1, 2))
    assert a.seed == 1 and b.seed == 2                  # the workload draws from the run's seed
    convs = [conversation(f"c{i}", [(0, 10, 2, 0.0)]) for i in range(10)]
    ta = [t for t, _ in build_workload(convs, WorkloadConfig(seed=a.seed, rate_per_s=1.0))[0]]
    tb = [t for t, _ in build_workload(convs, WorkloadConfig(seed=b.seed, rate_per_s=1.0))[0]]
    assert ta != tb


def test_serving_metrics_and_the_verdict_by_hand():
    """Three completed turns in a 10 s window: 0.3 requests/s; prompt tokens 100 + 200 + 300 = 600 -> 60/s;
    output 10 + 20 + 30 = 60 -> 6/s; ITL gaps [1, 2, 3, 4] -> p50 = 2.5 (linear interpolation), p99 =
    3 + 0.97 x 1 = 3.97; a run with 2 steady-state conversations is invalid under min_conversations = 100."""
    from harness.analysis.validity import ValidityConfig, serving_metrics, verdict
    turns = pd.DataFrame({"status": ["ok"] * 3, "prompt_tokens": [100, 200, 300], "output_tokens": [10, 20, 30],
                          "ttft_s": [0.1, 0.2, 0.3], "tpot_s": [0.01, 0.02, 0.03], "e2e_s": [1.0, 2.0, 3.0]})
    m = serving_metrics(turns, 10.0, [50, 99], np.array([1.0, 2.0, 3.0, 4.0]))
    assert m["request_throughput_per_s"] == pytest.approx(0.3)
    assert m["prompt_token_throughput_per_s"] == pytest.approx(60.0)
    assert m["output_token_throughput_per_s"] == pytest.approx(6.0)
    assert m["total_token_throughput_per_s"] == pytest.approx(66.0)
    assert m["itl_p50_s"] == pytest.approx(2.5) and m["itl_p99_s"] == pytest.approx(3.97)
    assert m["ttft_p50_s"] == pytest.approx(0.2)
    # arrivals 0..100: warm-up 10 %, cool-down 10 % -> steady window [10, 90] holds the arrivals 50 and 90
    conv = pd.DataFrame({"arrival_s": [0.0, 50.0, 90.0, 100.0], "ttfet_s": [1.0, 2.0, 3.0, 4.0],
                         "slo_met": [True, True, False, True]})
    v = verdict({"num_conversations": 4, "num_conversations_failed": 0}, conv, ValidityConfig())
    assert v["steady_conversations"] == 2 and v["steady_slo_attainment"] == pytest.approx(0.5)
    assert v["valid"] is False and "2 steady-state conversations" in v["invalid_reasons"][0]


def test_configurable_percentiles_reach_the_summary(tmp_path):
    s = execute(compose_run(TINY + ["logger.percentiles=[75,99.9]"]), tmp_path)
    assert {"ttft_p75_s", "tpot_p99.9_s", "itl_p75_s", "e2e_p99.9_s"} <= set(s)


# ---- files: strict JSON, atomic writes ------------------------------------------------------------------

def test_summary_json_is_strict_json(tmp_path):
    """A run with no steady-state conversations has missing values (NaN in Python): summary.json carries them as
    null, which strict parsers accept, and never as NaN or 0."""
    execute(compose_run(TINY + ["validity.warmup_frac=0.5", "validity.cooldown_frac=0.49"]), tmp_path)

    def reject(c):
        raise ValueError(f"non-standard JSON constant {c}")
    s = json.loads((tmp_path / "summary.json").read_text(), parse_constant=reject)
    assert s["steady_conversations"] == 0 and s["steady_ttfet_p95_s"] is None


def test_a_failed_write_leaves_no_truncated_file(tmp_path, monkeypatch):
    from harness.core.recorder import write_parquet
    df = pd.DataFrame({"a": [1, 2, 3]})
    write_parquet(df, tmp_path / "x.parquet")

    def boom(self, path, **kw):
        Path(path).write_bytes(b"PAR1 truncated")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(OSError):
        write_parquet(pd.DataFrame({"a": [9]}), tmp_path / "x.parquet")
    monkeypatch.undo()
    assert pd.read_parquet(tmp_path / "x.parquet").a.tolist() == [1, 2, 3]     # the old file, intact
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]               # no temporary left


# ---- inputs that became paths or late crashes -----------------------------------------------------------

@pytest.mark.parametrize(("override", "key"), [
    ("cluster.name=../../../OUTSIDE", "cluster.name"),
    ("hardware.a40.mem_bytes=1e30", "hardware.a40.mem_bytes"),
    ("cluster.link.latency_s=inf", "cluster.link.latency_s"),
    ("hardware.a40.step_overhead_s=inf", "hardware.a40.step_overhead_s"),
    ("validity.warmup_frac=0.95", "validity.warmup_frac"),
    ("logger.percentiles=[120]", "logger.percentiles"),
    ("workload.context_overflow=ignore", "workload.context_overflow"),
])
def test_absurd_values_are_rejected_up_front_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_run([override])


def test_a_negative_predictor_seed_is_rejected_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="predictor.seed"):
        execute(compose_run(TINY + ["scheduler=ampd", "scheduler.predictor.seed=-1"]), tmp_path)


def test_provenance_outside_a_git_checkout_is_unknown(tmp_path, monkeypatch):
    import harness.run.runner as runner
    outer = tmp_path / "other_repo"
    (outer / "project").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    monkeypatch.setattr(runner, "PROJECT_ROOT", outer / "project")   # inside another repository
    v = runner.code_version()
    assert v["git_sha"] == "unknown" and v["git_dirty"] is None
    monkeypatch.setattr(runner, "PROJECT_ROOT", tmp_path / "nowhere")
    (tmp_path / "nowhere").mkdir()
    assert runner.code_version()["git_sha"] == "unknown"


def test_a_directory_as_trace_says_so():
    with pytest.raises(ConfigError, match="is a directory"):
        compose_run([f"workload.trace={PROJECT_ROOT / 'traces'}"])


# ---- /metrics parsing --------------------------------------------------------------------------------

def test_metrics_parsing_survives_braces_in_labels_and_averages_kv_usage_over_engines():
    from harness.vllm.scrape import parse_metrics
    text = ('# TYPE vllm:kv_cache_usage_perc gauge\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="a}b"} 0.5\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="a}b"} 0.7\n'
            '# TYPE vllm:prefix_cache_hits counter\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="a}b"} 3\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="a}b"} 4\n')
    s = parse_metrics(text)
    assert s.get("kv_cache_usage_perc") == pytest.approx(0.6)    # a fraction per engine: averaged, never > 1
    assert s.get("prefix_cache_hits_total") == 7                  # counters: summed


# ---- servers die with the harness ------------------------------------------------------------------------

def test_a_launched_server_dies_when_the_harness_is_killed_with_sigkill(tmp_path):
    """The launcher starts servers with a parent-death signal: SIGKILL the parent, the child goes too."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from harness.vllm.launcher import _die_with_parent\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], preexec_fn=_die_with_parent)\n"
        "print(c.pid, flush=True); time.sleep(120)\n")], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.kill()
    parent.wait(timeout=30)
    for _ in range(100):
        if not pid_alive(child):
            break
        time.sleep(0.1)
    assert not pid_alive(child)


# A server left behind on a port, and one of a live run: tests/test_launcher_guard.py


def test_a_config_error_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    r = run_py_in_process(["workload.rate_per_s=-1", f"hydra.run.dir={out}"], monkeypatch, capsys)
    assert r.returncode == 2 and "workload.rate_per_s" in r.stderr
    assert not out.exists()


def test_the_report_flags_invalid_runs(tmp_path):
    """Two runs of one point, one of them invalid: the report says so and marks the point."""
    from harness.analysis import report
    import yaml
    for i, valid in enumerate([True, False]):
        d = tmp_path / f"{i}_collocated_seed{i}"
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({"scheduler": {"name": "collocated"},
                                                       "workload": {"seed": i, "rate_per_s": 0.1}}))
        (d / "summary.json").write_text(json.dumps({"num_conversations": 10, "slo_attainment": 0.9, "partial": False,
                                                    "valid": valid, "ttfet_p95_s": 1.0}))
    res = report.report(tmp_path, tmp_path / "rep", draw=False)
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "1 runs are INVALID" in text and "1_collocated_seed1" in text and "✗1" in text
    assert res["points"]["invalid_runs"].tolist() == [1]
