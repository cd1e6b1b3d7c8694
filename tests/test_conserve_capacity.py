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
    assert "| 0.0709 | 4.0 |" in text and "| 0.0338 | 0.0 |" in text
