"""scripts/conserve_capacity.py's logic without runs: the bisection per variant on stubbed growth ratios, the
claims' rates at fractions of ConServe's located capacity, and the conversation growth ratio by hand."""

from __future__ import annotations

import math
import sys

import pandas as pd
import pytest

from harness.analysis.capacity import conversation_growth_ratio
from harness.core.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import conserve_capacity as cc  # noqa: E402


def test_locate_brackets_a_step_capacity():
    """Growth 1.0 below 0.071 conv/s and 2.0 above: bisection of [0.03, 0.15] to 0.01 conv/s tries 0.03, 0.15,
    0.09, 0.06, 0.075 (unbounded), 0.0675 (bounded) and stops at [0.0675, 0.075): width 0.0075 <= 0.01 after
    0.015 > 0.01."""
    seen = []

    def probe(v, rate):
        seen.append(rate)
        return [1.0, 1.1, 0.9] if rate < 0.071 else [2.0, 2.1, 1.9]
    got = cc.locate("conserve", probe, 0.03, 0.15, 0.01)
    assert (got["low"], got["high"]) == pytest.approx((0.0675, 0.075))
    assert seen == pytest.approx([0.03, 0.15, 0.09, 0.06, 0.075, 0.0675])
    assert got["tried"]["0.06"] == pytest.approx((1.0 * 1.1 * 0.9) ** (1 / 3))
    # a failed conversation (NaN ratio) reads as unbounded
    assert cc.locate("x", lambda v, r: [math.nan], 0.03, 0.15, 0.01)["low"] == -math.inf


def test_fraction_rates():
    assert cc.fraction_rates(0.0675, (0.5, 0.8, 0.95, 1.05)) == {"f0.5": 0.0338, "f0.8": 0.054, "f0.95": 0.0641,
                                                                 "f1.05": 0.0709}
    with pytest.raises(ValueError, match="widen --range"):
        cc.fraction_rates(-math.inf, (0.5,))


@pytest.mark.parametrize("bad,says", [(["--range", "0.1,0.05"], "--range"), (["--variants", "ampd_rd"], "conserve included"),
                                      (["--tol", "nan"], "--tol"), (["--cap-seeds", "0"], "--cap-seeds")])
