"""An interrupt never throws a measured run away (issue 32, item 1): SIGTERM in each phase of a run
(``harness.run.runner.PHASES``: start-up, SLO baseline, run, results, writing) leaves every results file of
either a partial run (``"partial": true``, the phase named) or, once the measurement is over, of the
complete run, whose turns are those of the same run left alone; never a run without its files, never a
half-written file. The signal is sent by the process itself at a named point (``HARNESS_TEST_INTERRUPT``,
``harness.run.slo_baseline._interrupt_hook``), never by a timer. Each case is ``run.py`` in a subprocess on
four conversations of the shipped trace (a few seconds each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from harness.run.config import PROJECT_ROOT

TINY = ["workload.num_conversations=4", "workload.max_turns=3", "logger.progress=false"]   # slo=relative: a baseline
FILES = ("summary.json", "turns.parquet", "conversations.parquet", "instances.parquet", "decisions.parquet",
         "config.yaml", "meta.json", "interrupted.json")
KEY = ["conversation_id", "turn"]


def run_cli(*args, **env):
    full = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    full.pop("HARNESS_TEST_INTERRUPT", None)
    full.update(env)
    return subprocess.run([sys.executable, "run.py", *TINY, *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=300, env=full,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # even if the suite ignores it


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run, not interrupted: its turns. Run in this process (``harness.run.runner.execute`` of the same
    composed config, as ``run.py``'s job runs it; the simulator is deterministic, and the turns of a run do not depend
    on the process: tests/test_executor.py), not through a third ``run.py`` start-up (~2.7 CPU s); the test
    that a complete run's rerun is skipped starts ``run.py`` itself."""
    from harness.run.runner import execute
    from tests.conftest import compose_run
    out = tmp_path_factory.mktemp("reference") / "run"
    s = execute(compose_run(TINY), out)
    assert not s["partial"], s["error"]
    return pd.read_parquet(out / "turns.parquet").sort_values(KEY).reset_index(drop=True)


# (hook, phase named in the files, the measurement was over)
CASES = [("startup:0", "start-up", False), ("baseline:1", "SLO baseline", False), ("run:1", "run", False),
         ("results:0", "results", True), ("writing:0", "writing", True)]


@pytest.mark.parametrize("hook,phase,complete", CASES, ids=[c[1] for c in CASES])
def test_sigterm_in_each_phase_leaves_a_complete_or_a_marked_partial_run(tmp_path, reference, hook, phase, complete):
    out = tmp_path / "run"
    r = run_cli(f"hydra.run.dir={out}", HARNESS_TEST_INTERRUPT=f"{hook}:TERM")
    assert r.returncode == 130, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    for name in FILES:
        assert (out / name).is_file(), name
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]     # no half-written file left
    s = json.loads((out / "summary.json").read_text())
    mark = json.loads((out / "interrupted.json").read_text())
    assert s["interrupted_phase"] == phase and mark["phase"] == phase and mark["complete"] is complete
    turns = pd.read_parquet(out / "turns.parquet").sort_values(KEY).reset_index(drop=True)
    for name in ("conversations.parquet", "instances.parquet", "decisions.parquet"):
        pd.read_parquet(out / name)                                            # each one whole
    if complete:
        assert s["partial"] is False and s["error"] == ""
        assert "its results are complete" in r.stderr
        pd.testing.assert_frame_equal(turns, reference)                        # the whole run, as left alone
        assert s["num_turns"] == len(reference)
    else:
        assert s["partial"] is True and s["error"].startswith("KeyboardInterrupt") and "SIGTERM" in s["error"]
        assert "(partial)" in r.stderr
        assert len(turns) < len(reference)
        if phase == "run":   # the turns finished before the signal are the undisturbed run's
            done = turns[turns["status"] == "ok"]
            assert len(done) > 0
            want = reference.merge(done[KEY], on=KEY)
            pd.testing.assert_frame_equal(done.reset_index(drop=True)[want.columns], want)
        else:
            assert len(turns) == 0 and "the run did not start" in s["error"]


def test_a_run_interrupted_after_its_measurement_is_complete_and_a_rerun_keeps_it(tmp_path, reference):
    out = tmp_path / "run"
    r = run_cli(f"hydra.run.dir={out}", HARNESS_TEST_INTERRUPT="results:0:INT")
    assert r.returncode == 130, r.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["interrupted_phase"] == "results"
    r2 = run_cli(f"hydra.run.dir={out}")
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert "already complete" in r2.stdout
