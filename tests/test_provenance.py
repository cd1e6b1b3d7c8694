"""Nothing mixed, nothing lost: sweep locks, run fingerprints, interrupts during the SLO baseline, errors
before work (issue 19, items 3-5). Every case runs ``run.py`` in a subprocess, as a user does, on a few
conversations of the shipped trace; interrupts are injected at a known point (``HARNESS_TEST_INTERRUPT``,
``harness.run.slo_baseline._interrupt_hook``), never by a timer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.run.config import PROJECT_ROOT
from harness.analysis.provenance import SWEEP_LOCK, DirLock, LockHeld, changed_components, mixed_components
from harness.core.trace import load_trace, write_trace
from tests.conftest import run_py_in_process

TINY = ["workload.num_conversations=4", "workload.max_turns=3", "logger.progress=false"]
SHIPPED = PROJECT_ROOT / "traces" / "swebench_verified_mini_gemini3pro.jsonl.gz"


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    env.pop("HARNESS_TEST_INTERRUPT", None)
    env.update(extra)
    return env


def _default_sigint():
    """In the child before exec: SIGINT back to its default, so Python installs its KeyboardInterrupt handler
    even when the suite itself runs with SIGINT ignored (a background job of a non-interactive shell inherits
    SIG_IGN, and Python then leaves SIGINT ignored: the interrupt tests would see no interrupt)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args, timeout=300, **env):
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=_env(**env), preexec_fn=_default_sigint)


def _state(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _wait_stopped(p: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while _state(p.pid) != "T":
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the run never reached its injected stop"
        time.sleep(0.1)


# ---- locks -------------------------------------------------------------------------------------------

def test_a_second_sweep_into_a_busy_directory_refuses_naming_the_holder(tmp_path):
    sweep = tmp_path / "sweep"
    # one process (hydra.launcher.n_jobs=1: the pool launcher runs the jobs in the launching process), so the
    # injected stop freezes the process the test watches, not a worker of it
    args = ["-m", "scheduler=collocated,conserve", *TINY, "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}"]
    # sweep A freezes itself (SIGSTOP) in job 0's SLO baseline: it is alive and holds the lock
    a = subprocess.Popen([sys.executable, "run.py", *args, "workload.rate_per_s=0.05"], cwd=PROJECT_ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(HARNESS_TEST_INTERRUPT="baseline:0:STOP"))
    try:
        _wait_stopped(a)
        assert (sweep / SWEEP_LOCK).is_file()
        b = run_cli(*args, "workload.rate_per_s=0.5")            # sweep B, another rate, same directory
        assert b.returncode == 2, b.stderr[-2000:]
        assert f"pid {a.pid} on host {socket.gethostname()}" in b.stderr and "nothing was run" in b.stderr
        assert not (sweep / "1_conserve").exists()               # B wrote no job
    finally:
        a.send_signal(signal.SIGCONT)
    out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-2000:]
    assert not (sweep / SWEEP_LOCK).exists()                    # released at the end
    rates = {json.loads(p.read_text())["workload_rate_per_s"] for p in sweep.rglob("summary.json")}
    assert rates == {0.05}                                      # nothing of B's mixed in
    # comparison.md pools A's two runs only: its cost table counts one run per variant (the rate is in no cell, and
    # a substring test for "0.5" failed on a run's "40.5%")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in (sweep / "comparison.md").read_text().splitlines()
            if line.startswith(("| collocated |", "| conserve |"))]
    assert sorted((r[0], r[1]) for r in rows if len(r) == 8) == [("collocated", "1"), ("conserve", "1")]