def test_bad_arguments_are_one_error_line_and_exit_2(tmp_path, capsys, bad, says):
    with pytest.raises(SystemExit) as e:
        cc.main(["--out", str(tmp_path / "out"), *bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_conversation_growth_ratio_by_hand():
    """16 conversations, one 2-turn each, arriving in order; the serving time of conversation i (its turns' E2E
    summed) is 1 s for i < 8 and 3 s after: the central window (i = 4..11) splits into quarters (4,5) (6,7) (8,9)
    (10,11), first mean 1, last mean 3: ratio 3. Tool time between turns does not count."""
    conv = pd.DataFrame({"conversation_id": [f"c{i}" for i in range(16)], "arrival_s": [float(i) for i in range(16)]})
    rows = []
    for i in range(16):
        e2e = 0.5 if i < 8 else 1.5
        rows += [(f"c{i}", 0, "ok", 10.0 * i, 10.0 * i + e2e), (f"c{i}", 1, "ok", 10.0 * i + 100, 10.0 * i + 100 + e2e)]
    turns = pd.DataFrame(rows, columns=["conversation_id", "turn", "status", "submit_s", "finish_s"])
    assert conversation_growth_ratio(turns, conv.iloc[::-1]) == pytest.approx(3.0)
    assert math.isnan(conversation_growth_ratio(turns[turns.conversation_id != "c3"], conv))


def test_the_setting_is_conserve_sensitivitys():
    """The script's overrides compose to conserve_sensitivity's model, workload and SLO on a40_1p3d."""
    from tests.conftest import compose_run
    a = compose_run([*cc.SETTING, "scheduler=conserve"])
    b = compose_run(["+experiment=conserve_sensitivity", "+experiment/cell=cs_main_conserve_homo_r0p06_s0"])
    for x, y in ((a.cfg.slo, b.cfg.slo), (a.cfg.model, b.cfg.model)):
        assert x == y
    assert (a.cfg.workload.name, a.cfg.workload.num_conversations) == (b.cfg.workload.name, b.cfg.workload.num_conversations)
    assert a.cfg.cluster.name == b.cfg.cluster.name == "a40_1p3d"


def test_capacity_rows_on_a_hand_made_table(tmp_path):
    """A shipped docs/data/conserve_capacity (two rates, three seeds): ConServe's serving-only p95 is half AMPD
    remote_default's on every seed, so C1's serving cell is -50.0 % with a zero-width interval -> reproduced (it
    excludes 0 and reaches half the paper's -51.08 %); the capacity brackets and ConServe's held conversations (4 on
    each seed at the higher rate: mean 4.0) appear in the detail; without capacity.json the row names the command."""
    import json

    from harness.analysis import results
    rows = []
    for rate in (0.0338, 0.0709):
        for seed in range(3):
            for name, mode, serving in (("conserve", None, 10.0 + seed), ("ampd", "remote_default", 20.0 + 2 * seed),
                                        ("ampd", "cost", 18.0)):
                rows.append({"scheduler.name": name, "scheduler.mode": mode, "cluster.name": "a40_1p3d",
                             "workload.rate_per_s": rate, "workload.seed": seed, "num_conversations": 200,
                             "ttfet_first_p95_s": 1.0, "ttfet_visible_p95_s": 500.0, "ttfet_serving_p95_s": serving,
                             "slo_attainment_first": 1.0, "slo_attainment_visible": 1.0, "slo_attainment_serving": 1.0,
                             "admission_held_conversations": 4 if (name == "conserve" and rate > 0.05) else 0,
                             "ttfet_first_from_admission_p95_s": 1.0, "ttfet_serving_from_admission_p95_s": serving})
    d = tmp_path / "docs" / "data" / "conserve_capacity"
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "runs.csv", index=False)
    assert "no shipped data: run `python scripts/conserve_capacity.py" in results.capacity_rows(tmp_path)["C1"].word
    (d / "capacity.json").write_text(json.dumps({
        "growth_bound": 1.25, "tol": 0.01, "cap_seeds": 3, "rates": {"f0.5": 0.0338, "f1.05": 0.0709},
        "capacity": {"conserve": {"low": 0.0675, "high": 0.075}, "ampd_rd": {"low": 0.06, "high": 0.0675}}}))
    c1 = results.capacity_rows(tmp_path)["C1"]
    assert "0.0709/s serving vs AMPD remote_default: -50.0 % [-50.0, -50.0] (n=3) reproduced" in c1.cells
    text = "\n".join(c1.detail)
    assert "ConServe [0.0675, 0.075); AMPD remote_default [0.06, 0.0675) conv/s" in text
    assert "| 1.05 × cap = 0.0709 | 4.0 |" in text and "| 0.5 × cap = 0.0338 | 0.0 |" in text


def test_reused_ratios_take_a_probe_from_a_table_of_the_same_setting():
    """A table with ConServe's base runs on a40_1p3d at 0.06 conv/s, seeds 0-2, growth 1.0 / 1.2 / 1.44: a probe of
    3 seeds reads them (geometric mean 1.2, interval by hand below); 4 seeds: not all there -> run it; a moved
    constant, another cluster or another conversation count is not the setting."""
    def row(seed, g, **kw):
        return {"scheduler.name": "conserve", "cluster.name": "a40_1p3d", "workload.rate_per_s": 0.06,
                "workload.seed": seed, "workload.num_conversations": 200, "serving_growth_ratio": g, **kw}
    t = pd.DataFrame([row(0, 1.0), row(1, 1.2), row(2, 1.44), row(3, 9.0, **{"cluster.name": "a40_2p2d"}),
                      row(3, 9.0, **{"workload.num_conversations": 100}),
                      row(3, 9.0, **{"hardware.a40.kv_memory_efficiency": 0.85}),
                      row(0, 1.0, **{"hardware.a40.kv_memory_efficiency": 0.915}),
                      row(1, 1.2, **{"hardware.a40.kv_memory_efficiency": 0.915}),
                      row(2, 1.44, **{"hardware.a40.kv_memory_efficiency": 0.915})])
    got = cc.reused_ratios([("t.csv", t)], "conserve", 0.06, 3)
    assert got == (pytest.approx([1.0, 1.2, 1.44]), "t.csv")
    assert cc.reused_ratios([("t.csv", t)], "conserve", 0.06, 4) is None
    assert cc.reused_ratios([("t.csv", t)], "ampd_rd", 0.06, 3) is None
    assert cc.reused_ratios([("t.csv", t)], "conserve", 0.0601, 3) is None
    # logs 0, 0.18232, 0.36464: mean 0.18232 (gmean 1.2), sd 0.18232, half-width t(0.975, 2) 4.3027 x 0.18232 /
    # sqrt(3) = 0.45291: interval exp(-0.27059) = 0.7629, exp(0.63523) = 1.8874
    p = cc.probe_record([1.0, 1.2, 1.44], "t.csv")
    assert p["gmean"] == pytest.approx(1.2) and p["interval"] == pytest.approx([0.7629, 1.8874], abs=1e-4)
    assert math.isnan(cc.probe_record([math.nan, 1.0], "run")["gmean"])


def test_fraction_seeds_and_order():
    assert cc.fraction_seeds([1.05, 0.95, 0.8, 0.5], 0.9, 10, 5) == {"f1.05": 10, "f0.95": 10, "f0.8": 5, "f0.5": 5}


def test_more_bad_arguments(tmp_path, capsys):
    for bad, says in ((["--locate", "nope"], "--locate"),
                      (["--reuse", str(tmp_path / "none.csv")], "--reuse"), (["--far-seeds", "1"], "--far-seeds")):
        with pytest.raises(SystemExit) as e:
            cc.main(["--out", str(tmp_path / "out"), *bad])
        assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_probe_lines_mark_a_probe_within_the_noise():
    """ConServe probed at 0.06 (reused, interval [1.0, 1.2]: below the 1.25 bound, decided) and 0.075 (run, [1.1,
    1.4]: holds 1.25, marked); AMPD without per-probe records shows the geometric mean alone."""
    from harness.analysis.results import _probe_lines
    cap = {"growth_bound": 1.25, "capacity": {
        "conserve": {"low": 0.06, "high": 0.075, "tried": {"0.06": 1.1, "0.075": 1.3}},
        "ampd_rd": {"low": 0.06, "high": 0.075, "tried": {"0.06": 1.2}}},
        "probes": {"conserve": {"0.06": {"ratios": [1.1] * 10, "gmean": 1.1, "interval": [1.0, 1.2],
                                         "source": "docs/data/conserve_sensitivity/runs.csv"},
                                "0.075": {"ratios": [1.3] * 10, "gmean": 1.3, "interval": [1.1, 1.4], "source": "run"}}}}
    lines = _probe_lines(cap)
    assert lines[2] == ("| ConServe | [0.06, 0.075) | 0.06: 1.100 [1.000, 1.200] (n=10, "
                        "`docs/data/conserve_sensitivity/runs.csv`); 0.075: 1.300 [1.100, 1.400] ⚠ (n=10, run) | 1 of 2 |")
    assert lines[3] == "| AMPD remote_default | [0.06, 0.075) | 0.06: 1.200 | 0 of 1 |"


def test_run_directory_names_stay_short():
    """A run's directory is ``<label of the cell's own overrides>_seed<k>``: the common setting stays out of it (with
    it the name passed the file system's 255 bytes and run.py failed on the first probe)."""
    from harness.analysis.seeds import _label
    for v in cc.VARIANTS:
        assert len(_label(cc.cell_arm(v, 0.07125)) + "_seed104") < 100
    assert not any(o in cc.cell_arm("conserve", 0.06) for o in cc.SETTING)
