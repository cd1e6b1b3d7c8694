"""``harness.core.evidence``: a run's step-time logs and spans packed (gzip, in place) and read back by the fidelity
tools exactly as before, on a copy of the shipped real run ``docs/data/twin_cpu/calibration``."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.core import evidence
from harness.run.config import PROJECT_ROOT

CAL = PROJECT_ROOT / "docs" / "data" / "twin_cpu" / "calibration"


@pytest.mark.skipif(not (CAL / "server_metrics.json").is_file(), reason="the shipped calibration run is not here")
def test_packed_run_reads_as_the_plain_one(tmp_path):
    from harness.tools import steps as st
    run = tmp_path / "cal"
    shutil.copytree(CAL, run)
    steps0, meta0 = st.load_step_times(run, 8)
    sm0 = json.loads((run / "server_metrics.json").read_text())
    front0 = st.api_frontend(run)
    sizes = evidence.pack(run)
    assert set(sizes) == {"logs/collocated0.step_times.jsonl", "server_metrics.json"}
    for name, (before, after) in sizes.items():
        assert not (run / name).exists() and (run / (name + ".gz")).is_file()
        assert before == (CAL / name).stat().st_size and after < before / 4     # JSON lines compress > 4x
    steps1, meta1 = st.load_step_times(run, 8)
    assert steps1.equals(steps0) and meta1 == meta0 and len(steps0) == 1680     # 1,688 logged, 8 warm-up
    assert evidence.server_metrics(run) == sm0
    assert st.api_frontend(run) == front0
    assert evidence.pack(run) == {}          # packed already: nothing to do


def test_reader_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="x.jsonl"):
        evidence.read_text(tmp_path / "x.jsonl")
    assert evidence.server_metrics(tmp_path) is None
    (tmp_path / "server_metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match="server_metrics.json"):
        evidence.server_metrics(tmp_path)


def test_command_refuses_a_missing_directory(tmp_path, capsys):
    assert evidence.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
