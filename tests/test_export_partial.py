"""Exports of partial runs (harness.analysis.export): refused (exit 2, one line naming the run, nothing written)
unless ``--allow-partial``, and then marked ``"partial": true`` with the run's error.

The runs: two small runs of the fake backend (tests/test_pipeline.py) in one sweep directory; one of them is then
marked partial by hand in its ``summary.json`` (``"partial": true`` and an interrupt's error, as
``harness.run.runner.execute`` writes them for an interrupted run)."""

from __future__ import annotations

import json

import pytest

from harness.analysis.export import main
from harness.run.runner import execute
from tests.conftest import compose_run
from tests.test_pipeline import SMALL  # noqa: F401  (also registers backend=fake)

ERROR = "KeyboardInterrupt: signal 15 (SIGTERM)"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    for name in ("0_complete", "1_partial"):
        execute(compose_run(SMALL + ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", "backend=fake",
                                     "backend.step_s=0.01"]), root / name)
    s_p = root / "1_partial" / "summary.json"
    s = json.loads(s_p.read_text())
    assert s["partial"] is False       # a complete run, until marked below
    s_p.write_text(json.dumps({**s, "partial": True, "error": ERROR}))
    return root


@pytest.mark.parametrize("fmt", ["vllm-bench", "aiperf"])
def test_a_partial_run_is_refused_with_one_line_naming_it(sweep, fmt, capsys, tmp_path):
    run = sweep / "1_partial"
    assert main([str(run), "--format", fmt, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run) in err and "--allow-partial" in err and ERROR in err
    assert not (tmp_path / "x").exists()
    # a sweep holding it: refused before the complete run is exported, only the partial one named
    assert main([str(sweep), "--format", fmt, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run) in err and "0_complete" not in err
    assert not (tmp_path / "s").exists()


def test_with_allow_partial_the_export_is_marked(sweep, capsys, tmp_path):
    assert main([str(sweep), "--format", "vllm-bench", "--out", str(tmp_path / "v"), "--allow-partial"]) == 0
    assert "warning" in capsys.readouterr().err
    part = json.loads((tmp_path / "v" / "1_partial" / "collocated.json").read_text())
    assert part["partial"] is True and part["partial_error"] == ERROR
    (point,) = json.loads((tmp_path / "v" / "1_partial" / "summary.json").read_text())
    assert point["partial"] is True and point["partial_error"] == ERROR
    whole = json.loads((tmp_path / "v" / "0_complete" / "collocated.json").read_text())
    assert "partial" not in whole and "partial_error" not in whole     # vLLM's keys only (tests/test_export.py)
    assert main([str(sweep / "1_partial"), "--format", "aiperf", "--out", str(tmp_path / "a"),
                 "--allow-partial"]) == 0
    data = json.loads((tmp_path / "a" / "profile_export_aiperf.json").read_text())
    assert data["partial"] is True and data["partial_error"] == ERROR and data["was_cancelled"] is True
    assert data["is_complete"] is False and data["incomplete_reason"] == ERROR     # AIPerf 0.13.0's own marks
