"""The config system end to end: every shipped option composes and resolves, every registered scheduler
builds (a ``harness.core.policy.Policy``) and runs on a cluster it supports, and every bad input fails fast --
before any simulated turn starts -- with an error that names the key (or the file and line).

Bad inputs are checked in-process (``compose_run`` + ``harness.run.runner.execute`` with the simulator
booby-trapped) and, for a few, through the real CLI (``python run.py ...``: non-zero exit, the key on
stderr, no Python traceback, no results written).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

import harness.run.runner as runner
import harness.run.session as session
import harness.run.slo_baseline as slo_baseline
from harness.run.config import PROJECT_ROOT, ConfigError, resolve
from harness.core.backend import backends
from harness.core.policy import Policy
from harness.core.schedulers import get_spec, registered
from harness.core.profiles import kv_capacity_blocks
from harness.sim.backend import SimBackend
from harness.core.trace import TraceError
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import NEEDS_PD, compose_cfg, compose_run, conversation, run_py_in_process

CONF = PROJECT_ROOT / "conf"
# What compose_run / execute may raise for a bad input (anything else, e.g. a bare ValueError or KeyError,
# reaches the CLI as a traceback).
CONFIG_ERRORS = (ConfigError, TraceError, HydraException)


def options(group: str) -> list[str]:
    """The option names of a config group: the stems of ``conf/<group>/*.yaml``; the ``scheduler`` and
    ``backend`` options are the registered plug-ins (no YAML files)."""
    if group == "scheduler":
        return registered()
    if group == "backend":  # the shipped ones (tests register a fake one)
        return sorted(n for n, b in backends().items() if b.config_cls.__module__.startswith("harness."))
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def cluster_roles(cluster: str) -> set[str]:
    return {g["role"] for g in OmegaConf.load(CONF / "cluster" / f"{cluster}.yaml").instances}


def supports(scheduler: str, cluster: str) -> bool:
    return scheduler not in NEEDS_PD or {"prefiller", "decoder"} <= cluster_roles(cluster)


# A tiny synthetic workload: (reused, new, output, tool_time_s) per turn.
CONVS = [
    conversation("c0", [(0, 300, 20, 0.5), (320, 40, 10, 0.2), (370, 30, 5, 0.0)]),
    conversation("c1", [(0, 500, 30, 1.0), (530, 50, 8, 0.0)]),
    conversation("c2", [(0, 200, 4, 0.0)]),
]
NUM_TURNS = sum(len(c.turns) for c in CONVS)


def tiny_workload():
    return build_workload(CONVS, WorkloadConfig(arrival="poisson", rate_per_s=1.0))


def run_tiny(run, scheduler: str, sched_cfg, monkeypatch) -> tuple[session.SessionResult, list]:
    """Simulate the tiny workload under ``scheduler``; returns the result and the policies built."""
    built = []
    make = session.make_policy

    def recording_make_policy(*args, **kwargs):
        built.append(make(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(session, "make_policy", recording_make_policy)
    conversations, stats = tiny_workload()
    return session.simulate(session.session_input(run), conversations, stats, scheduler, sched_cfg), built


def assert_completed(res: runner.SimResult, where: str = "") -> None:
    assert res.error == "", where
    assert len(res.turns) == NUM_TURNS, where
    assert all(r["status"] == "ok" for r in res.turns), where
    assert all(c.done and not c.failed for c in res.convs), where


@functools.lru_cache(maxsize=None)
def composed(*overrides: str):
    """``compose_run`` cached per override list (Hydra's compose is the slow part of this file); callers
    must not mutate the result."""
    return compose_run(list(overrides))


def cluster_run(cluster: str):
    return composed(f"cluster={cluster}", "scheduler=collocated")  # collocated runs on any cluster


def with_scheduler(run, scheduler: str):
    """``run`` with the scheduler (and its YAML config) of ``conf/scheduler/<scheduler>.yaml``."""
    return dataclasses.replace(run, scheduler_name=scheduler, scheduler=composed(f"scheduler={scheduler}").scheduler)


# ---- every option composes and resolves --------------------------------------------------------------

def test_every_hardware_profile_is_composed_under_its_name():
    cfg = compose_cfg()
    assert sorted(cfg.hardware) == options("hardware"), \
        "conf/config.yaml must compose every conf/hardware/*.yaml as hardware.<name>"
    run = resolve(cfg)  # validates every profile
    for key, hw in run.cfg.hardware.items():
        assert hw.name == key


@pytest.mark.parametrize("model", options("model"))
def test_every_hardware_runs_every_model_that_fits(model, monkeypatch):
    """On every hardware profile the model either runs the tiny workload or is refused with an error naming
    both (e.g. llama2_7b on the 8 GB cpu profile); see the next test for the pairs that must fit."""
    base = composed(f"model={model}", "cluster=a100_1x", "scheduler=collocated")
    assert [r for _, r, _ in base.instances] == ["collocated"]
    for key, hw in base.cfg.hardware.items():
        try:
            kv_capacity_blocks(hw, base.cfg.model, base.cfg.engine)
        except ValueError as e:
            assert model in str(e) and key in str(e), str(e)
            continue
        run = dataclasses.replace(base, instances=[("collocated0", "collocated", hw)])
        res, _ = run_tiny(run, "collocated", run.scheduler, monkeypatch)
        assert_completed(res, f"{model} on {key}")


def test_default_model_fits_every_hardware_and_every_model_fits_default_hardware():
    run = composed()
    default_hw = run.instances[0][2]
    for key, hw in run.cfg.hardware.items():
        assert kv_capacity_blocks(hw, run.cfg.model, run.cfg.engine) >= 1, key
    for model in options("model"):
        m = composed(f"model={model}", "cluster=a100_1x", "scheduler=collocated").cfg.model
        assert kv_capacity_blocks(default_hw, m, run.cfg.engine) >= 1, model


GROUP_OPTIONS = [(g, o) for g in ("cluster", "scheduler", "model", "slo", "workload", "backend", "logger")
                 for o in options(g)]


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_and_resolves(group, option):
    if group == "cluster":
        run = cluster_run(option)
    elif group == "backend":  # the relative SLO's unloaded replays are sim-only
        run = composed(f"backend={option}", "slo=absolute", "engine.block_size=128")
    else:
        run = composed(f"{group}={option}")
    name = run.scheduler_name if group == "scheduler" else getattr(run.cfg, group).name
    assert name == option, f"conf/{group}/{option}.yaml must set name: {option}"
    assert run.trace_path.is_file()
    assert run.instances


EXPERIMENTS = options("experiment")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_with_its_sweep_values(experiment):
    """``+experiment=<name>``: the experiment itself, then with the first and with the last value of every
    swept parameter; every swept group option (``scheduler: a,b``, ``+experiment/arm: ...``) must exist."""
    params = OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    swept = {k.lstrip("+"): str(v).split(",") for k, v in params.items()}
    for key, values in swept.items():
        if (CONF / key).is_dir():  # a config group: its values are option files
            missing = [v for v in values if not (CONF / key / f"{v}.yaml").is_file()]
            assert not missing, f"{experiment}: {key} options {missing} do not exist"
    composed(f"+experiment={experiment}")
    for pick in (0, -1):
        run = composed(f"+experiment={experiment}", *(f"{k}={v[pick]}" for k, v in params.items()
                                                      for v in [str(v).split(",")]))
        for key, values in swept.items():
            if key == "scheduler":
                assert run.scheduler_name == values[pick]
            elif key in ("cluster", "workload"):
                assert getattr(run.cfg, key).name == values[pick]


def test_default_config_resolves():
    run = composed()
    assert run.scheduler_name == "conserve" and run.cfg.cluster.name == "a40_1p3d"
    assert [n for n, _, _ in run.instances] == ["prefiller0", "decoder0", "decoder1", "decoder2"]


# ---- the scheduler registry ---------------------------------------------------------------------------

def test_every_registered_scheduler_is_an_option_with_a_docs_row_and_a_cluster():
    """A variant is its module plus one docs row: the registry makes it ``scheduler=<name>`` (composed to
    its config dataclass's defaults), ``docs/schedulers.md`` has its row, a shipped cluster supports it."""
    rows = (PROJECT_ROOT / "docs" / "schedulers.md").read_text()
    for name in registered():
        run = composed(f"scheduler={name}", *([] if supports(name, "a40_1p3d") else ["cluster=a40_4x"]))
        assert run.scheduler == get_spec(name).config_cls(), name
        assert f"| `{name}` |" in rows, f"docs/schedulers.md has no row for {name}"
        row = next(ln for ln in rows.splitlines() if ln.startswith(f"| `{name}` |"))
        unnamed = [k for k in scheduler_key_names(name) if k not in row]
        assert not unnamed, f"docs/schedulers.md's row for {name} does not name its keys {unnamed}"
        assert any(supports(name, c) for c in options("cluster")), f"no shipped cluster supports {name}"


def scheduler_key_names(name: str) -> list[str]:
    """How docs/schedulers.md's row names a registered variant's keys, generated from its config dataclass:
    `` `key` `` per field but ``name``, `` `group.*` `` for a nested config (``predictor.*``)."""
    keys = dict.fromkeys(k.split(".")[0] + (".*" if "." in k else "")
                         for k in config_fields(get_spec(name).config_cls))
    return [f"`{k}`" for k in keys if k != "name"]


@pytest.mark.parametrize("scheduler", registered())
def test_every_registered_scheduler_builds_and_runs_on_every_cluster_it_supports(scheduler, monkeypatch):
    clusters = [c for c in options("cluster") if supports(scheduler, c)]
    assert clusters
    for cluster in clusters:
        run = with_scheduler(cluster_run(cluster), scheduler)
        res, built = run_tiny(run, scheduler, run.scheduler, monkeypatch)
        assert len(built) == 1
        policy = built[0]
        assert isinstance(policy, Policy), cluster
        assert policy.name == scheduler
        assert_completed(res, cluster)
        turn0 = [r for r in res.turns if r["turn"] == 0]
        if scheduler in NEEDS_PD:  # turn 0 is prefilled on a prefiller and decoded on a decoder
            assert all(r["disaggregated"] and r["prefill_instance"].startswith("prefiller")
                       and r["decode_instance"].startswith("decoder") for r in turn0), cluster
        else:
            assert not any(r["disaggregated"] for r in res.turns), cluster


def test_reference_scheduler_runs_on_every_cluster():
    for cluster in options("cluster"):
        run = cluster_run(cluster)
        conversations, stats = tiny_workload()
        out = slo_baseline.unloaded_ttfet(session.session_input(run), conversations, stats)
        assert set(out) == {c.conversation_id for c in CONVS}
        assert all(v > 0 for v in out.values()), (cluster, run.cfg.slo.reference_scheduler, out)


# ---- conf/README.md documents every key and option ----------------------------------------------------

def schema_keys() -> dict[str, list[str]]:
    """Every key of the groups conf/README.md keeps key tables for (nested keys with their parent's prefix): workload,
    slo, validity and the backends of ``CONF_README_BACKENDS``. Every key of every group has its entry in the generated
    docs/reference/config.md (tests/test_reference.py); conf/README.md links it for hardware, model, cluster, engine,
    logger and seed."""
    from harness.analysis.metrics import SloConfig
    from harness.analysis.validity import ValidityConfig
    from harness.workload.workload import WorkloadConfig

    keys = {"workload": config_fields(WorkloadConfig), "slo": config_fields(SloConfig),
            "validity": config_fields(ValidityConfig)}
    for name in CONF_README_BACKENDS:
        keys[f"backend={name}"] = config_fields(backends()[name].config_cls)
    return keys


# The backends conf/README.md has key tables for; every other registered backend documents its keys in its config
# class's docstring (test_every_other_backend_documents_its_keys_in_its_config_docstring). The scheduler
# variants' keys: docs/schedulers.md (test_every_registered_scheduler_is_an_option_with_a_docs_row_and_a_cluster).
CONF_README_BACKENDS = ("sim", "vllm")


def config_fields(cls, prefix: str = "") -> list[str]:
    """A config dataclass's keys, nested ones with their parent's prefix (``predictor.sigma``)."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += config_fields(type(default), f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def test_every_other_backend_documents_its_keys_in_its_config_docstring():
    """A backend without key tables in conf/README.md names each of its keys (read from the registry) in its
    config class's docstring: adding a backend does not touch conf/README.md."""
    for name in options("backend"):
        if name in CONF_README_BACKENDS:
            continue
        cls = backends()[name].config_cls
        missing = [k for k in config_fields(cls) if k != "name" and k not in (cls.__doc__ or "")]
        assert not missing, f"backend={name}: {cls.__qualname__}'s docstring does not name its keys {missing}"


def test_conf_readme_scheduler_key_tables_name_only_real_keys():
    """conf/README.md's key tables under ``## scheduler`` (the shipped variants' units and allowed values) name no
    key that no registered variant has (the complete list per variant is docs/schedulers.md's row)."""
    text = (CONF / "README.md").read_text()
    section = text[text.index("\n## scheduler\n"):text.index("\n## backend\n")]
    real = {k for n in registered() for k in config_fields(get_spec(n).config_cls)}
    real |= {k.split(".")[0] + ".*" for k in real if "." in k}
    named = {m for ln in section.splitlines() if ln.startswith("| `")
             for m in [ln.split("`")[1]]}
    assert named and not named - real, f"conf/README.md names scheduler keys that do not exist: {named - real}"


def test_conf_readme_documents_every_key_and_option():
    text = (CONF / "README.md").read_text()
    missing = [f"{group}: {key}" for group, ks in schema_keys().items() for key in ks if f"`{key}`" not in text]
    from harness.run.config import RunConfig
    missing += [f"section ## {f.name}" for f in dataclasses.fields(RunConfig) if f"\n## {f.name}\n" not in text]
    groups = [p.name for p in CONF.iterdir() if p.is_dir()] + ["scheduler", "backend"]
    missing += [f"section ## {g}" for g in groups if f"\n## {g}\n" not in text]
    # the scheduler variants are listed once, in docs/schedulers.md (linked from conf/README.md); other
    # backends than CONF_README_BACKENDS document themselves (their config docstring)
    missing += [f"option {g}={o}" for g in groups if g != "scheduler" for o in options(g)
                if f"`{o}`" not in text and not (g == "backend" and o not in CONF_README_BACKENDS)]
    missing += ["a link to docs/schedulers.md"] * ("(../docs/schedulers.md)" not in text)
    # the groups without key tables here point at their generated reference section
    missing += [f"a link to docs/reference/config.md#{g}" for g in ("hardware", "model", "cluster", "engine", "logger")
                if f"(../docs/reference/config.md#{g})" not in text]
    assert not missing, f"conf/README.md does not mention: {missing}"


# ---- bad inputs fail fast with the key named -----------------------------------------------------------

class SimulationStarted(BaseException):
    """Raised by the booby-trapped backend: a turn reached the simulated cluster (BaseException, so the
    runner's ``except Exception`` cannot swallow it)."""


def fail_before_simulation(overrides, monkeypatch, tmp_path) -> BaseException:
    """Resolve and execute ``overrides``; the error must come before any turn is simulated."""
    def boom(self, job):
        raise SimulationStarted(f"turn {job.conversation_id}/{job.turn} started before the config error")

    def no_launch(*args, **kwargs):
        raise SimulationStarted("a real-vLLM cluster was opened before the config error")

    monkeypatch.setattr(SimBackend, "start_turn", boom)
    try:
        import harness.vllm.cluster
        monkeypatch.setattr(harness.vllm.cluster, "open_cluster", no_launch)
    except ImportError:  # the vllm extra (aiohttp) is not installed: execute() cannot open a cluster either
        pass
    with pytest.raises(CONFIG_ERRORS) as ei:
        run = compose_run(overrides)
        runner.execute(run, tmp_path / "run")
    return ei.value


BAD = [
    # (overrides, substrings the message must contain)
    pytest.param(["scheduler=foo"], ["scheduler/foo", *registered()], id="unknown-scheduler-variant"),
    pytest.param(["+scheduler.bogus=1"], ["scheduler", "bogus"], id="unknown-scheduler-key"),
    pytest.param(["scheduler=ampd", "+scheduler.predictor.bogus=1"], ["bogus", "PredictorConfig"],
                 id="unknown-predictor-key"),
    pytest.param(["workload.rate_per_s=-1"], ["workload.rate_per_s", "-1"], id="negative-rate"),
    pytest.param(["workload.rate_per_s=0"], ["workload.rate_per_s"], id="zero-rate"),
    pytest.param(["workload.rate_per_s=abc"], ["workload.rate_per_s"], id="rate-not-a-number"),
    pytest.param(["workload.arrival=uniform"], ["workload.arrival", "uniform"], id="bad-arrival"),
    pytest.param(["workload.sample=random"], ["workload.sample"], id="bad-sample"),
    pytest.param(["workload.burstiness=0"], ["workload.burstiness"], id="zero-burstiness"),
    pytest.param(["workload.num_conversations=0"], ["workload.num_conversations"], id="zero-conversations"),
    pytest.param(["workload.max_turns=0"], ["workload.max_turns"], id="zero-max-turns"),
    pytest.param(["workload.trace=/nonexistent.jsonl"], ["workload.trace", "/nonexistent.jsonl"],
                 id="missing-trace"),
    pytest.param(["workload.rat=1"], ["workload.rat"], id="misspelt-workload-key"),
    pytest.param(["sed=1"], ["sed"], id="misspelt-top-level-key"),
    pytest.param(["seed=-1"], ["seed must be an integer >= 0", "-1"], id="negative-seed"),
    pytest.param(["workload.seed=-2"], ["workload.seed", "-2"], id="negative-workload-seed"),
    pytest.param(["cluster.instances.0.hardware=xyz"], ["cluster.instances[0].hardware", "xyz"],
                 id="unknown-hardware"),
    pytest.param(["cluster.instances.1.role=worker"], ["cluster.instances[1].role", "worker"], id="bad-role"),
    pytest.param(["cluster.instances.0.count=-1"], ["cluster.instances[0].count"], id="negative-count"),
    pytest.param(["cluster.instances.0.count=0"], ["cluster.instances[0].count"], id="zero-count"),
    pytest.param(["cluster.instances.0.count=1.5"], ["cluster.instances.0.count"], id="fractional-count"),
    pytest.param(["cluster.instances=[]"], ["cluster.instances"], id="no-instances"),
    pytest.param(["cluster.link.bandwidth_bytes_per_s=0"], ["cluster.link.bandwidth_bytes_per_s"],
                 id="zero-link-bandwidth"),
    pytest.param(["hardware.a40.power_cap_w=400"], ["hardware.a40.power_cap_w", "400"], id="power-cap-above-tdp"),
    pytest.param(["hardware.a40_200w.power_cap_w=301"], ["hardware.a40_200w.power_cap_w"],
                 id="power-cap-above-tdp-derived-profile"),
    pytest.param(["hardware.a40.idle_w=300"], ["hardware.a40.idle_w"], id="idle-not-below-tdp"),
    pytest.param(["hardware.h100.prefill_efficiency=1.5"], ["hardware.h100.prefill_efficiency"],
                 id="efficiency-above-1"),
    pytest.param(["engine.gpu_memory_utilization=1.5"], ["engine.gpu_memory_utilization", "1.5"],
                 id="gpu-memory-utilization-above-1"),
    pytest.param(["engine.block_size=0"], ["engine.block_size"], id="zero-block-size"),
    pytest.param(["model.num_kv_heads=5"], ["model.num_kv_heads"], id="kv-heads-not-divisor"),
    pytest.param(["slo.ttfet_multiple=0.5"], ["slo.ttfet_multiple", "0.5"], id="ttfet-multiple-below-1"),
    pytest.param(["slo=absolute", "slo.ttfet_s=null"], ["slo.ttfet_s"], id="absolute-slo-without-threshold"),
    pytest.param(["slo.tbt_s=0"], ["slo.tbt_s"], id="zero-tbt"),
    pytest.param(["slo.ttfet_definition=middle"], ["slo.ttfet_definition"], id="bad-ttfet-definition"),
    pytest.param(["backend.name=tgi"], ["backend.name", "tgi"], id="unknown-backend"),
    pytest.param(["backend=vllm"], ["slo.ttfet_mode"], id="vllm-with-relative-slo"),
    pytest.param(["backend=vllm", "slo=absolute", "backend.device=tpu"], ["backend.device"], id="vllm-bad-device"),
    pytest.param(["backend=vllm", "slo=absolute", "backend.launch=false"], ["backend.endpoints"],
                 id="vllm-no-endpoints"),
    pytest.param(["workload.kind=replay"], ["workload.kind", "replay"], id="bad-workload-kind"),
    pytest.param(["workload=wait_single", "workload.prompt_types.0.output_tokens=0"],
                 ["workload.prompt_types[0].output_tokens"], id="synthetic-zero-output"),
    pytest.param(["workload.token_scale=0"], ["workload.token_scale"], id="zero-token-scale"),
    pytest.param(["logger.metrics_interval_s=0"], ["logger.metrics_interval_s"], id="zero-metrics-interval"),
    # ---- checked when the policy is built (before any simulation: runner.check_policies) ----
    *[pytest.param(["cluster=a40_4x", f"scheduler={s}"], [s, "prefiller"], id=f"{s}-without-prefiller")
      for s in sorted(NEEDS_PD)],
    pytest.param(["cluster.instances.0.role=decoder"], ["conserve", "prefiller"], id="conserve-no-prefiller-role"),
    pytest.param(["scheduler=ampd", "scheduler.predictor.sigma=-1"], ["predictor.sigma", "-1"],
                 id="ampd-negative-sigma"),
    pytest.param(["scheduler=wait", "scheduler.predictor.mode=gaussian"], ["predictor.mode", "gaussian"],
                 id="wait-bad-predictor-mode"),
    pytest.param(["scheduler=disaggregated", "scheduler.decoder_choice=random"], ["scheduler.decoder_choice"],
                 id="bad-decoder-choice"),
    pytest.param(["scheduler.kv_admit_frac=1.5"], ["scheduler.kv_admit_frac"], id="kv-admit-frac-above-1"),
    pytest.param(["scheduler=nested_wait", "scheduler.output_bins=[256,64]"], ["scheduler.output_bins"],
                 id="decreasing-output-bins"),
    pytest.param(["scheduler=wait", "scheduler.margin=-1"], ["scheduler.margin", "-1"], id="wait-negative-margin"),
    pytest.param(["scheduler=nested_wait", "scheduler.eta=-1"], ["scheduler.eta", "-1"], id="nested-wait-negative-eta"),
    pytest.param(["scheduler.kv_admit_frac=abc"], ["kv_admit_frac"], id="scheduler-value-wrong-type"),
    pytest.param(["slo.reference_scheduler=foo"], ["slo.reference_scheduler", "foo"], id="unknown-reference-scheduler"),
    pytest.param(["scheduler=collocated", "cluster=a40_4x", "slo.reference_scheduler=conserve"],
                 ["conserve", "prefiller"], id="reference-scheduler-unsupported-by-cluster"),
    pytest.param(["workload.num_conversations=501"], ["workload.num_conversations", "501"],
                 id="more-conversations-than-trace"),
    pytest.param(["model=llama2_7b", "hardware.a40.mem_bytes=10e9"], ["llama2_7b", "a40"], id="model-does-not-fit"),
    pytest.param(["backend=vllm", "slo=absolute", "model=llama2_7b", "cluster=cpu_1x"], ["llama2_7b", "cpu"],
                 id="vllm-model-does-not-fit-hardware-profile"),
    pytest.param(["+workload.rat=1"], ["workload.rat"], id="appended-misspelt-key"),
    pytest.param(["+engine.max_num_seq=64"], ["engine.max_num_seq"], id="appended-misspelt-engine-key"),
]


@pytest.mark.parametrize(("overrides", "needles"), BAD)
def test_bad_input_fails_before_simulation_naming_the_key(overrides, needles, monkeypatch, tmp_path):
    err = fail_before_simulation(overrides, monkeypatch, tmp_path)
    msg = str(err)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in error message: {msg}"
    run_dir = tmp_path / "run"
    written = sorted(f.name for f in run_dir.rglob("*")) if run_dir.exists() else []
    assert not written, f"files written before the error: {written}"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trace_rows(bad_line: int | None = None) -> list[dict]:
    rows = []
    for k in range(1, 4):
        turns = [{"new_input_tokens": 100 * k, "reused_tokens": 0, "output_tokens": 10, "output_tokens_raw": 10,
                  "tool_time_s": 0.5, "visible": False},
                 {"new_input_tokens": 20, "reused_tokens": 100 * k + 10, "output_tokens": 5,
                  "output_tokens_raw": 5, "tool_time_s": 0.0, "visible": True}]
        if k == bad_line:
            turns[1]["output_tokens"] = -5
        rows.append({"conversation_id": f"conv{k}", "source": "synthetic", "turns": turns})
    return rows


def test_malformed_trace_fails_before_simulation(monkeypatch, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", trace_rows(bad_line=3))
    err = fail_before_simulation([f"workload.trace={bad}"], monkeypatch, tmp_path)
    assert isinstance(err, TraceError)
    assert f"{bad}:3:" in str(err) and "turns[1].output_tokens" in str(err)


def test_added_hardware_profile_is_named_by_its_key():
    run = compose_run(["+hardware@hardware.h100_b=h100", "cluster.instances.0.hardware=h100_b"])
    assert run.instances[0][2].name == "h100_b"


# ---- through the real CLI -----------------------------------------------------------------------------
# The CLI cases run run.py's main (harness.run.cli.main) on a command line; the SUBPROCESS ones as independent
# processes, all started with the module's first test (without xdist) and run in parallel with each other and with
# the in-process tests; each CLI test then waits for its own.

BAD_TRACE, GOOD_TRACE = "<bad-trace>", "<good-trace>"
CLI_BAD = [
    # (args, substrings stderr must contain, whether it is a one-line 'error: ...' from the harness)
    pytest.param(["scheduler=foo"], ["scheduler/foo", *registered()], False, id="unknown-scheduler-variant"),
    pytest.param(["workload.rat=1"], ["workload.rat"], False, id="misspelt-key"),
    pytest.param(["workload.rate_per_s=-1"], ["workload.rate_per_s"], True, id="negative-rate"),
    pytest.param([f"workload.trace={BAD_TRACE}"], [f"{BAD_TRACE}:3:", "turns[1].output_tokens"], True,
                 id="malformed-trace-names-file-and-line"),
    # a policy the run cannot build (runner.check_policies, after the run's lock is taken): one case through the CLI;
    # the others of that kind (an AMPD predictor sigma < 0, ...) are BAD's, in process
    pytest.param(["cluster=a40_4x", "scheduler=conserve"], ["prefiller"], True, id="conserve-without-prefiller"),
    # Hydra checks a sweep's non-sweep overrides against the swept group's default option (conserve has no
    # idle_policy): its error, then the harness's hint naming the ++ form (conf/README.md, "hydra")
    pytest.param(["-m", "scheduler=wait,nested_wait", "scheduler.idle_policy=decode_residents"],
                 ["idle_policy", "ConserveConfig", "++scheduler.idle_policy="], False, id="sweep-key-of-swept-group"),
]
CLI_GOOD = {"tiny-run": [f"workload.trace={GOOD_TRACE}", "cluster=a40_1p3d"]}


# the cases run through a real `python run.py` process (its interpreter, __main__ block and exit status): a Hydra
# refusal and a harness one; the others run run.py's main in this process (run_py_in_process: the same code from
# cli.main on, without a Python start-up and the command line's imports each)
SUBPROCESS = ("misspelt-key", "negative-rate")


class CliRuns:
    """Every CLI case. ``start()`` launches the :data:`SUBPROCESS` cases at once, ``get(case, ...)`` returns
    ``(run_dir, CompletedProcess)``: a subprocess case's (started if needed, then waited for), or the case run in
    this process (:func:`tests.conftest.run_py_in_process`)."""

    def __init__(self, base: Path):
        self.base = base
        self.traces = {BAD_TRACE: str(write_jsonl(base / "bad.jsonl", trace_rows(bad_line=3))),
                       GOOD_TRACE: str(write_jsonl(base / "good.jsonl", trace_rows()))}
        self.procs: dict[str, tuple[Path, subprocess.Popen]] = {}
        self.done: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def subst(self, text: str) -> str:
        for k, v in self.traces.items():
            text = text.replace(k, v)
        return text

    def args(self, case: str) -> tuple[Path, list[str]]:
        """The case's run directory and command-line arguments (after ``run.py``)."""
        args = ({p.id: p.values[0] for p in CLI_BAD} | CLI_GOOD)[case]
        run_dir = self.base / case / "run"
        return run_dir, [*(self.subst(a) for a in args), "logger.progress=false", f"hydra.run.dir={run_dir}",
                         f"hydra.sweep.dir={self.base / case / 'sweep'}"]

    def start(self, only: str | None = None) -> None:
        """Launch every :data:`SUBPROCESS` case not yet started (or just ``only``)."""
        env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
        for case in SUBPROCESS:
            if case in self.procs or (only is not None and case != only):
                continue
            run_dir, args = self.args(case)
            self.procs[case] = (run_dir, subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT_ROOT,
                                                          env=env, text=True, stdout=subprocess.PIPE,
                                                          stderr=subprocess.PIPE))

    def get(self, case: str, monkeypatch, capsys) -> tuple[Path, subprocess.CompletedProcess]:
        if case not in SUBPROCESS:
            run_dir, args = self.args(case)
            return run_dir, run_py_in_process(args, monkeypatch, capsys)
        self.start(only=case)
        if case not in self.done:
            run_dir, p = self.procs[case]
            out, err = p.communicate(timeout=120)
            self.done[case] = (run_dir, subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return self.done[case]

    def close(self) -> None:
        for _, p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.fixture(scope="module", autouse=True)
def cli_runs(tmp_path_factory):
    """Module-wide: without xdist the subprocess cases start with the module's first test and run on the spare
    core while the in-process tests run; under xdist each worker starts a case only when it reaches it."""
    runs = CliRuns(tmp_path_factory.mktemp("cli"))
    if "PYTEST_XDIST_WORKER" not in os.environ:
        runs.start()
    yield runs
    runs.close()


@pytest.mark.parametrize(("args", "needles", "one_line"), CLI_BAD)
def test_cli_bad_input(args, needles, one_line, request, cli_runs, monkeypatch, capsys):
    run_dir, p = cli_runs.get(request.node.callspec.id, monkeypatch, capsys)
    needles = [cli_runs.subst(n) for n in needles]
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle in p.stderr, f"{needle!r} not in stderr:\n{p.stderr}"
    if one_line:  # harness errors are one 'error: ...' line naming the key, exit status 2
        assert p.returncode == 2, p.stderr
        assert any(l.startswith("error: ") and needles[0] in l for l in p.stderr.splitlines()), p.stderr
    # Nothing but Hydra's own files: the error came before the run wrote config.yaml / meta.json / results.
    written = sorted(str(f.relative_to(run_dir)) for f in run_dir.rglob("*")
                     if f.is_file() and f.name != "run.log" and ".hydra" not in f.parts) if run_dir.exists() else []
    assert not written, f"files written despite the error: {written}"


def test_sweep_key_hint_only_for_a_key_of_a_swept_group():
    """The hint's rule, case by case: a multirun, a group swept by a comma list, a plain (not +/++) override
    of a key inside that group."""
    from harness.run.cli import sweep_key_hint
    hint = sweep_key_hint(["-m", "scheduler=wait,nested_wait", "scheduler.idle_policy=decode_residents",
                           "workload.seed=1"])
    assert hint is not None and "++scheduler.idle_policy=..." in hint and "workload.seed" not in hint
    assert sweep_key_hint(["scheduler=wait", "scheduler.idle_policy=decode_residents"]) is None      # no -m
    assert sweep_key_hint(["-m", "scheduler=wait,nested_wait", "++scheduler.idle_policy=x"]) is None  # already ++
    assert sweep_key_hint(["-m", "scheduler=wait", "scheduler.idle_policy=x"]) is None               # not swept
    assert sweep_key_hint(["-m", "workload.rate_per_s=0.1,0.2", "workload.seed=1"]) is None          # a key sweep
    assert "++backend.x=..." in sweep_key_hint(["--multirun", "backend=sim,vllm", "backend.x=1"])


def test_cli_tiny_run_writes_results(cli_runs, monkeypatch, capsys):
    """Positive control for the CLI checks above: a valid run exits 0 and writes turns.parquet."""
    run_dir, p = cli_runs.get("tiny-run", monkeypatch, capsys)
    assert p.returncode == 0, p.stderr
    assert (run_dir / "turns.parquet").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_conversations"] == 3 and summary["num_conversations_failed"] == 0
