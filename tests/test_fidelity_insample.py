"""Every shipped real step log replayed in sample, like for like (issue 49; harness.tools.insample,
docs/fidelity_cpu.md "In sample, every shipped log"): each collocated run under docs/data is fitted per step on its
own log (objective ``sum``) and its workload replayed. The expected values are the real log's own (its steps, its
spans); the bounds are the issue's: summed busy time, step count and mean decode batch within 2 %, engine TTFT / E2E /
ITL means within 3 % (both sides from vLLM's ``queued_ts``).

Validity first: a run is judged only if the slow-period figure (<= 1.10) and the in-sample step count (|err| <= 8 %)
accept it. The three runs made beside other processes are refused (the held-out run beside other jobs on the first,
the two beside one and two CPU-bound processes on the second). On the five accepted logs every busy-time figure is
within 2 %; the figures that miss are listed with the replay's own floor (the range of the figure when only the
API front end moves by -0.5 to +1 ms, `python -m harness.tools.fidelity insample --floor`) as strict expected
failures, not loosened."""

from __future__ import annotations

import math

import pytest

from harness.core.profiles import ModelConfig
from harness.run.config import PROJECT_ROOT
from harness.tools import insample as ins
from harness.tools import protocol as pr
from harness.tools import steps as st
from harness.tools.inputs import load_profile, load_run_config

DATA = PROJECT_ROOT / "docs" / "data"
ACCEPTED = ["fidelity_cpu_quiet/protocol/calibration", "fidelity_cpu_quiet/protocol/heldout_1",
            "fidelity_cpu_quiet/protocol/heldout_2", "fidelity_cpu_quiet/protocol/heldout_3", "twin_cpu/calibration"]
REFUSED = {"fidelity_cpu_contended/heldout": "slow-period figure",
           "fidelity_cpu_contended/one_cpu_bound_process": "in-sample step count",
           "fidelity_cpu_contended/two_cpu_bound_processes": "in-sample step count"}
# (log, figure): what the replay gave and its floor (docs/fidelity_cpu.md); every other figure is within its bound
MISSES = {
    ("fidelity_cpu_quiet/protocol/calibration", "steps"): "-4.7 % (floor 3.8 %)",
    ("fidelity_cpu_quiet/protocol/calibration", "batch"): "+4.4 % (floor 4.1 %)",
    ("fidelity_cpu_quiet/protocol/heldout_1", "engine_ttft"): "-9.1 % (floor 5.4 %)",
    ("fidelity_cpu_quiet/protocol/heldout_2", "engine_e2e"): "-5.2 % (floor 0.7 %: a miss the floor does not explain)",
    ("fidelity_cpu_quiet/protocol/heldout_3", "engine_ttft"): "-6.0 % (floor 11.9 %)",
    ("fidelity_cpu_quiet/protocol/heldout_3", "engine_itl"): "-5.3 % (floor 6.1 %)",
}


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """Every shipped collocated log: its slow-period figure and its in-sample figures."""
    out = {}
    for run in ins.shipped_step_logs(DATA):
        key = run.relative_to(DATA).as_posix()
        res = ins.in_sample(run, tmp_path_factory.mktemp("insample") / "sim")
        model = ModelConfig(**load_run_config(run)["model"])
        spf = st.slow_period_figure(res["steps"], load_profile("cpu"), model)["figure"]
        out[key] = {"figures": res["figures"], "slow_periods": spf}
    return out


def test_every_shipped_log_is_judged_or_refused_by_name(replays):
    """The shipped collocated logs are exactly these eight (a new one must be classified here), and the validity
    figures accept and refuse them as named: ``contention_problem`` on the two run-internal figures."""
    assert sorted(replays) == sorted(ACCEPTED + list(REFUSED))
    for key, r in replays.items():
        why = pr.contention_problem({"ncpu": 2, "run": key, "slow_periods": r["slow_periods"],
                                     "insample_steps": r["figures"]["steps"]})
        if key in REFUSED:
            assert why.startswith(REFUSED[key]), (key, why)
        else:
            assert why == "", (key, why)


def _cases():
    for key in ACCEPTED:
        for fig in ins.BOUNDS:
            miss = MISSES.get((key, fig))
            marks = [pytest.mark.xfail(strict=True, reason=f"{key} {fig}: {miss}")] if miss else []
            yield pytest.param(key, fig, marks=marks, id=f"{key}:{fig}")


@pytest.mark.parametrize("key, figure", list(_cases()))
def test_each_accepted_log_in_sample_within_the_issues_bounds(replays, key, figure):
    e = replays[key]["figures"][figure]
    assert math.isfinite(e) and abs(e) <= ins.BOUNDS[figure], f"{key} {figure}: {e:+.2%}"


def test_the_floor_by_hand(tmp_path, monkeypatch):
    """The floor is max - min of each figure over the unperturbed replay and one replay per front-end shift; with
    the replays replaced by hand-made figures: steps -1 %, +2 %, -3 % -> 5 %; the shifts applied to the profile."""
    from harness.core.profiles import HardwareConfig
    seen, figs = [], iter([{"steps": -0.01}, {"steps": 0.02}, {"steps": -0.03}])

    def fake(run, steps, hw, out):
        seen.append(hw.api_frontend_s)
        return {**{k: 0.0 for k in ins.BOUNDS}, **next(figs)}
    monkeypatch.setattr(ins, "replay_figures", fake)
    hw = HardwareConfig(name="x", api_frontend_s=0.010)
    f = ins.replay_floor(tmp_path, tmp_path, None, hw, deltas_s=(-0.001, 0.002))
    assert f["steps"] == pytest.approx(0.05) and f["busy"] == 0.0
    assert seen == pytest.approx([0.010, 0.009, 0.012])
    assert ins.verdicts({**{k: 0.0 for k in ins.BOUNDS}, "steps": -0.04}, {"steps": 0.05})["steps"] == "under the floor"
    assert ins.verdicts({**{k: 0.0 for k in ins.BOUNDS}, "steps": -0.04}, {"steps": 0.01})["steps"] == "missed"


def test_the_command_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert ins.insample_main([str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
