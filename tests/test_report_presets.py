"""``python -m harness.analysis.report`` on a reduced run of every experiment preset (``conf/experiment/*.yaml``) and
of the README's six-way sweep (``python run.py -m scheduler=conserve,ampd,collocated,disaggregated,wait,
nested_wait``): the same sweep shape (the preset's swept keys, fewer of their values), 2 seeds, 3
conversations of at most 3 turns. The report (tables, markdown, claims, figures) must succeed on each and
keep every interval of ``points.csv`` inside its metric's range.

The reduction (:func:`reduced_jobs`): ``workload.seed`` keeps its first two values; any other key its first
and last; a union of grids (a group under ``+experiment/``, e.g. the cells of ``conserve_sensitivity``)
up to four evenly spaced options, first and last included, fewer (down to two) while the sweep has more
than ``UNION_BUDGET`` jobs. A preset added later is reduced the same way.

The figures are built (every plotting call runs) but not rendered to files (tests/conftest.py
``unrendered_figures``: rendering and laying out text are most of the report's time and are covered by
tests/test_report.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import hydra_compose, skip_without  # noqa: E402

skip_without("seaborn", "seaborn not installed")   # without importing it (matplotlib, scipy) at collection

from harness.analysis import report  # noqa: E402
from harness.run.config import resolve  # noqa: E402
from harness.run.executor import to_yaml  # noqa: E402
from harness.run.runner import execute  # noqa: E402
from harness.analysis.stats import is_count, is_proportion  # noqa: E402
from tests.test_presets import PRESETS, sweep_params  # noqa: E402

SIX_WAY = {"scheduler": ["conserve", "ampd", "collocated", "disaggregated", "wait", "nested_wait"],
           "workload.seed": ["0", "1"]}
TINY = ["workload.num_conversations=3", "workload.max_turns=3", "logger.progress=false"]
UNION_OPTIONS = 4
UNION_BUDGET = 8   # unions of grids shrink (to 2 options at the least) while the sweep has more jobs than this
MAX_JOBS = 16


def spaced(values: list[str], k: int) -> list[str]:
    """``k`` evenly spaced values, first and last included."""
    idx = sorted(set(np.linspace(0, len(values) - 1, min(k, len(values))).round().astype(int)))
    return [values[i] for i in idx]


def reduce_values(key: str, values: list[str], union: int = UNION_OPTIONS) -> list[str]:
    """The values of one swept key that the reduced sweep keeps (module docstring)."""
    if key == "workload.seed":
        return values[:2]
    if key.startswith("+experiment/"):
        return spaced(values, union)
    return list(dict.fromkeys([values[0], values[-1]]))


def reduced_jobs(params: dict[str, list[str]], preset: str | None) -> list[list[str]]:
    """One override list per job, in the order Hydra's sweeper composes a job: the swept keys, then the
    preset, then the tiny workload."""
    keys = list(params)
    union = {k: UNION_OPTIONS for k in keys}
    grids = [reduce_values(k, params[k], union[k]) for k in keys]
    while int(np.prod([len(g) for g in grids])) > UNION_BUDGET:
        wide = [k for k, g in zip(keys, grids) if k.startswith("+experiment/") and len(g) > 2]
        if not wide:
            break
        big = max(wide, key=lambda k: len(grids[keys.index(k)]))
        union[big] = len(grids[keys.index(big)]) - 1
        grids = [reduce_values(k, params[k], union[k]) for k in keys]
    head = [f"+experiment={preset}"] if preset else []
    return [[f"{k}={v}" for k, v in zip(keys, combo)] + head + TINY for combo in itertools.product(*grids)]


def run_sweep(jobs: list[list[str]], root: Path) -> None:
    # composed through the memo of tests/conftest.py hydra_compose, and the config's text written by the sweep
    # executor's to_yaml (OmegaConf.to_yaml's text to the byte, memoised per entry: ~7 % of this file's CPU
    # was OmegaConf.to_yaml), as a sweep makes them
    for i, ov in enumerate(jobs):
        cfg = hydra_compose(ov)
        run = resolve(cfg)
        execute(run, root / f"{i}_{run.scheduler_name}", to_yaml(cfg))


# the twin presets run half their cells on launched real vLLM servers: their reduced sweep, and the report's
# twin.md, are tests/test_twin.py's (one launched server pair)
SWEEPS = [(name, None) for name in PRESETS if not name.startswith("twin_")] + [("six_way", SIX_WAY)]


@pytest.mark.parametrize("name,params", SWEEPS, ids=[s[0] for s in SWEEPS])
def test_report_on_a_reduced_sweep(name, params, tmp_path: Path, unrendered_figures):
    drawn = unrendered_figures
    preset = None if params is not None else name
    params = params if params is not None else sweep_params(name)
    # the six-way sweep runs all six schedulers as the README does (only the seeds and workload are tiny)
    jobs = reduced_jobs(params, preset) if preset else [
        [f"scheduler={v}", f"workload.seed={s}", *TINY] for v in params["scheduler"] for s in params["workload.seed"]]
    assert 2 <= len(jobs) <= MAX_JOBS, f"{name}: {len(jobs)} jobs; keep the reduced sweep small"
    if not preset:
        assert len(jobs) == 12
    root = tmp_path / "sweep"
    run_sweep(jobs, root)
    out = tmp_path / "rep"
    assert report.main([str(root), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and (out / "points.csv").is_file()
    assert "ttfet_cdf" in drawn and "kv_occupancy" in drawn
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == len(jobs)
    variants = {"ampd" if s == "ampd" else s for s in runs["scheduler.name"]}
    if "conserve" in variants and "ampd" in variants:
        assert (out / "claims.md").is_file(), f"{name}: ConServe and AMPD but no claims.md"
        assert "claims_vs_rate" in drawn and "claims_tokens_per_joule" in drawn
    # every interval stays in its metric's range
    pts = pd.read_csv(out / "points.csv")
    for col in [c for c in pts.columns if c.endswith("_lo")]:
        m = col[:-3]
        lo, hi = pts[col].dropna(), pts[f"{m}_hi"].dropna()
        if is_proportion(m.removesuffix("_pooled")):
            assert lo.ge(0).all() and hi.le(1).all(), (name, m)
        elif is_count(m) or m.endswith("_s"):
            assert lo.ge(0).all(), (name, m)
