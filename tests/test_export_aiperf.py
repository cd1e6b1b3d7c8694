"""The AIPerf export (harness.analysis.export ``--format aiperf``) read by the ``aiperf`` package itself
(aiperf 0.13.0: its export models and the run loader of ``aiperf plot``, tests/aiperf_loader.py).

Where aiperf is found: imported here if this interpreter has it; else the interpreter named by
``AIPERF_PYTHON`` (e.g. a venv of its own: ``python -m venv ~/aiperf-venv && ~/aiperf-venv/bin/pip install
aiperf==0.13.0``, then ``AIPERF_PYTHON=~/aiperf-venv/bin/python``), else the interpreter of an ``aiperf``
command on PATH (its ``#!`` line); else the test is skipped, saying so. docs/outputs.md "AIPerf" says why
a venv of its own.

The runs: two small runs of the fake backend (tests/test_pipeline.py: TTFT = ``step_s``, every token gap
``step_s``, nothing queues) with their ``config.yaml``: a closed population of 2 agents, and Gamma arrivals
(CV 2, so AIPerf's Gamma shape is 1/4) at 0.5 conv/s capped at 3 active conversations. Every expected
value comes from the overrides below or from the run's ``turns.parquet``, never from the export code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from harness.analysis.export import export
from harness.run.config import resolve
from harness.run.runner import execute
from tests.conftest import compose_cfg
from tests.test_pipeline import SMALL  # noqa: F401  (also registers backend=fake)

STEP = 0.01
LOADER = Path(__file__).with_name("aiperf_loader.py")
BASE = SMALL[:-2] + ["logger.progress=false", "scheduler=collocated", "cluster=a40_4x", "slo=absolute", "backend=fake",
                     f"backend.step_s={STEP}", "slo.goodput='ttft:15 e2el:100'"]
RUNS = {
    "closed": ["workload.arrival=closed", "workload.concurrency=2"],
    "gamma": ["workload.arrival=gamma", "workload.rate_per_s=0.5", "workload.burstiness=2.0",
              "workload.max_concurrency=3"],
}


def _shebang_python(exe: str) -> str | None:
    """The interpreter on the ``#!`` line of the console script ``exe`` (None if it has none)."""
    try:
        first = Path(exe).read_bytes()[:400].split(b"\n", 1)[0].decode()
    except OSError:
        return None
    return first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() else None


def aiperf_route() -> str | None:
    """``"here"`` when this interpreter imports aiperf, else the interpreter that has it (module docstring), else
    None."""
    try:
        import aiperf  # noqa: F401
        return "here"
    except ImportError:
        pass
    exe = shutil.which("aiperf")
    return os.environ.get("AIPERF_PYTHON") or (_shebang_python(exe) if exe else None)


def aiperf_reads(route: str, export_dirs: list[Path], tmp: Path) -> dict[str, dict]:
    """What aiperf reads from each of ``export_dirs`` (tests/aiperf_loader.py ``read``; keyed by the directory
    as a string), in this interpreter (``route == "here"``) or in the interpreter ``route``, started once."""
    if route == "here":
        from tests.aiperf_loader import _clean, read
        return {str(d): _clean(read(d)) for d in export_dirs}
    out = tmp / "aiperf_read.json"
    r = subprocess.run([route, str(LOADER), str(out), *map(str, export_dirs)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{route} {LOADER.name} failed:\n{r.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (run directory, its composed config, its turns.parquet, what aiperf read from its export)."""
    route = aiperf_route()
    if route is None:
        pytest.skip("aiperf is not importable here and neither AIPERF_PYTHON nor an `aiperf` command on PATH names "
                    "an interpreter that has it (pip install aiperf==0.13.0 in a venv of its own, then "
                    "AIPERF_PYTHON=<that venv>/bin/python; docs/outputs.md)")
    root = tmp_path_factory.mktemp("aiperf_runs")
    made = {}
    for name, ov in RUNS.items():
        cfg = compose_cfg(BASE + ov)
        execute(resolve(cfg), root / name, OmegaConf.to_yaml(cfg))   # with config.yaml, as the CLI writes it
        export(root / name, "aiperf", root / "export" / name)
        made[name] = (root / name, cfg, pd.read_parquet(root / name / "turns.parquet"))
    read = aiperf_reads(route, [root / "export" / n for n in RUNS], root)
    return {n: (*made[n], read[str(root / "export" / n)]) for n in RUNS}


def _check_requests(read: dict, turns: pd.DataFrame) -> None:
    """Every turn is one request row aiperf kept, with its run-clock timestamps (ns) from turns.parquet."""
    assert read["rows"] == read["records"] == len(turns)
    by = {(r.conversation_id, int(r.turn)): r for r in turns.itertuples()}
    for q in read["requests"]:
        t = by[(q["conversation_id"], q["turn_index"])]
        assert q["request_start_ns"] == round(t.submit_s * 1e9) == q["credit_issued_ns"]
        assert q["request_end_ns"] == round(t.finish_s * 1e9)
        assert q["output_sequence_length"] == t.output_tokens
    assert read["duration_s"] == pytest.approx(turns.finish_s.max() - turns.submit_s.min(), rel=1e-9)


def test_aiperf_loads_a_closed_population_with_its_model_endpoint_and_concurrency(runs):
    _, cfg, turns, read = runs["closed"]
    assert read["schema_version"] == "1.4" and read["undeclared_keys"] == []
    assert read["model"] == cfg.model.hf_name == "Qwen/Qwen3-0.6B"
    assert read["endpoint_type"] == "completions" and read["endpoint"]["streaming"] is True
    assert read["endpoint"]["urls"] == ["http://fake.invalid/a40_4x"]     # no server: a name that never resolves
    # the load shape: 2 agents (workload.concurrency=2) over the 6 conversations, every turn a request
    assert read["concurrency"] == 2 and read["request_count"] == len(turns)
    assert read["phase"]["type"] == "concurrency" and read["phase"]["sessions"] == 6 == turns.conversation_id.nunique()
    assert read["slos"] == {"time_to_first_token": 15.0, "request_latency": 100.0}
    assert read["random_seed"] == cfg.seed and read["is_complete"] is True and read["was_cancelled"] is False
    _check_requests(read, turns)
    m = read["metrics"]
    ok = turns[turns.status == "ok"]
    assert m["time_to_first_token"]["unit"] == "ms" and m["time_to_first_token"]["avg"] == pytest.approx(STEP * 1e3)
    assert m["time_to_first_token"]["count"] == len(ok)
    assert m["output_sequence_length"]["sum"] == ok.output_tokens.sum() and m["request_count"]["avg"] == len(ok)
    # E2E = output x step, so good (TTFT <= 15 ms, E2E <= 100 ms) = turns of at most 10 output tokens
    assert m["good_request_count"]["avg"] == (ok.output_tokens <= 10).sum()


def test_aiperf_loads_a_rate_phase_with_gamma_shape_and_cap(runs):
    _, _, turns, read = runs["gamma"]
    # workload.burstiness = CV 2 -> Gamma shape 1 / 2^2 (AIPerf's smoothness); the cap is AIPerf's concurrency
    ph = read["phase"]
    assert (ph["type"], ph["rate"], ph["smoothness"], ph["concurrency"]) == ("gamma", 0.5, 0.25, 3)
    assert (ph["name"], ph["kind"], ph["requests"], ph["sessions"]) == ("profiling", "profiling", len(turns), 6)
    assert read["concurrency"] == 3 and read["request_count"] == len(turns)
    _check_requests(read, turns)
