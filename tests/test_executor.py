"""The sweep executor (``harness.run.executor``, ``hydra/launcher=pool``, the default launcher of ``-m``):
worker counts, and a sweep's results byte-identical to one ``python run.py`` process per job.

The reference is independent of the executor: each job run alone in a fresh interpreter (no cache of an earlier
job can be in it), with the disk cache of SLO baselines off in both (``HARNESS_CACHE_DIR=off``), so the sweep's
workers compute every baseline, trace parse and policy themselves and reuse them across their jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.analysis.cost import VOLATILE_KEYS
from harness.run.config import PROJECT_ROOT
from harness.run.executor import usable_cores, workers_for

TABLES = ("turns.parquet", "conversations.parquet", "decisions.parquet", "instances.parquet")
TINY = ["workload.num_conversations=4", "workload.max_turns=3", "logger.progress=false"]


def test_worker_count_follows_n_jobs_the_cores_and_the_jobs():
    cores = len(os.sched_getaffinity(0))
    assert usable_cores() == cores
    assert workers_for(None, 100) == cores and workers_for(-1, 100) == cores and workers_for(0, 100) == cores
    assert workers_for(3, 100) == 3 and workers_for(3, 2) == 2 and workers_for(None, 1) == 1
    assert workers_for(5, 0) == 1
    with pytest.raises(ValueError, match="hydra.launcher.n_jobs"):
        workers_for("2", 4)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "HARNESS_CACHE_DIR": "off"}


def test_a_pooled_sweep_equals_one_process_per_run_byte_for_byte(tmp_path):
    """Three jobs (three variants, one seed, relative SLO: the seed's baseline replayed once per worker and reused)
    on two persistent workers, so one worker runs two jobs after each other; each job then alone in its own
    process.
    Every results table byte for byte, ``summary.json`` equal but for :data:`VOLATILE_KEYS` (wall clock, cost),
    and the start line names the worker count."""
    sweep = tmp_path / "sweep"
    jobs = [[f"scheduler={s}"] for s in ("conserve", "collocated", "ampd")]
    r = subprocess.run([sys.executable, "run.py", "-m", "scheduler=conserve,collocated,ampd", *TINY,
                        "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"], cwd=PROJECT_ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sweep executor: 3 jobs on 2 worker processes" in r.stdout
    dirs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(dirs) == 3
    procs = []
    for i, job in enumerate(jobs):
        out = tmp_path / f"alone_{i}"
        procs.append((job, out, subprocess.Popen([sys.executable, "run.py", *job, *TINY, f"hydra.run.dir={out}"],
                                                 cwd=PROJECT_ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True)))
        if len(procs) % 2 == 0 or len(procs) == len(jobs):   # two at a time
            for _, _, p in procs[-2:]:
                assert p.wait(timeout=600) == 0, p.stderr.read()[-3000:]
    for job, out, _ in procs:
        twin = next(d for d in dirs if set(job) <= set(_overrides(d)))
        assert (out / "turns.parquet").stat().st_size > 0
        for t in TABLES:
            if (out / t).exists() or (twin / t).exists():
                assert (out / t).read_bytes() == (twin / t).read_bytes(), f"{job}: {t} differs"
        a, b = (json.loads((d / "summary.json").read_text()) for d in (out, twin))
        assert a.keys() == b.keys()
        diff = [k for k in a if k not in VOLATILE_KEYS and a[k] != b[k] and not (a[k] != a[k] and b[k] != b[k])]
        assert not diff, f"{job}: summary.json differs in {diff}"
        assert not a.get("partial") and a["num_conversations"] == 4


def test_a_spawned_pool_runs_the_sweep_as_the_forked_pool_does(tmp_path):
    """``hydra.launcher.start_method=spawn``: each worker gets Hydra's singleton state by pickle, its OmegaConf
    resolvers by name (``picklable_singleton_state``; a resolver is a function pickle cannot name) and the Hydra
    object with its on-demand help (a partial, not a bound method). Until 2026-12-07 such a sweep died before
    its first job (``Can't pickle local object ... resolver_wrapper``, then ``'Hydra' object has no attribute
    '_get_help_on_demand'``). Two seeds on two spawned workers and on two forked ones: every table byte for
    byte."""
    outs = {}
    for method in ("spawn", "fork"):
        sweep = tmp_path / method
        r = subprocess.run([sys.executable, "run.py", "-m", "seed=0,1", *TINY, "hydra.launcher.n_jobs=2",
                            f"hydra.launcher.start_method={method}", f"hydra.sweep.dir={sweep}"], cwd=PROJECT_ROOT,
                           env=_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"sweep executor: 2 jobs on 2 worker processes ({method})" in r.stdout
        outs[method] = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [d.name for d in outs["spawn"]] == [d.name for d in outs["fork"]] and len(outs["fork"]) == 2
    for a, b in zip(outs["spawn"], outs["fork"]):
        assert (a / "turns.parquet").stat().st_size > 0
        for t in TABLES:
            assert (a / t).exists() == (b / t).exists(), t
            if (a / t).exists():
                assert (a / t).read_bytes() == (b / t).read_bytes(), f"{a.name}: {t} differs"


def test_a_spawned_worker_names_a_resolver_it_lacks():
    """A resolver the launching process registered but a spawned worker's imports did not: the worker's error
    names it (``_with_resolvers``), where ``Singleton.set_state`` would have run the jobs without it."""
    from harness.run.executor import _with_resolvers, picklable_singleton_state
    state = picklable_singleton_state({"instances": {}, "omegaconf_resolvers": {"harness_no_such": None,
                                                                                "pid": None}})
    assert state["omegaconf_resolvers"] == ["harness_no_such", "pid"]
    with pytest.raises(RuntimeError, match="harness_no_such"):
        _with_resolvers(state)
    from omegaconf.basecontainer import BaseContainer
    have = _with_resolvers({"instances": {}, "omegaconf_resolvers": ["pid"]})["omegaconf_resolvers"]
    assert list(have) == ["pid"] and have["pid"] is BaseContainer._resolvers["pid"]


def _overrides(run_dir) -> list[str]:
    import yaml
    return list(yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()))


def test_a_jobs_config_is_composed_once_and_handed_out_as_fresh_copies():
    """``ComposedConfigs``: three loads of one job (the harness's validation, Hydra's, the launch) compose it once;
    each caller gets its own copy (the launcher writes the job number into it); another job or another primary
    config composes anew; any other attribute is the wrapped loader's."""
    from omegaconf import OmegaConf, open_dict

    from harness.run.executor import ComposedConfigs

    class Loader:
        calls: list = []
        name = "the loader"

        def load_sweep_config(self, master, overrides):
            self.calls.append(list(overrides))
            return OmegaConf.create({"job": {"num": 0}, "overrides": list(overrides), "master": master.tag})

    loader = Loader()
    memo = ComposedConfigs(loader)
    master = OmegaConf.create({"tag": "a"})
    first = memo.load_sweep_config(master, ["scheduler=wait"])
    with open_dict(first):
        first.job.num = 7
    again = [memo.load_sweep_config(master, ["scheduler=wait"]) for _ in range(2)]
    assert loader.calls == [["scheduler=wait"]]
    assert all(c.job.num == 0 and list(c.overrides) == ["scheduler=wait"] for c in again)
    assert again[0] is not again[1]
    memo.load_sweep_config(master, ["scheduler=ampd"])
    memo.load_sweep_config(OmegaConf.create({"tag": "b"}), ["scheduler=wait"])
    assert len(loader.calls) == 3 and memo.name == "the loader"
    memo.clear()
    memo.load_sweep_config(master, ["scheduler=wait"])
    assert len(loader.calls) == 4


def test_an_interrupt_in_a_pooled_job_writes_its_partial_results_and_ends_the_sweep_130(tmp_path):
    """Two jobs on two workers, each interrupted (SIGINT sent to itself, ``HARNESS_TEST_INTERRUPT``, once per
    process: each worker has its own copy of the variable) as its first conversation finishes: each job's
    ``summary.json`` is partial with ``interrupted.json`` beside it, the sweep exits 130 and writes no
    ``comparison.md``; re-running the command completes both."""
    sweep = tmp_path / "sweep"
    args = [sys.executable, "run.py", "-m", "scheduler=conserve,collocated", *TINY, "slo=absolute",
            "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(args, cwd=PROJECT_ROOT, env={**_env(), "HARNESS_TEST_INTERRUPT": "run:0:INT"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 130, r.stderr[-3000:]
    assert "the sweep stops here" in r.stderr
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0_conserve", "1_collocated"]
    for job in jobs:
        assert json.loads((job / "summary.json").read_text())["partial"] is True
        assert (job / "interrupted.json").is_file()
    assert not (sweep / "comparison.md").exists()
    r2 = subprocess.run(args, cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert all(json.loads((job / "summary.json").read_text())["partial"] is False for job in jobs)
    assert (sweep / "comparison.md").is_file()


# Overrides of every kind a sweep's jobs carry, and some they may: config groups (first, last, with a package,
# appended), values (float, int, null, a list, an interpolation, a string), hydra's own keys, a force-add,
# reordered ones, and errors (an unknown key, an unknown option), over three sets of config-group overrides (the
# memo is keyed by them), each case composed twice so the memo is hit.
COMPOSE_CASES = [
    ["scheduler=wait", "workload.rate_per_s=0.1"],
    ["workload.rate_per_s=0.02", "scheduler=wait", "workload.seed=3", "workload.num_conversations=7"],
    ["scheduler=wait", "scheduler.output_bins=[8,16]", "workload.max_turns=null", "engine.step_mode=v0_prefill_first",
     "hydra.job.chdir=true", "hydra.run.dir=/tmp/x", "++workload.note=x", "workload.rate_per_s=${workload.seed}"],
    ["scheduler=wait", "workload.bogus=1"],
    ["+experiment=conserve_rate_sweep", "+experiment/variant=wait_dr", "workload.rate_per_s=0.04"],
    ["+experiment=conserve_rate_sweep", "+experiment/variant=wait_dr", "workload.rate_per_s=0.08", "workload.seed=1"],
    ["scheduler=nope"],
    ["scheduler=ampd", "workload.rate_per_s=0.1"],
    ["slo=absolute", "scheduler=conserve", "workload.seed=2"],
    # a preset that sets the model (its defaults list leaves the last one merged at the model: the config merged up to
    # there, Hydra's own and the hardware profiles, is memoised), then a model chosen on the command line, which
    # merges onto that config
    ["+experiment=wait_paper", "workload.seed=4"],
    ["model=llama2_7b", "cluster=a40_4x"],
]
ERRORS = (3, 6)     # the cases Hydra refuses: an unknown key, an unknown option


def test_the_compose_cache_equals_hydras_own_compose_for_every_kind_of_override():
    """``ComposeCache``: each case (:data:`COMPOSE_CASES`) composed twice through the memo equals Hydra's own
    ``_load_configuration_impl`` of the same overrides: the whole config with its ``hydra`` node (as containers,
    with every mapping's key order, which is what its YAML is made of), the flags (struct; ``hydra`` writable) and each node's type; a case Hydra refuses is
    refused the same way (the same exception type and message). The memo composes once per set of config-group
    overrides (the cases with the same groups share it), a case whose groups differ only from the scheduler on
    merges onto the memoised config of the defaults before it, and the cache is installed on this Hydra (its
    ``_load_configuration_impl`` is the code the cache repeats)."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from harness.run.config import register_configs
    from harness.run.executor import ComposeCache, cache_compositions

    def ordered(x):
        """A plain container with every mapping's key order kept (a list of pairs): what ``OmegaConf.to_yaml``
        writes, compared without PyYAML's emitter (~0.07 s of CPU a config, four per case)."""
        if isinstance(x, dict):
            return [(k, ordered(v)) for k, v in x.items()]
        return [ordered(v) for v in x] if isinstance(x, list) else (type(x), x)

    def shown(cfg):
        types = {k: str(OmegaConf.get_type(cfg, k)) for k in cfg}
        return (ordered(OmegaConf.to_container(cfg)), OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg.hydra),
                types)

    def outcome(fn, overrides):
        try:
            return shown(fn(config_name="config", overrides=list(overrides), run_mode=RunMode.RUN))
        except Exception as e:      # noqa: BLE001 -- compared, never swallowed
            return (type(e).__name__, str(e))

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        hydras = loader._load_configuration_impl
        cache = cache_compositions(loader)
        assert isinstance(cache, ComposeCache) and loader._load_configuration_impl is cache
        errors = []
        for i, case in enumerate(COMPOSE_CASES):
            want = outcome(lambda **k: ConfigLoaderImpl._load_configuration_impl(loader, **k), case)
            if len(want) == 2:
                errors.append(i)
            for _ in range(2):
                assert outcome(cache, case) == want, case
            assert outcome(loader.load_configuration, case) == want, case   # (Hydra's entry point, through it)
        assert hydras is not cache
    # the ampd and slo cases differ from the first in groups late in the defaults list: their configs are merged onto
    # the memoised config of the defaults before the scheduler's; the experiment case's onto the defaults list the
    # unknown key's refused compose merged (Hydra's own compose, its merge through the same memo); the model case's
    # onto the config memoised where wait_paper's list forked
    assert tuple(errors) == ERRORS and cache.hits >= len(COMPOSE_CASES) and cache.misses == 6
    assert cache.prefix_hits == 4


def test_fresh_copy_is_a_deep_copy_that_shares_nothing_with_its_source():
    """``fresh_copy`` (a pickle round trip): the copy has the source's values, interpolations, flags and node
    types, resolves its interpolations inside itself, and a change to it leaves the source as it was; a value
    pickle cannot take (a function, under ``allow_objects``) falls back to ``copy.deepcopy``."""
    from omegaconf import OmegaConf, read_write

    from harness.run.executor import fresh_copy

    src = OmegaConf.create({"a": {"b": 1, "c": "${a.b}"}, "l": [1, 2]})
    OmegaConf.set_struct(src, True)
    OmegaConf.set_readonly(src.a, True)
    c = fresh_copy(src)
    assert c is not src and c.a is not src.a
    assert OmegaConf.to_yaml(c) == "a:\n  b: 1\n  c: ${a.b}\nl:\n- 1\n- 2\n" == OmegaConf.to_yaml(src)
    assert OmegaConf.is_struct(c) and OmegaConf.is_readonly(c.a) and not OmegaConf.is_readonly(c)
    with read_write(c.a):
        c.a.b = 5
    c.l.append(3)
    assert (c.a.c, list(c.l)) == (5, [1, 2, 3])          # the copy's interpolation reads the copy
    assert (src.a.b, src.a.c, list(src.l)) == (1, 1, [1, 2])

    def f():
        return 0
    odd = OmegaConf.create({"f": f}, flags={"allow_objects": True})
    c = fresh_copy(odd)     # (a local function: pickle refuses it)
    assert c is not odd and c.f is f


def test_the_compose_cache_reads_each_config_file_once_and_hands_each_compose_its_own_copy(tmp_path, monkeypatch):
    """``ComposeCache``'s file cache on a hand-written config tree: each file is read from disk once per primary
    config name and process, every compose merges its own copy (a value override of one compose never shows in
    another: the file's value comes back), an edit of a file after its first read is seen by a new cache (a new
    process) and not by this one, and another primary config name reads its own files."""
    from hydra import initialize_config_dir
    from hydra._internal.config_repository import ConfigRepository
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from harness.run.executor import cache_compositions

    conf = tmp_path / "conf"
    (conf / "sched").mkdir(parents=True)
    (conf / "opt").mkdir()
    (conf / "config.yaml").write_text("defaults:\n  - sched: a\n  - _self_\ntop: 1\n")
    (conf / "other.yaml").write_text("defaults:\n  - sched: b\n  - _self_\ntop: 2\n")
    (conf / "sched" / "a.yaml").write_text("name: a\nrate: 0.5\n")
    (conf / "sched" / "b.yaml").write_text("name: b\nrate: 0.25\n")
    (conf / "opt" / "x.yaml").write_text("flag: true\n")
    reads: list = []    # the configs read from their sources (Hydra's ConfigRepository, under every cache)
    load = ConfigRepository.load_config

    def counted(self, config_path):
        reads.append(config_path)
        return load(self, config_path)
    monkeypatch.setattr(ConfigRepository, "load_config", counted)

    def value(cache, overrides, name="config"):
        cfg = cache(config_name=name, overrides=list(overrides), run_mode=RunMode.RUN)
        return cfg.top, cfg.sched.name, cfg.sched.rate, cfg.get("opt", {}).get("flag")

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cache = cache_compositions(GlobalHydra.instance().config_loader())
        assert value(cache, ["sched=a", "sched.rate=0.9"]) == (1, "a", 0.9, None)     # a miss
        assert value(cache, ["sched=b", "sched.rate=0.7"]) == (1, "b", 0.7, None)     # a miss
        assert value(cache, ["sched=a"]) == (1, "a", 0.5, None)                       # a hit: the file's value
        assert value(cache, ["sched=b", "+opt=x"]) == (1, "b", 0.25, True)            # a miss: b's copy, fresh
        assert (cache.misses, cache.hits, cache.fallbacks) == (3, 1, 0)
        assert sorted(p for p in reads if p.startswith("sched/")) == ["sched/a", "sched/b"]
        assert reads.count("config") == 1 and reads.count("opt/x") == 1
        (conf / "sched" / "a.yaml").write_text("name: a\nrate: 0.125\n")
        assert value(cache, ["sched=a", "+opt=x"]) == (1, "a", 0.5, True)     # read once per process: not again
        assert value(cache, [], name="other") == (2, "b", 0.25, None)          # its own files
        assert reads.count("other") == 1 and reads.count("sched/b") == 2
        # a sweep's primary config (a sweep override): Hydra's own compose, its files from the cache
        sweep = cache(config_name="config", overrides=["sched=a,b", "top=3"], run_mode=RunMode.MULTIRUN)
        assert (sweep.top, sweep.sched.name, sweep.sched.rate) == (3, "a", 0.5) and cache.fallbacks == 1
        assert reads.count("config") == 1 and reads.count("sched/a") == 1
        # no group chosen: the whole defaults list's merge is memoised, so a second run mode merges nothing
        before = cache.prefix_hits
        assert value(cache, ["top=4"]) == (4, "a", 0.5, None)
        assert cache(config_name="config", overrides=["top=5"], run_mode=RunMode.MULTIRUN).top == 5
        assert cache.prefix_hits == before + 1
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        fresh = cache_compositions(GlobalHydra.instance().config_loader())
        assert fresh is not cache
        assert value(fresh, ["sched=a", "+opt=x"]) == (1, "a", 0.125, True)   # a new process reads the edit
    GlobalHydra.instance().clear()


def test_the_compose_cache_lists_a_groups_options_as_hydra_does(tmp_path):
    """``ComposeCache.group_options`` (the loader's ``get_group_options`` once the cache is installed: ``--help``
    lists every group through it) on a hand-written config tree: group ``sched`` has the configs a and b, ``opt``
    has x and the sub-group ``deep`` with y; each answer equals Hydra's own ``get_group_options`` for the same
    group, filter and primary config, and a config file added to a group after the first listing is listed (the
    directory is read on each call, as Hydra reads it)."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    from harness.run.executor import cache_compositions

    conf = tmp_path / "conf"
    (conf / "sched").mkdir(parents=True)
    (conf / "opt" / "deep").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - sched: a\n  - _self_\ntop: 1\n")
    for path in ("sched/a", "sched/b", "opt/x", "opt/deep/y"):
        (conf / f"{path}.yaml").write_text("v: 1\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        cache = cache_compositions(loader)
        assert loader.get_group_options == cache.group_options

        def hydras(*a, **k):
            return ConfigLoaderImpl.get_group_options(loader, *a, **k)
        want = {("sched", ObjectType.CONFIG): ["a", "b"], ("opt", ObjectType.CONFIG): ["x"],
                ("opt", ObjectType.GROUP): ["deep"], ("opt", None): ["deep", "x"], ("opt/deep", ObjectType.CONFIG): ["y"]}
        for (group, kind), options in want.items():
            for name in (None, "config"):
                assert sorted(loader.get_group_options(group, kind, config_name=name)) == options
                assert sorted(hydras(group, kind, config_name=name)) == options
        assert sorted(loader.get_group_options("sched")) == ["a", "b"]          # the default filter: configs
        assert sorted(loader.get_group_options("", ObjectType.GROUP)) == sorted(hydras("", ObjectType.GROUP))
        (conf / "sched" / "c.yaml").write_text("v: 2\n")
        assert sorted(loader.get_group_options("sched")) == ["a", "b", "c"] == sorted(hydras("sched"))
    GlobalHydra.instance().clear()


def test_the_command_line_gives_hydras_loader_its_compose_cache_from_the_start():
    """``harness.run.cli._compose_cache_from_the_start``: inside it, the Hydra the command line creates
    (``Hydra.create_main_hydra2``) has a ``ComposeCache`` on its loader before its first compose; after it,
    Hydra's own ``create_main_hydra2`` is back (a loader made then has none)."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra._internal.utils import create_config_search_path

    from harness.run.cli import _compose_cache_from_the_start
    from harness.run.executor import ComposeCache

    own = Hydra.__dict__["create_main_hydra2"]
    search = create_config_search_path(str(PROJECT_ROOT / "conf"))
    GlobalHydra.instance().clear()
    try:
        with _compose_cache_from_the_start():
            made = Hydra.create_main_hydra2("t", search)
            assert isinstance(made.config_loader.__dict__.get("_load_configuration_impl"), ComposeCache)
        assert Hydra.__dict__["create_main_hydra2"] is own
        GlobalHydra.instance().clear()
        plain = Hydra.create_main_hydra2("t", search)
        assert "_load_configuration_impl" not in plain.config_loader.__dict__
    finally:
        GlobalHydra.instance().clear()


def test_fresh_copy_keeps_a_class_its_module_no_longer_names(monkeypatch):
    """Hydra's plug-in scan executes a plug-in module again where it is imported already
    (``Singleton.set_state``), so its dataclasses become new classes and a config built on the first ones cannot
    be pickled ("not the same object"); ``fresh_copy`` then keeps the classes by reference, as ``copy.deepcopy``
    does: the same values, node types and object type as the deep copy, nothing shared with the source."""
    import copy
    import dataclasses
    import pickle
    import types

    from omegaconf import OmegaConf

    from harness.run import executor

    monkeypatch.setattr(executor, "_PLAIN_PICKLE_FAILED", [])
    mod = types.ModuleType("h3_rescanned_plugin")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    def define():
        @dataclasses.dataclass
        class LauncherConf:
            n_jobs: int = 1
            start_method: str = "fork"
        LauncherConf.__module__, LauncherConf.__qualname__ = mod.__name__, "LauncherConf"
        mod.LauncherConf = LauncherConf
        return LauncherConf

    first = define()
    cfg = OmegaConf.create({"hydra": {"launcher": OmegaConf.structured(first)}, "seed": 3})
    pickle.dumps(cfg)          # (the module names the class: plain pickle works, and is what fresh_copy uses)
    assert not executor._PLAIN_PICKLE_FAILED and _launcher_type(executor.fresh_copy(cfg)) is first
    define()                   # the module executed again: a new class of the same name
    with pytest.raises(pickle.PicklingError, match="not the same object"):
        pickle.dumps(cfg)
    c, d = executor.fresh_copy(cfg), copy.deepcopy(cfg)
    assert executor._PLAIN_PICKLE_FAILED   # (later copies in this process skip the plain attempt)
    assert _launcher_type(c) is first is _launcher_type(d)
    assert OmegaConf.to_yaml(c) == OmegaConf.to_yaml(d) == "hydra:\n  launcher:\n    n_jobs: 1\n    start_method: fork\nseed: 3\n"
    c.hydra.launcher.n_jobs = 4
    assert cfg.hydra.launcher.n_jobs == 1 and c.hydra.launcher is not cfg.hydra.launcher
    with pytest.raises(Exception):   # the node's type is still the schema: a str is not an int
        c.hydra.launcher.n_jobs = "many"


def _launcher_type(cfg):
    """The object type of ``cfg.hydra.launcher`` (the class its structured config was built from)."""
    from omegaconf import OmegaConf
    return OmegaConf.get_type(cfg.hydra, "launcher")


def test_the_pool_launchers_schema_survives_hydras_plugin_rescan():
    """In a fresh interpreter: a config holding the pool launcher's schema, built before Hydra's plug-in scan
    runs again (``Singleton.set_state``: a spawned worker, a Slurm / Ray task), still pickles afterwards, and
    the plug-in module's ``PoolLauncherConf`` is the one of ``_conf`` (a module the scan does not execute
    again); Hydra's own ``BasicSweeperConf``, defined in a module the scan does execute again, does not pickle
    afterwards (why ``fresh_copy`` keeps classes by reference, and why the executor skips ``set_state``
    where the process already holds Hydra's state)."""
    code = """
import pickle
from omegaconf import OmegaConf
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
Plugins.instance()
from hydra_plugins.harness_launcher import _conf, pool_launcher
from hydra._internal.core_plugins import basic_sweeper
pool = OmegaConf.structured(pool_launcher.PoolLauncherConf)
sweeper = OmegaConf.structured(basic_sweeper.BasicSweeperConf)
Singleton.set_state(Singleton.get_state())
pickle.dumps(pool)
assert pool_launcher.PoolLauncherConf is _conf.PoolLauncherConf
try:
    pickle.dumps(sweeper)
except pickle.PicklingError as e:
    print("sweeper:", e)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "ok" and "sweeper: Can't pickle" in r.stdout


def test_copy_as_deepcopy_keeps_deepcopys_parents():
    """``copy_as_deepcopy`` (``run_job``'s ``copy.deepcopy``) on ``HydraConfig``'s node -- a root with one child,
    ``hydra``, whose parent is the whole job config -- equals ``copy.deepcopy``: the same text, the copy's
    ``hydra`` node has the copy as its parent (an interpolation into the job's keys fails in both, as in Hydra's
    own), and the source keeps its parent; a plain pickle round trip would have copied the whole config with it."""
    import copy

    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationKeyError

    from harness.run.executor import copy_as_deepcopy, fresh_copy

    full = OmegaConf.create({"hydra": {"job": {"num": 3}, "seed_env": "${workload.seed}", "n": "${hydra.job.num}"},
                             "workload": {"seed": 7}})
    masked = OmegaConf.masked_copy(full, "hydra")
    masked.hydra._set_parent(full)
    assert masked.hydra.seed_env == 7     # (HydraConfig's node sees the whole config)
    c, d = copy_as_deepcopy(masked), copy.deepcopy(masked)
    assert OmegaConf.to_yaml(c) == OmegaConf.to_yaml(d) == OmegaConf.to_yaml(masked)
    assert c.hydra._get_parent() is c and d.hydra._get_parent() is d and c._get_parent() is None
    assert masked.hydra._get_parent() is full and masked._get_parent() is None
    assert c.hydra.n == d.hydra.n == 3
    for x in (c, d):
        with pytest.raises(InterpolationKeyError):
            x.hydra.seed_env
    assert fresh_copy(masked).hydra.seed_env == 7   # (pickled as it is: the whole config came along)


def test_parse_overrides_equals_hydras_parser_and_keeps_no_sweep():
    """``parse_overrides``: the same ``Override`` values as Hydra's parser for groups, values, dicts, lists,
    additions, deletions and quoted strings, each call its own objects; a sweep override is parsed again each
    time (not kept); a bad override raises Hydra's own error."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from harness.run import executor

    args = ["scheduler=wait", "workload.rate_per_s=0.1", "+x.y={a: 1, b: [2, 3]}", "~model", "s='quoted, string'",
            "l=[1,2]", "++k=null", "workload.seed=0"]
    want = OverridesParser.create().parse_overrides(args)
    for _ in range(2):
        got = executor.parse_overrides(args)
        assert got == want and all(g is not w for g, w in zip(got, want))
        assert [g.input_line for g in got] == args
    assert all(a in executor._PARSED for a in args)
    sweep = executor.parse_overrides(["workload.seed=0,1"])
    assert sweep[0].is_sweep_override() and "workload.seed=0,1" not in executor._PARSED
    with pytest.raises(OverrideParseException) as mine:
        executor.parse_overrides(["scheduler=wait", "bad=[1,"])
    with pytest.raises(OverrideParseException) as theirs:
        OverridesParser.create().parse_overrides(["scheduler=wait", "bad=[1,"])
    assert str(mine.value) == str(theirs.value)


def test_job_heap_collects_the_jobs_garbage_and_freezes_the_rest_meanwhile(monkeypatch):
    """``job_heap``: during a job the process's earlier objects are frozen (``gc.get_freeze_count``) and
    ``harness.run.runner`` is told not to freeze and unfreeze itself; after the job nothing is frozen, the
    job's own cyclic garbage is gone, and garbage made before the job (frozen through it) is collected by the
    full collection every ``FULL_GC_EVERY`` jobs. Automatic collections are off meanwhile, so only job_heap's
    own collect."""
    import gc
    import weakref

    from harness.run import executor

    class Node:
        pass

    def cycle():
        n = Node()
        n.me = n
        return weakref.ref(n)

    was = gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(executor, "_FULL_GC", [10 ** 9, 0])   # (no full collection due)
        old = cycle()
        with executor.job_heap():
            assert executor.JOB_HEAP_FROZEN[0] and gc.get_freeze_count() > 0
            mine = cycle()
        assert not executor.JOB_HEAP_FROZEN[0] and gc.get_freeze_count() == 0
        assert mine() is None and old() is not None   # (the earlier garbage was frozen through the job)
        monkeypatch.setattr(executor, "_FULL_GC", [10 ** 9, executor.FULL_GC_EVERY - 1])
        with executor.job_heap():
            pass
        assert old() is None and executor._FULL_GC[1] == 0 and gc.get_freeze_count() == 0
    finally:
        if was:
            gc.enable()
