"""Exit statuses as each tool's ``--help`` states, and one error line instead of a traceback (issue 32, item 4):
a bad hardware profile is bad input for ``harness.tools.fidelity`` (2, not 1 = a target missed); a trace value
too large for any model (``output_length`` 10^20) is one line naming the file, line and field (2) in
``tracestats`` and in ``run.py``; a run directory that cannot be written (a path under a regular file: root
ignores mode bits, so a read-only directory is no test here) and a file-size limit (``ulimit -f``, through
``RLIMIT_FSIZE``) are one line naming the path, exit 2, before anything runs or, when a results file cannot
be written at the end, with the rest of the results written and marked partial."""

from __future__ import annotations

import errno
import gzip
import json
import os
import resource
import signal
import subprocess
import sys

import pytest

from harness.run.config import PROJECT_ROOT
from tests.conftest import run_py_in_process

SHIPPED = PROJECT_ROOT / "traces" / "swebench_verified_mini_gemini3pro.jsonl.gz"
HUGE = 10**20


def run_cli(*args, fsize: int | None = None):
    """``run.py`` in a subprocess; ``fsize``: the file-size limit (bytes) it runs under (SIGXFSZ ignored, as
    Python itself does, so a write past it fails with EFBIG)."""
    def limits():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    env.pop("HARNESS_TEST_INTERRUPT", None)
    return subprocess.run([sys.executable, "run.py", *args, "logger.progress=false"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300, env=env, preexec_fn=limits)


def run_in_process(monkeypatch, capsys, *args):
    """:func:`run_cli` without a file-size limit, ``run.py``'s main run in this process
    (:func:`tests.conftest.run_py_in_process`), in :func:`run_cli`'s environment."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", "off")
    monkeypatch.delenv("HARNESS_TEST_INTERRUPT", raising=False)
    return run_py_in_process([*args, "logger.progress=false"], monkeypatch, capsys)


def one_error_line(stderr: str) -> str:
    """The only ``error:`` line of ``stderr``, which holds no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


# ---- fidelity: a bad profile is bad input ---------------------------------------------------------------

@pytest.mark.parametrize("text,says", [
    ("name: x\n  peak_flops: [\n", "mapping values are not allowed"),        # not YAML
    ("- 1\n- 2\n", "unknown hardware field"),                                   # not a mapping
    ("name: x\n", "peak_flops must be a finite number > 0"),                    # fields missing
])
def test_fidelity_exits_2_on_a_bad_profile_before_anything_runs(tmp_path, capsys, text, says):
    from harness.tools.fidelity import main
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    # --launch would start the real side: the profile is refused before it (no such run directory either)
    assert main([str(tmp_path / "run"), "--profile", str(bad), "--launch", "backend=vllm"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(bad) in line and says in line, line
    assert not (tmp_path / "run").exists()


# ---- a trace value too large -----------------------------------------------------------------------------

def _huge_traces(tmp_path):
    req = tmp_path / "req.jsonl"
    req.write_text(json.dumps({"timestamp": 0, "input_length": 100, "output_length": HUGE}) + "\n"
                   + json.dumps({"timestamp": 10, "input_length": 100, "output_length": 10}) + "\n")
    first = json.loads(gzip.open(SHIPPED, "rt").readline())
    first["turns"][0].update(output_tokens=HUGE, output_tokens_raw=HUGE)
    conv = tmp_path / "conv.jsonl"
    conv.write_text(json.dumps(first) + "\n")
    return {"output_length": req, "turns[0].output_tokens": conv}


def test_tracestats_names_a_huge_token_count_and_exits_2(tmp_path, capsys):
    from harness.tools.tracestats import main
    for field, path in _huge_traces(tmp_path).items():
        assert main(["stats", str(path)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"{path}:1: {field} must be <= 2147483647 (tokens), got {HUGE}" in line, line


def test_run_names_a_huge_token_count_and_exits_2_without_a_run_directory(tmp_path, monkeypatch, capsys):
    path = _huge_traces(tmp_path)["output_length"]
    out = tmp_path / "run"
    r = run_in_process(monkeypatch, capsys, f"workload.trace={path}", "workload.context_overflow=fail",
                       f"hydra.run.dir={out}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"{path}:1: output_length must be <= 2147483647" in one_error_line(r.stderr)
    assert not out.exists()


# ---- a directory or a file that cannot be written ------------------------------------------------------

@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_an_unwritable_run_or_sweep_directory_is_one_line_and_exit_2(tmp_path, sweep, monkeypatch, capsys):
    """A run in this process (the directory is refused before any job runs), a sweep in its own (the contract of
    a real process: its exit status and its one line)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")   # mkdir under a regular file fails, for root too (ENOTDIR)
    args = (["-m", "workload.num_conversations=2,3", f"hydra.sweep.dir={blocker / 'sweep'}"] if sweep
            else ["workload.num_conversations=2", f"hydra.run.dir={blocker / 'run'}"])
    r = run_cli(*args) if sweep else run_in_process(monkeypatch, capsys, *args)
    assert r.returncode == 2, r.stderr[-3000:]
    line = one_error_line(r.stderr)
    assert str(blocker / ("sweep" if sweep else "run")) in line and "Not a directory" in line, line


def test_a_file_size_limit_below_the_probe_stops_before_the_run(tmp_path):
    out = tmp_path / "run"
    r = run_cli("workload.num_conversations=2", "slo=absolute", f"hydra.run.dir={out}", fsize=64 * 1024)
    assert r.returncode == 2, r.stderr[-3000:]
    line = one_error_line(r.stderr)
    assert str(out) in line and "File too large" in line and "nothing was run" in line, line
    assert not (out / "config.yaml").exists()


def test_a_results_file_past_the_size_limit_is_named_and_the_rest_is_written(tmp_path):
    # 1.5 MB per file: the probe (1 MiB) and every file but the engine steps of 10 conversations fit (steps.parquet
    # ~2.5 MB; turns.parquet ~64 kB, tokens.parquet ~0.8 MB)
    out = tmp_path / "run"
    r = run_cli("workload.num_conversations=10", "slo=absolute", "logger.steps=true", f"hydra.run.dir={out}",
                fsize=1_500_000)
    assert r.returncode == 2, r.stderr[-3000:]
    line = one_error_line(r.stderr)
    assert f"cannot write {out / 'steps.parquet'}: " in line and "File too large" in line, line
    s = json.loads((out / "summary.json").read_text())
    assert s["partial"] is True and "steps.parquet" in s["error"] and s["num_turns"] > 0
    for name in ("turns.parquet", "conversations.parquet", "instances.parquet", "tokens.parquet"):
        assert (out / name).is_file(), name
    assert not (out / "steps.parquet").exists() and not list(out.glob(".*.tmp"))


def test_an_atomic_write_that_fails_names_the_file_not_its_temporary(tmp_path):
    """pyarrow's write errors carry no file name: the error names the destination."""
    from harness.core.recorder import _atomic

    def fail(tmp):
        raise OSError(errno.EFBIG, "Error writing bytes to file")
    with pytest.raises(OSError) as e:
        _atomic(tmp_path / "turns.parquet", fail)
    assert e.value.filename == str(tmp_path / "turns.parquet") and e.value.errno == errno.EFBIG
    assert list(tmp_path.iterdir()) == []   # the temporary file is gone


# ---- summary.json before the bulky files (issue 50) ----------------------------------------------------------

SMALL = ["workload.num_conversations=3", "workload.max_turns=2", "slo=absolute", "logger.progress=false"]


def test_a_disk_that_fills_on_a_parquet_keeps_summary_json(tmp_path, monkeypatch):
    """The disk fills while ``turns.parquet`` is written (ENOSPC after some bytes): ``summary.json``, which
    fits, is kept with the run's figures, marked partial with an error naming the file; the other parquets
    are written; the error goes on (run.py: exit 2, one line). Before, ``summary.json`` was written last and
    lost with the parquet."""
    from harness.core import recorder
    from harness.run.runner import execute
    from tests.conftest import compose_run
    real = recorder.write_parquet

    def filling(df, path):
        if path.name != "turns.parquet":
            return real(df, path)

        def write(tmp):
            with open(tmp, "wb") as f:
                f.write(b"PAR1" + b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device")
        recorder._atomic(path, write)
    monkeypatch.setattr(recorder, "write_parquet", filling)
    with pytest.raises(OSError) as e:
        execute(compose_run(SMALL), tmp_path)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "turns.parquet")
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["partial"] is True and s["num_turns"] > 0 and s["num_conversations"] == 3
    assert s["error"] == f"cannot write {tmp_path / 'turns.parquet'}: No space left on device"
    for name in ("conversations.parquet", "instances.parquet", "decisions.parquet"):
        assert (tmp_path / name).is_file(), name
    assert not (tmp_path / "turns.parquet").exists() and not list(tmp_path.glob(".*.tmp"))


def test_a_run_stopped_while_writing_its_parquets_is_not_taken_as_complete(tmp_path, monkeypatch):
    """``summary.json`` is on disk before the parquets, marked partial until they are all written: a process
    that dies among them (here: an exception no handler takes, at ``instances.parquet``) leaves a summary that
    says so, and a resume recomputes the run rather than skip it."""
    from harness.core import recorder
    from harness.run.runner import completed_run, execute
    from tests.conftest import compose_run
    real = recorder.write_parquet

    class Died(BaseException):
        pass

    def dying(df, path):
        if path.name == "instances.parquet":
            raise Died
        return real(df, path)
    from omegaconf import OmegaConf
    run = compose_run(SMALL)
    text = OmegaConf.to_yaml(run.cfg)
    monkeypatch.setattr(recorder, "write_parquet", dying)
    with pytest.raises(Died):
        execute(run, tmp_path, text)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["partial"] is True and s["error"] == recorder.WRITING_RESULTS and s["num_turns"] > 0
    assert (tmp_path / "config.yaml").read_text() == text
    assert completed_run(tmp_path, text) is None
    monkeypatch.setattr(recorder, "write_parquet", real)       # the same run written whole: taken as complete
    execute(run, tmp_path, text)
    assert completed_run(tmp_path, text)["partial"] is False