def test_a_lock_left_by_a_dead_holder_is_taken_over_and_the_log_says_so(tmp_path):
    sweep = tmp_path / "sweep"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sweep.mkdir()
    (sweep / SWEEP_LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "then"}))
    r = run_cli("-m", "scheduler=collocated", *TINY, "slo=absolute", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"taking over the stale lock of pid {dead.pid}" in r.stderr
    assert (sweep / "0_collocated" / "summary.json").is_file() and not (sweep / SWEEP_LOCK).exists()


def test_dir_lock_in_process(tmp_path):
    """A live holder (another process) is refused with its record; the OS frees the lock when it dies."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from harness.analysis.provenance import DirLock\n"
        f"DirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"pid {holder.pid} "):
            DirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = DirLock(tmp_path).acquire()          # SIGKILLed holder: its flock is gone, its record is stale
    assert lock.took_over["pid"] == holder.pid
    lock.release()
    assert not (tmp_path / SWEEP_LOCK).exists()


# ---- fingerprints ------------------------------------------------------------------------------------

def test_a_trace_rewritten_in_place_recomputes_the_job_and_says_why(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    convs = load_trace(SHIPPED)[:6]
    write_trace(trace, convs)
    sweep = tmp_path / "sweep"
    args = ["-m", "scheduler=collocated,conserve", *TINY, "slo=absolute", f"workload.trace={trace}",
            f"hydra.sweep.dir={sweep}"]
    r1 = run_cli(*args)
    assert r1.returncode == 0, r1.stderr[-2000:]
    before = {p.parent.name: json.loads(p.read_text()) for p in sweep.rglob("summary.json")}
    r2 = run_cli(*args)                                                  # unchanged: both skipped
    assert r2.returncode == 0 and r2.stdout.count("already complete") == 2, r2.stdout[-2000:]
    from dataclasses import replace
    # every turn's output doubled: a different workload under the same path and the same config text
    write_trace(trace, [replace(c, turns=tuple(replace(t, output_tokens=2 * t.output_tokens,
                                                       output_tokens_raw=2 * t.output_tokens) for t in c.turns))
                        for c in convs])
    r3 = run_cli(*args)
    assert r3.returncode == 0, r3.stderr[-2000:]
    assert "already complete" not in r3.stdout
    assert r3.stderr.count("recomputing this job: its fingerprint changed: trace (") == 2, r3.stderr[-3000:]
    after = {p.parent.name: json.loads(p.read_text()) for p in sweep.rglob("summary.json")}
    for job in before:  # recomputed on the new trace: twice the output tokens (the run served all of them)
        assert after[job]["output_tokens"] == 2 * before[job]["output_tokens"] > 0, job
    # the report sees one code and one trace content: nothing mixed, exit 0 (run in this process: its command line
    # is tests/test_report.py's; a process of its own cost ~2.5 CPU s of imports each time)
    from harness.analysis import report
    assert report.main([str(sweep), "--no-figures"]) == 0, capsys.readouterr().err[-2000:]
    runs = pd.read_csv(sweep / "report" / "runs.csv")
    assert not runs["mixed"].any() and runs["trace_fingerprint"].nunique() == 1

    # a job whose meta.json says another code version: the report flags the mix and exits 3
    meta_p = sweep / "1_conserve" / "meta.json"
    meta = json.loads(meta_p.read_text())
    meta["fingerprint"]["components"]["code"] = "0" * 32
    meta_p.write_text(json.dumps(meta))
    capsys.readouterr()
    rc, err = report.main([str(sweep), "--no-figures"]), capsys.readouterr().err
    assert rc == 3 and "2 different code versions" in err, err[-2000:]
    md = (sweep / "report" / "report.md").read_text()
    assert md.startswith("> **WARNING: this sweep mixes results that are not comparable")
    runs = pd.read_csv(sweep / "report" / "runs.csv").set_index("run")
    assert bool(runs.loc["1_conserve", "mixed"]) != bool(runs.loc["0_collocated", "mixed"])
    assert report.main([str(sweep), "--no-figures", "--allow-mixed"]) == 0, capsys.readouterr().err[-2000:]
    # and a resume recomputes that job, naming the code
    r4 = run_cli(*args)
    assert r4.returncode == 0 and r4.stdout.count("already complete") == 1, r4.stdout[-2000:]
    assert "1_conserve: recomputing this job: its fingerprint changed: code (000000000000 ->" in r4.stderr


def test_fingerprint_comparisons_by_hand():
    fp = {"components": {"config": "c", "profiles": "p", "trace": "t1", "code": "k"}, "trace_path": "/a"}
    other = {"components": {**fp["components"], "trace": "t2"}, "trace_path": "/a"}
    assert changed_components(fp, fp) == []
    assert changed_components(fp, other) == ["trace (t1 -> t2)"]
    assert changed_components(None, fp)[0].startswith("no fingerprint recorded")
    assert mixed_components([fp, fp]) == {}
    assert mixed_components([fp, other]) == {"trace": 2}                  # one path, two contents
    assert mixed_components([fp, {**other, "trace_path": "/b"}]) == {}    # a sweep over two traces: fine
    assert mixed_components([fp, {"components": {**fp["components"], "code": "k2"}, "trace_path": "/a"},
                             None]) == {"code": 2, "fingerprint": 1}


# ---- interrupts during the SLO baseline -------------------------------------------------------------

@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_interrupt_during_the_slo_baseline_exits_130_with_a_partial_summary(tmp_path, sig):
    out = tmp_path / "run"
    r = run_cli(*TINY, f"hydra.run.dir={out}", HARNESS_TEST_INTERRUPT=f"baseline:2:{sig}")
    assert r.returncode == 130, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["partial"] is True and s["error"].startswith("KeyboardInterrupt")
    assert "SLO baseline" in s["error"] and "2 of 4 conversations done" in s["error"]
    assert ("SIGTERM" in s["error"]) == (sig == "TERM")
    assert s["num_turns"] == 0                                         # the main run never started
    assert json.loads((out / "interrupted.json").read_text())["interrupted"] is True
    assert (out / "turns.parquet").is_file() and (out / "conversations.parquet").is_file()


def test_an_interrupt_during_a_sweep_jobs_baseline_stops_the_sweep_and_marks_the_job(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("-m", "scheduler=collocated,conserve", *TINY, "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
                HARNESS_TEST_INTERRUPT="baseline:1")   # jobs one after another (n_jobs=1): job 1 never starts
    assert r.returncode == 130, r.stderr[-2000:]
    assert "the sweep stops here" in r.stderr
    job0 = sweep / "0_collocated"
    assert json.loads((job0 / "summary.json").read_text())["partial"] is True
    assert (job0 / "interrupted.json").is_file()
    assert not (sweep / "1_conserve").exists() and not (sweep / "comparison.md").exists()
    assert not (sweep / SWEEP_LOCK).exists()
    r2 = run_cli("-m", "scheduler=collocated,conserve", *TINY, f"hydra.sweep.dir={sweep}")  # resume
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert "0_collocated: recomputing this job: the previous run there is partial (KeyboardInterrupt" in r2.stderr
    assert not (job0 / "interrupted.json").exists()
    assert json.loads((job0 / "summary.json").read_text())["partial"] is False


# ---- errors before work ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [["workload.num_conversations=1"],
                                   ["model=tiny", "workload.num_conversations=2", "slo=absolute"]])
def test_a_workload_emptied_by_context_drops_fails_before_work_naming_the_keys(tmp_path, extra, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setenv("HARNESS_CACHE_DIR", "off")
    r = run_py_in_process(["logger.progress=false", *extra, f"hydra.run.dir={out}"], monkeypatch, capsys)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "workload.token_scale" in r.stderr and "workload.context_overflow=drop" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_a_sweep_with_an_emptied_workload_or_a_scheduler_cluster_mismatch_fails_before_any_job(tmp_path):
    """One sweep (one run.py: the two cases were two sweeps until 2026-12-06, ~2.9 CPU s each) of four jobs on
    a40_4x (collocated instances only): job 0 (collocated, 1 conversation) has only an emptied workload (the
    shipped trace's first conversation needs more than the model's context), job 3 (conserve, 4 conversations)
    only a scheduler / cluster mismatch (ConServe needs a prefiller), job 1 (collocated, 4) is valid, job 2 has
    both; each invalid job is named with its own error, and the valid job is not run either."""
    sweep = tmp_path / "sweep"
    r = run_cli("-m", "scheduler=collocated,conserve", "workload.num_conversations=1,4", "cluster=a40_4x",
                "logger.progress=false", "slo=absolute", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2 and "3 of 4 sweep jobs are invalid" in r.stderr, r.stderr[-2000:]
    job = {ln.split(" (", 1)[0].strip(): ln for ln in r.stderr.splitlines() if ln.startswith("  job ")}
    assert sorted(job) == ["job 0", "job 2", "job 3"], r.stderr[-2000:]
    assert "workload.token_scale" in job["job 0"] and "workload.context_overflow=drop" in job["job 0"]
    assert "needs at least one instance with role 'prefiller'" in job["job 3"]
    assert not (sweep / "0_collocated").exists() and not (sweep / "1_collocated").exists()


def test_the_sweeps_comparison_table_is_headed_by_a_warning_when_code_versions_mix(tmp_path):
    from omegaconf import OmegaConf

    from harness.run.callbacks import SummaryTableCallback
    base = {"scheduler": "conserve", "cluster": "c", "model": "m", "workload": "w", "partial": False,
            "num_conversations": 1}
    for i, code in enumerate(["a" * 32, "b" * 32]):
        d = tmp_path / f"{i}_conserve"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(base))
        fp = {"components": {"config": "c", "profiles": "p", "trace": "t", "code": code}, "trace_path": "/t"}
        (d / "meta.json").write_text(json.dumps({"fingerprint": fp}))
    SummaryTableCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    text = (tmp_path / "comparison.md").read_text()
    assert text.startswith("**WARNING: this sweep mixes results that are not comparable: 2 different code versions")


def test_package_versions_read_once_are_the_installed_ones():
    """meta.json's package versions: what importlib.metadata says for each distribution (looked up here
    directly), the same on a second call (read once per process), and a caller's edit of the returned dict
    never reaches the next call."""
    import sys
    from importlib import metadata

    from harness.run.runner import package_versions
    first = package_versions()
    assert first == {"python": sys.version.split()[0],
                     **{p: metadata.version(p) for p in ("hydra-core", "omegaconf", "numpy", "pandas", "pyarrow",
                                                         "tqdm")}}
    first["numpy"] = "edited"
    assert package_versions()["numpy"] == metadata.version("numpy")


def test_the_fingerprint_reads_the_typed_input_and_digests_the_trace_bytes(tmp_path):
    """``fingerprint`` reads a ``FingerprintInput`` (instances, model profile, trace path), never the run config:
    the trace component is the SHA-256 of the file's bytes (computed here with hashlib), the config component
    that of the config text, a synthetic workload has none; a model profile edit changes ``profiles`` only."""
    import dataclasses
    import hashlib

    from harness.analysis.provenance import FingerprintInput, fingerprint
    from harness.run.config import fingerprint_input
    from tests.conftest import compose_run
    trace = tmp_path / "t.jsonl"
    write_trace(trace, load_trace(SHIPPED)[:2])
    run = compose_run([f"workload.trace={trace}"])
    inp = fingerprint_input(run)
    assert isinstance(inp, FingerprintInput) and inp.trace_path == run.trace_path
    fp = fingerprint(inp, "a: 1\n")
    assert fp["components"]["trace"] == hashlib.sha256(trace.read_bytes()).hexdigest()[:32]
    assert fp["components"]["config"] == hashlib.sha256(b"a: 1\n").hexdigest()[:32]
    assert fp["trace_path"] == str(run.trace_path)
    syn = fingerprint(dataclasses.replace(inp, trace_path=None), "a: 1\n")
    assert syn["components"]["trace"] == "synthetic" and syn["trace_path"] is None
    other = dataclasses.replace(inp, model=dataclasses.replace(inp.model, num_layers=inp.model.num_layers + 1))
    assert changed_components(fp, fingerprint(other, "a: 1\n"))[0].startswith("profiles (")
    assert len(changed_components(fp, fingerprint(other, "a: 1\n"))) == 1
