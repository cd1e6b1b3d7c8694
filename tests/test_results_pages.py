"""The results pages (docs/results/*.md, ``python -m harness.analysis.results``): the shipped pages are the
generator's output on the shipped data; their numbers equal what the tools printed when the data was made
(``docs/data/wait_table/wait_table.out`` from ``scripts/wait_table.py``, ``docs/data/twin_wait/cpu_fitted/twin.md``
from the twin report), and one cell is recomputed by hand from ``runs.csv``; without data a claim names the
command that makes it instead of a number; README links the pages."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from harness.analysis import results
from harness.core.cmdline import number_list
from harness.core.paths import PROJECT_ROOT

DATA = PROJECT_ROOT / "docs" / "data"
_PAGES: dict = {}
_page = results.page


def made_page(name, root=PROJECT_ROOT, margin=results.EQUIVALENCE_MARGIN_PCT):
    """``results.page``, made once per process for each argument set: the shipped data does not change during a
    test session, and the conserve page costs ~13 CPU s to make (measured 2026-12-06), which the shipped-page test
    and the check-mode test (which makes every page three times) would otherwise pay four times."""
    key = (name, str(root), margin)
    if key not in _PAGES:
        _PAGES[key] = _page(name, root, margin)
    return _PAGES[key]


@pytest.mark.parametrize("name", results.PAGES)
def test_the_shipped_page_is_the_generators_output(name):
    shipped = (PROJECT_ROOT / "docs" / "results" / f"{name}.md").read_text()
    assert shipped == made_page(name), f"docs/results/{name}.md is stale: run python -m harness.analysis.results"


def test_check_mode_exits_1_on_a_stale_page_and_0_on_fresh_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(results, "page", made_page)   # write_pages and main's --check make the pages through it
    results.write_pages(tmp_path)
    assert results.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "wait.md").write_text("edited by hand\n")
    assert results.main(["--check", "--out", str(tmp_path)]) == 1
    assert "wait.md: differs" in capsys.readouterr().err


def _wait_table_out() -> dict:
    """What scripts/wait_table.py printed for the W2 table: ``{(model, rate): (estimate, low, high, verdict)}`` of
    WAIT-CP / Sarathi-like."""
    text = (DATA / "wait_table" / "wait_table.out").read_text()
    cells = {}
    for m, r, est, lo, hi, word in re.findall(
            r"^\| (roofline|vidur_profile) \| ([\d.]+) \|[^\n]*?\| WAIT-CP / Sarathi-like \| ([-+][\d.]+) % "
            r"\[([-+][\d.]+), ([-+][\d.]+)\] \| [^|]+ \| ([a-z ,]+) \|$", text, re.M):
        cells[(m, float(r))] = (float(est), float(lo), float(hi), word)
    return cells


def _capacity_out() -> dict:
    """What scripts/wait_table.py --no-table printed for W1 (docs/data/wait_capacity/wait_table.out): ``{(model, arm
    label): {seed: (low, high)}}``, the per-seed capacity brackets."""
    text = (DATA / "wait_capacity" / "wait_table.out").read_text()
    caps = {}
    for m, arm, rest in re.findall(r"^  (\w+) ([\w -]+?): (seed .*)$", text, re.M):
        caps[(m, arm)] = {int(s): (float(lo), float(hi))
                          for s, lo, hi in re.findall(r"seed (\d+) \[([-\d.inf]+), ([-\d.inf]+)\)", rest)}
    return caps


def test_w1_and_w2_equal_what_wait_table_printed():
    printed = _wait_table_out()
    assert len(printed) == 10
    rows = pd.read_csv(DATA / "wait_table" / "runs.csv")
    got = {(c["model"], c["rate"]): c for c in results.wait_table_cells(rows)}
    assert set(got) == set(printed)
    for key, (est, lo, hi, word) in printed.items():
        c = got[key]
        assert (round(c["mean"], 1), round(c["ci"][0], 1), round(c["ci"][1], 1), c["verdict"]) == (est, lo, hi, word)
    caps = _capacity_out()
    assert {(m, a) for m in results.WT_MODELS for a in ("Sarathi-like", "WAIT-CP")} <= set(caps)
    label = {v: k for k, v in results.WT_ARMS.items()}
    got = results.wait_capacity(pd.read_csv(DATA / "wait_capacity" / "runs.csv"))
    assert got == {(m, label[a]): b for (m, a), b in caps.items()}


def test_w2_per_request_step_model_is_on_the_page():
    """The per-request (kernel-generation) step model's W2 cells, from docs/data/wait_table_kv_write: WAIT-CP /
    Sarathi-like at 23 prompts/s over its ten seeds, recomputed with numpy, appears on the page."""
    rows = pd.read_csv(DATA / "wait_table_kv_write" / "runs.csv")
    g = rows[(rows.model == "vidur_profile_per_request") & (rows.rate == 23.0)]
    a = g[g.arm == "wait_cp"].sort_values("seed").e2e_central_mean_s.to_numpy()
    b = g[g.arm == "sarathi"].sort_values("seed").e2e_central_mean_s.to_numpy()
    est = np.exp(np.log(a / b).mean()) * 100 - 100
    page = made_page("wait")
    assert re.search(rf"^\| vidur_profile_per_request \| 23 \| [^|]+ \| {est:+.1f} % \[", page, re.M)


def test_one_w2_cell_by_hand():
    """vidur_profile at 23 prompts/s: the geometric mean over the ten seeds of WAIT-CP / Sarathi-like, written out
    with numpy, and the paper's -70 % at that rate judged by hand: the 95 % t-interval (t_{0.975, 9} = 2.262) of
    the mean log ratio excludes 0 and reaches past -35 % (half the paper's size): reproduced."""
    rows = pd.read_csv(DATA / "wait_table" / "runs.csv")
    g = rows[(rows.model == "vidur_profile") & (rows.rate == 23.0)]
    a = g[g.arm == "wait_cp"].sort_values("seed").e2e_central_mean_s.to_numpy()
    b = g[g.arm == "sarathi"].sort_values("seed").e2e_central_mean_s.to_numpy()
    x = np.log(a / b)
    half = 2.262 * x.std(ddof=1) / np.sqrt(len(x))
    est, lo, hi = (np.exp(v) * 100 - 100 for v in (x.mean(), x.mean() - half, x.mean() + half))
    assert lo < -35 and hi < 0
    page = made_page("wait")
    assert re.search(rf"\| vidur_profile \| 23 \| [^|]+ \| {re.escape(f'{est:+.1f} % [{lo:+.1f}, {hi:+.1f}] (n=10)')} \| "
                     r"10 \(10 of 10\) \| reproduced \|", page)


def test_w2_twin_rows_equal_the_twin_report():
    """Each W2 cell of both sides on the page equals the row the twin report printed (twin.md)."""
    twin = (DATA / "twin_wait" / "cpu_fitted" / "twin.md").read_text()
    rows = re.findall(r"^\| W2 [^|]+\| [^|]+\| (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
                      twin, re.M)
    assert len(rows) == 6
    page = made_page("wait")
    for rate, vs, real_est, real_word, sim_est, sim_word in rows:
        for est, word in ((real_est, real_word), (sim_est, sim_word)):
            est = est.strip().replace(")", "")   # twin.md: "(n=5)"; the page's table adds the sign count
            assert re.search(rf"\| {rate} \| {re.escape(vs.strip())} \| {re.escape(est)}[^|]*\| -70 % \| "
                             rf"{word.strip()} \|", page), (rate, vs, est, word)


def test_without_shipped_data_every_claim_names_its_command(tmp_path):
    """A repository without docs/data: no number on either page, every claim row says which command makes it."""
    for name in results.PAGES:
        text = results.page(name, root=tmp_path)
        rows = [line for line in text.splitlines() if re.match(r"^\| [CW]\d \|", line)]
        claims = {r.split("|")[1].strip() for r in rows}
        assert claims == ({"C1", "C2", "C3", "C4", "C5"} if name == "conserve" else
                          {"W1", "W2", "W3", "W4", "W6", "W7"})
        assert all("**no shipped data: run `python " in r for r in rows), rows
        assert not re.search(r"[-+]\d+\.\d %", text)


def test_readme_links_the_results_pages():
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert "docs/results/conserve.md" in readme and "docs/results/wait.md" in readme


def _flag(cmd: str, name: str) -> str | None:
    m = re.search(rf"--{name} (\S+)", cmd)
    return m.group(1) if m else None


def test_the_wait_memory_command_is_what_the_shipped_table_holds():
    """W6/W7's command (``results.WM_CMD``, printed where no table ships) names the grid ``docs/data/wait_memory``
    holds: every (memory, rate, arm, seed) its commands ask for is a row of ``runs.csv``, the ``--fractions`` rates
    worked out here from the shipped ``capacity.csv`` (f x the mean over seeds of Sarathi-like's bracket midpoints at
    the first memory, rounded to 0.01 prompts/s, as ``scripts/wait_memory.py``'s docstring states), and no shipped
    (memory, rate) lies outside them (a rate named but never run, e.g. 2.5 /s, fails)."""
    runs = pd.read_csv(DATA / "wait_memory" / "runs.csv")
    have = {(round(m, 4), round(r, 4), a, int(s)) for m, r, a, s in zip(runs.memory, runs.rate, runs.arm, runs.seed)}
    asked = set()
    for cmd in results.WM_CMD:
        mems = [float(x) for x in _flag(cmd, "memory").split(",")]
        arms = _flag(cmd, "arms").split(",")
        seeds = number_list(0, integer=True, ranges=True)(_flag(cmd, "seeds"))   # the scripts' own parser
        rates = [float(x) for x in _flag(cmd, "rates").split(",")] if _flag(cmd, "rates") else []
        if _flag(cmd, "fractions"):
            caps = results.wait_memory_capacity(pd.read_csv(DATA / "wait_memory" / "capacity.csv"))
            first_arm = _flag(cmd, "cap-arms").split(",")[0]
            mids = [(lo + hi) / 2 for lo, hi in caps[(mems[0], first_arm)].values()]
            rates += [round(float(f) * float(np.mean(mids)), 2) for f in _flag(cmd, "fractions").split(",")]
        asked |= {(round(m, 4), round(r, 4), a, s) for m in mems for r in rates for a in arms for s in seeds}
    assert asked <= have, sorted(asked - have)[:5]
    assert {k[:2] for k in have} == {k[:2] for k in asked}
