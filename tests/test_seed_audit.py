"""The seeds audit (``harness.analysis.seed_audit``): >= 10 seeds in every near-capacity or collapsing cell, on
hand-made tables (every expected value worked out in the docstrings), on the shipped tables and on the ConServe presets' grids."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.analysis.seed_audit import (CONSERVE_PRESETS, MIN_SEEDS, audit, capacity_brackets, collapsed_seeds, main,
                                         preset_audit, preset_jobs)
from harness.core.paths import PROJECT_ROOT


def test_a_collapsed_seed_is_an_order_of_magnitude_above_the_others_median():
    """Seed 3 at 15 s against the others' median 1.0 s (of 0.9, 1.0, 1.2) is 15x: collapsed at factor 10, not at 20;
    seed 0 at 1.0 s against the median 1.2 s of (1.2, 0.9, 15) is not. One value has no other seeds."""
    v = pd.Series([1.0, 1.2, 0.9, 15.0], index=[0, 1, 2, 3])
    assert collapsed_seeds(v) == [3]
    assert collapsed_seeds(v, factor=20) == []
    assert collapsed_seeds(pd.Series([5.0], index=[0])) == []


def rows(variant: str, load: float, seeds, growth, p95=0.1, **extra) -> list[dict]:
    name, mode = ("ampd", "remote_default") if variant == "ampd_rd" else (variant, None)
    return [{"scheduler.name": name, "scheduler.mode": mode, "cluster.name": "a40_1p3d", "workload.name": "swebench",
             "workload.rate_per_s": load, "workload.seed": s, "serving_growth_ratio": g,
             "ttfet_first_p95_s": p95[i] if isinstance(p95, (list, tuple)) else p95, **extra}
            for i, (s, g) in enumerate(zip(seeds, growth))]


def table() -> pd.DataFrame:
    """ConServe's growth ratios: 0.03 conv/s (1.0, 1.1, 1.2: geometric mean 1.32^(1/3) = 1.097 <= 1.25, bounded),
    0.06 (1.2, 1.2, 1.3: 1.872^(1/3) = 1.233, bounded), 0.09 (1.5 on 10 seeds, unbounded): capacity in [0.06, 0.09),
    near capacity from 0.8 x 0.06 = 0.048 conv/s on. AMPD remote_default bounded at every load (1.0): not located.
    At 0.03 AMPD's seed 1 p95 is 2.0 s against 0.1 s on seeds 0 and 2 (20x: a collapse). A one-seed sensitivity arm
    (kv_memory_efficiency 0.85) at 0.06."""
    r = (rows("conserve", 0.03, [0, 1, 2], [1.0, 1.1, 1.2]) + rows("conserve", 0.06, [0, 1, 2], [1.2, 1.2, 1.3])
         + rows("conserve", 0.09, range(10), [1.5] * 10)
         + rows("ampd_rd", 0.03, [0, 1, 2], [1.0] * 3, p95=[0.1, 2.0, 0.1])
         + rows("ampd_rd", 0.06, [0, 1, 2], [1.0] * 3)
         + rows("ampd_rd", 0.09, range(10), [1.0] * 10))
    df = pd.DataFrame(r)
    df["hardware.a40.kv_memory_efficiency"] = 0.915
    arm = pd.DataFrame(rows("conserve", 0.06, [0], [1.0]))
    arm["hardware.a40.kv_memory_efficiency"] = 0.85
    return pd.concat([df, arm], ignore_index=True)


def test_capacity_bracket_from_the_growth_ratios():
    assert capacity_brackets(table()) == {("swebench", "think", "a40_1p3d", "conserve"): (0.06, 0.09)}
    no_col = table().drop(columns="serving_growth_ratio")
    assert capacity_brackets(no_col) == {}


def test_audit_fires_where_near_capacity_or_collapsing_with_fewer_than_ten_seeds():
    cells = audit(table()).set_index(["load", "variant", "arm"])
    # 0.03: below 0.048 but AMPD's seed 1 collapses: both cells of the group need 10 seeds and have 3
    assert cells.loc[(0.03, "conserve", "base")].fires and cells.loc[(0.03, "ampd_rd", "base")].fires
    why = cells.loc[(0.03, "conserve", "base")].collapsed
    assert "ampd_rd none seed 1: ttfet_first_p95_s 2 s = 20 x the median" in why
    # 0.06 >= 0.048: near capacity (ConServe's bracket), 3 seeds: fires; the one-seed arm is exempt
    c = cells.loc[(0.06, "ampd_rd", "base")]
    assert c.fires and c.near == "conserve: 0.06 >= 0.8 x 0.06 (capacity in [0.06, 0.09))"
    assert not cells.loc[(0.06, "conserve", "kv_memory_efficiency=0.85")].needs
    # 0.09: near (past) capacity with 10 seeds: needs, does not fire
    assert cells.loc[(0.09, "conserve", "base")].needs and not cells.loc[(0.09, "conserve", "base")].fires
    # a located capacity given from outside replaces the table's: [0.1, 0.12) puts 0.06 below 0.08
    given = audit(table(), {("a40_1p3d", "conserve"): (0.1, 0.12)}).set_index(["load", "variant", "arm"])
    assert not given.loc[(0.06, "ampd_rd", "base")].needs
    with pytest.raises(ValueError, match="workload.seed"):
        audit(table().drop(columns="workload.seed"))


def test_capacity_below_the_lowest_load_is_named_so():
    """AMPD unbounded already at the table's lowest load (1.5 on 10 seeds at 0.075 conv/s): its bracket is
    (-inf, 0.075), the cell needs 10 seeds and the reason reads "capacity below 0.075", not "in [-inf, ...)"."""
    t = pd.DataFrame(rows("ampd_rd", 0.075, range(3), [1.5] * 3))
    assert capacity_brackets(t) == {("swebench", "think", "a40_1p3d", "ampd_rd"): (-math.inf, 0.075)}
    c = audit(t).set_index(["load", "variant", "arm"]).loc[(0.075, "ampd_rd", "base")]
    assert c.fires and c.near == "ampd_rd: 0.075, capacity below 0.075 (unbounded at the table's lowest load)"


def test_shipped_sensitivity_table():
    """docs/data/conserve_sensitivity/runs.csv: ConServe on a40_1p3d bounded at 0.06 (the growth ratios' logs sum to
    1.931 over 10 seeds: geometric mean e^0.193 = 1.213) and not at 0.09 (2.299: e^0.230 = 1.258 > 1.25), so near
    capacity from 0.048 conv/s: every 0.06 and 0.09 claim cell has 10 seeds, and so have the 7 AMPD error arms at 0.06
    (remote_default: error rate 0.1 / 0.3 / 0.5 and sigma 1; cost: the 3 rates), topped up from 3 seeds (when they
    fired) to 10 on 2026-12-06: no cell fires; the 0.03 cells (3 seeds) need none."""
    runs = pd.read_csv(PROJECT_ROOT / "docs/data/conserve_sensitivity/runs.csv")
    br = capacity_brackets(runs)
    assert br[("swebench", "think", "a40_1p3d", "conserve")] == (0.06, 0.09)
    cells = audit(runs)
    assert not cells.fires.any(), cells[cells.fires].to_string()
    err = cells[(cells.load == 0.06) & (cells.error != "none")]
    assert set(err.error) == {"rate 0.1", "rate 0.3", "rate 0.5", "sigma 1"}
    assert len(err) == 7 and err.needs.all() and (err.seeds == MIN_SEEDS).all()
    base = cells[(cells.arm == "base") & (cells.error == "none")]
    assert (base[base.load >= 0.06].seeds >= MIN_SEEDS).all() and not base[base.load == 0.03].needs.any()


def _brackets(table_rel: str) -> dict:
    return {(t, v): br for (_, _, t, v), br in capacity_brackets(pd.read_csv(PROJECT_ROOT / table_rel)).items()}


@pytest.mark.parametrize("name", CONSERVE_PRESETS)
def test_no_conserve_preset_asks_for_fewer_than_ten_seeds_near_capacity(name):
    """Each ConServe preset's grid against the capacity of its setting: the shipped conserve_sensitivity table's
    brackets for the SWE-bench presets on the A40 tiers; conserve_kvbound's KV-cut pool in [0.06, 0.075) conv/s (its header:
    0.06 the rate nearest saturation, 0.075 already collapses ConServe's admission queue); Claude Code's closed
    population in [11, 12) sessions (docs/traces.md, agents at SLO: ConServe and AMPD remote_default 11, both fail at
    12), near from 8.8: N = 8 is not."""
    if name == "conserve_kvbound":
        cap = {(t, v): (0.06, 0.075) for t in ("a40_1p3d", "a40_1p3d_hetero")
               for v in ("conserve", "ampd_rd", "ampd_cost")}
    elif name == "claude_code_claims":
        cap = {("h100_1p3d", v): (11.0, 12.0) for v in ("conserve", "ampd_rd", "ampd_cost")}
    else:
        cap = _brackets("docs/data/conserve_sensitivity/runs.csv")
    cells = preset_audit(name, cap)
    assert len(cells) and not cells.fires.any(), cells[cells.fires].to_string()


def test_the_old_three_seed_energy_grid_fires(tmp_path):
    """conserve_energy as it was (rates 0.03 / 0.05 / 0.07 x seeds 0-2): 0.05 and 0.07 are >= 0.048 conv/s, so its 2
    tiers x 2 variants x 2 rates = 8 cells fire; 0.03 does not."""
    (tmp_path / "experiment").mkdir()
    text = (PROJECT_ROOT / "conf/experiment/conserve_energy.yaml").read_text()
    (tmp_path / "experiment" / "conserve_energy.yaml").write_text(text.replace("0,1,2,3,4,5,6,7,8,9", "0,1,2"))
    jobs = preset_jobs("conserve_energy", tmp_path)
    assert len(jobs) == 36 and set(jobs["scheduler.name"]) == {"conserve", "ampd"}
    cells = preset_audit("conserve_energy", _brackets("docs/data/conserve_sensitivity/runs.csv"), conf=tmp_path)
    fired = cells[cells.fires]
    assert len(fired) == 8 and set(fired.load) == {0.05, 0.07} and set(fired.tier) == {"a40_1p3d", "a40_1p3d_hetero"}


def test_command_line(capsys, tmp_path):
    p = tmp_path / "runs.csv"
    table().to_csv(p, index=False)
    assert main([str(p)]) == 1
    out = capsys.readouterr().out
    assert "fires" in out and "**yes**" in out
    assert main([str(p), "--capacity", "a40_1p3d:conserve=0.1,0.12", "--collapse-factor", "50"]) == 0
    for bad in (["--capacity", "a40_1p3d=0.1"], ["--capacity", "a40_1p3d:conserve=0.2,0.1"], ["--near-frac", "1.5"],
                ["--collapse-factor", "nan"]):
        with pytest.raises(SystemExit) as e:
            main([str(p), *bad])
        assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing.csv")])
    assert e.value.code == 2
    assert math.isfinite(MIN_SEEDS) and MIN_SEEDS == 10
