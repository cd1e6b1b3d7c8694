"""harness.tools.fidelity refuses a simulator run or a partial run as the "real" side (exit 2, the reason named)
unless told (``--allow-sim-real`` / ``--allow-partial``).

The run: a small simulated run (collocated on a40_4x) with its resolved ``config.yaml``. Told to accept it, the
check replays it on the simulator with the very profile it ran on (``a40``), so every error must be exactly 0
(the simulator is deterministic): the flag lets the comparison run, it does not change it."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from harness.run.config import resolve
from harness.run.runner import execute
from harness.tools.fidelity import main
from tests.conftest import compose_cfg
from tests.test_pipeline import SMALL

ERROR = "RuntimeError: server instance 0 exited with status -9"


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("simrun") / "run"
    dcfg = compose_cfg(SMALL + ["scheduler=collocated", "cluster=a40_4x", "slo=absolute"])
    execute(resolve(dcfg), d, OmegaConf.to_yaml(dcfg))
    return d


def test_a_simulator_run_as_the_real_side_is_refused_unless_told(sim_run, tmp_path, capsys):
    out = tmp_path / "fid"
    assert main([str(sim_run), "--profile", "a40", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "simulator run" in err and str(sim_run) in err and "--allow-sim-real" in err
    assert not out.exists()                              # refused before anything is simulated
    assert main([str(sim_run), "--profile", "a40", "--out", str(out), "--allow-sim-real"]) == 0
    res = json.loads((out / "fidelity.json").read_text())
    for k in ("e2e_mean_s", "ttft_mean_s", "tpot_mean_s"):
        assert res["comparison"]["metrics"][k]["err"] == 0.0, k   # the same simulation twice


def test_a_partial_real_run_is_refused_unless_told(tmp_path, capsys):
    run = tmp_path / "real"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"backend": "vllm", "partial": True, "error": ERROR}))
    assert main([str(run), "--profile", "a40", "--out", str(tmp_path / "fid")]) == 2
    err = capsys.readouterr().err
    assert "partial run" in err and ERROR in err and "--allow-partial" in err and str(run) in err
    assert not (tmp_path / "fid").exists()
    # told: it gets past the check (and then fails on what a hand-made directory lacks: its config.yaml)
    assert main([str(run), "--profile", "a40", "--out", str(tmp_path / "fid"), "--allow-partial"]) == 2
    err = capsys.readouterr().err
    assert "partial run" not in err and "config.yaml" in err


def test_a_partial_simulator_run_needs_both_flags(sim_run, tmp_path, capsys):
    part = tmp_path / "part"
    part.mkdir()
    for f in sim_run.iterdir():
        if f.is_file():
            (part / f.name).write_bytes(f.read_bytes())
    s = json.loads((part / "summary.json").read_text())
    (part / "summary.json").write_text(json.dumps({**s, "partial": True, "error": ERROR}))
    assert main([str(part), "--profile", "a40", "--out", str(tmp_path / "f1"), "--allow-sim-real"]) == 2
    assert "--allow-partial" in capsys.readouterr().err
    assert main([str(part), "--profile", "a40", "--out", str(tmp_path / "f2"), "--allow-sim-real",
                 "--allow-partial"]) == 0
