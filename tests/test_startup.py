"""The fixed cost of one ``python run.py`` process before its run starts (issue 54): Hydra composes the primary
config twice before a run (``Hydra.get_mode`` in ``MULTIRUN`` mode, then ``Hydra.run`` in ``RUN`` mode with
``hydra.mode=RUN`` added); ``harness.run.executor.ComposeCache`` merges it once, and a compose Hydra refuses is
refused by Hydra's own code with its config files from the cache. Each check compares with Hydra's own
``ConfigLoaderImpl._load_configuration_impl`` (no cache), never with the cache's own output."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.config import PROJECT_ROOT


def _shown(cfg):
    """What a composed config is: its YAML, its containers, its flags and its nodes' types."""
    from omegaconf import OmegaConf
    return (OmegaConf.to_yaml(cfg), OmegaConf.to_container(cfg), OmegaConf.is_struct(cfg),
            OmegaConf.is_readonly(cfg.hydra), {k: str(OmegaConf.get_type(cfg, k)) for k in cfg})


def _outcome(fn, overrides, mode):
    try:
        return _shown(fn(config_name="config", overrides=list(overrides), run_mode=mode))
    except Exception as e:      # noqa: BLE001 -- compared, never swallowed
        return (type(e).__name__, str(e))


def test_the_run_composes_once_where_hydra_composes_twice_with_the_same_overrides():
    """The command line's two composes (``get_mode``: ``MULTIRUN``, validation of sweep overrides off; the run:
    ``RUN`` with ``hydra.mode=RUN``) on the project's configs: the second is a memo hit (no defaults tree, no
    merge) and both equal Hydra's own compose of the same arguments; a typo (an unknown key) is refused in both
    with Hydra's own exception and message, and the second refusal merges nothing again."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from harness.run.config import register_configs
    from harness.run.executor import cache_compositions

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()

            def hydras(**k):
                return ConfigLoaderImpl._load_configuration_impl(loader, **k)
            cache = cache_compositions(loader)
            for args in (["workload.num_conversations=5"], ["scheduler=wait", "workload.rate_per_s=0.1"]):
                before = (cache.misses, cache.hits, cache.prefix_hits)
                first = cache(config_name="config", overrides=list(args), run_mode=RunMode.MULTIRUN,
                              validate_sweep_overrides=False)
                assert _shown(first) == _shown(hydras(config_name="config", overrides=list(args),
                                                      run_mode=RunMode.MULTIRUN, validate_sweep_overrides=False))
                assert first.hydra.mode is None     # so Hydra's run adds hydra.mode=RUN
                run = args + ["hydra.mode=RUN"]
                assert _outcome(cache, run, RunMode.RUN) == _outcome(hydras, run, RunMode.RUN)
                assert (cache.misses, cache.hits) == (before[0] + 1, before[1] + 1), args
                assert cache.prefix_hits == before[2]   # the second merged nothing
            typo = ["workload.rate=-1"]
            want = _outcome(hydras, typo, RunMode.RUN)
            assert want[0] == "ConfigCompositionException" and "Could not override 'workload.rate'" in want[1]
            fallbacks = cache.fallbacks
            assert _outcome(cache, typo, RunMode.MULTIRUN) == _outcome(hydras, typo, RunMode.MULTIRUN)
            assert _outcome(cache, typo + ["hydra.mode=RUN"], RunMode.RUN) == \
                _outcome(hydras, typo + ["hydra.mode=RUN"], RunMode.RUN)
            assert cache.fallbacks == fallbacks + 2     # each refused by Hydra's own compose
    finally:
        GlobalHydra.instance().clear()


def test_a_missing_default_keeps_the_two_run_modes_apart(tmp_path):
    """A config whose defaults list has a mandatory group (``sched: ???``): ``MULTIRUN`` skips it (Hydra's
    ``skip_missing``), ``RUN`` refuses it ("You must specify 'sched'"); the memo never hands one mode's config
    to the other there, and each equals Hydra's own. Without the missing default the two modes share one merge,
    and the config equals Hydra's in both."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from harness.run.executor import _mode_free, _modes_alike, cache_compositions

    assert _modes_alike()   # (hydra-core 1.3.8: the code the sharing was written from)
    conf = tmp_path / "conf"
    (conf / "sched").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - sched: ???\n  - _self_\ntop: 1\n")
    (conf / "plain.yaml").write_text("defaults:\n  - sched: a\n  - _self_\ntop: 2\n")
    (conf / "sched" / "a.yaml").write_text("name: a\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()

            def hydras(**k):
                return ConfigLoaderImpl._load_configuration_impl(loader, **k)
            cache = cache_compositions(loader)
            for mode in (RunMode.MULTIRUN, RunMode.RUN, RunMode.MULTIRUN):
                got, want = _outcome(cache, ["top=3"], mode), _outcome(hydras, ["top=3"], mode)
                assert got == want, mode
            assert "You must specify 'sched'" in _outcome(cache, ["top=3"], RunMode.RUN)[1]
            assert "sched" not in _outcome(cache, ["top=3"], RunMode.MULTIRUN)[1]   # skipped: no sched node
            assert cache.hits == 2 and cache.misses == 1    # MULTIRUN's later composes only

            def plain(mode):
                return _shown(cache(config_name="plain", overrides=["top=4"], run_mode=mode))

            def plain_hydras(mode):
                return _shown(hydras(config_name="plain", overrides=["top=4"], run_mode=mode))
            assert plain(RunMode.MULTIRUN) == plain_hydras(RunMode.MULTIRUN)
            assert plain(RunMode.RUN) == plain_hydras(RunMode.RUN)
            assert cache.misses == 2 and cache.hits == 3    # the RUN compose of plain: from MULTIRUN's merge
    finally:
        GlobalHydra.instance().clear()
    # the predicate itself on hand-built trees (Hydra's node classes)
    from hydra.core.default_element import ConfigDefault, DefaultsTreeNode, GroupDefault, VirtualRoot
    ok = DefaultsTreeNode(node=VirtualRoot(), children=[ConfigDefault(path="config"), GroupDefault(group="g", value="a")])
    assert _mode_free(ok)
    bad = DefaultsTreeNode(node=VirtualRoot(), children=[DefaultsTreeNode(
        node=ConfigDefault(path="config"), children=[GroupDefault(group="g", value="???")])])
    assert not _mode_free(bad)


@pytest.mark.parametrize("argv", [["workload.rate=-1"], ["scheduler=nope"]])
def test_a_refused_command_line_says_what_hydras_own_compose_says(argv, monkeypatch, capsys):
    """``python run.py`` with a typo or an unknown option, in this process: exit status 2 and the same stderr as
    with Hydra's own composes (``cache_compositions`` turned off: no memo, no file cache)."""
    import sys

    import harness.run.cli as cli
    import harness.run.executor as executor

    def run():
        monkeypatch.setattr(sys, "argv", ["run.py", *argv])
        with pytest.raises(SystemExit) as e:
            cli.main()
        return e.value.code, capsys.readouterr().err
    ours = run()
    monkeypatch.setattr(executor, "cache_compositions", lambda loader: None)
    hydras = run()
    assert ours == hydras and ours[0] == 2
    assert ("rate" if argv[0].startswith("workload") else "nope") in ours[1]


def test_a_lazy_module_imports_on_first_use_and_then_leaves_its_place_to_the_module():
    """``harness.LazyModule`` with a namespace and key: nothing imported until an attribute is read; the first read
    returns the module's attribute and puts the module itself under the key (so later reads are the module's own);
    without a namespace it stays a proxy; a namespace without a key (or the reverse) is refused."""
    import sys
    import types

    from harness import LazyModule

    name = "harness_test_lazy_target"
    made = types.ModuleType(name)
    made.VALUE = 42
    ns: dict = {}
    ns["m"] = lazy = LazyModule(name, ns, "m")
    sys.modules.pop(name, None)
    try:
        with pytest.raises(ModuleNotFoundError):    # (not importable yet: proves nothing was imported at creation)
            lazy.VALUE
        assert ns["m"] is lazy
        sys.modules[name] = made
        assert lazy.VALUE == 42 and ns["m"] is made
        plain = LazyModule(name)
        assert plain.VALUE == 42 and isinstance(plain, LazyModule)
    finally:
        sys.modules.pop(name, None)
    with pytest.raises(TypeError, match="both"):
        LazyModule(name, {})
    with pytest.raises(TypeError, match="both"):
        LazyModule(name, key="m")


def test_help_and_a_config_typo_import_neither_numpy_nor_pandas_nor_the_simulator(tmp_path):
    """``run.py --help`` then ``run.py workload.bogus=1`` in one fresh interpreter (status 0, then 2): afterwards
    neither numpy, pandas, pyarrow nor the simulator's engine (``harness.sim.engine``, ``harness.sim.backend``) is
    in ``sys.modules``; the scheduler registry is (the help lists its names), and a module that binds numpy lazily
    still holds its ``LazyModule``. Then the harness's own config error (``workload.rate_per_s=-1``, refused by
    ``resolve`` inside the job, after the Hydra files were written): status 2, and still no pandas or pyarrow (the
    early files are written by ``harness.core.atomic``; through ``harness.core.recorder`` they imported both)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "import harness.run.cli as cli\n"
        "codes, modules = [], []\n"
        "for argv in (['--help'], ['workload.bogus=1'], ['workload.rate_per_s=-1', 'hydra.run.dir=' + sys.argv[1]]):\n"
        "    sys.argv = ['run.py', *argv]\n"
        "    try:\n"
        "        cli.main()\n"
        "    except SystemExit as e:\n"
        "        codes.append(e.code)\n"
        "    modules.append(sorted(sys.modules))\n"
        "    if len(codes) == 2:\n"
        "        import harness.core.policy as p\n"
        "        np = type(p.np).__name__\n"
        "print(json.dumps({'codes': codes, 'modules': modules[1], 'after': modules[2], 'np': np}))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], cwd=PROJECT_ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 2, 2], r.stderr[-2000:]
    assert "workload.rate_per_s" in r.stderr and not (tmp_path / "run").exists()
    assert "scheduler: " in r.stdout and "conserve" in r.stdout     # the help's list of config groups
    modules = set(got["modules"])
    assert {"hydra", "harness.core.schedulers", "baselines.wait.fluid_admission"} <= modules
    assert not {"numpy", "pandas", "pyarrow", "scipy", "harness.sim.engine", "harness.sim.backend"} & modules
    assert got["np"] == "LazyModule"
    assert not {"pandas", "pyarrow", "harness.core.recorder"} & set(got["after"])


def test_hydras_sweeper_validation_composes_into_the_memo_without_a_copy(monkeypatch):
    """``harness.run.executor.install`` puts ``validate_batch_is_legal`` on Hydra's ``Sweeper``: a sweeper whose
    context's loader is the memo (``ComposedConfigs``) composes each job of the batch once and copies nothing
    (``fresh_copy`` never called); the launch then takes that very config (no compose again); a job already
    composed by the harness's validation is not composed again; a loader's refusal is raised as it is; a sweeper
    with Hydra's own loader runs Hydra's code (one ``load_sweep_config`` per job)."""
    from hydra.plugins.sweeper import Sweeper
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    import harness.run.executor as executor

    class Loader:
        def __init__(self):
            self.calls = []

        def load_sweep_config(self, master_config, sweep_overrides):
            self.calls.append(list(sweep_overrides))
            if "bad=1" in sweep_overrides:
                raise ValueError("refused: bad")
            return OmegaConf.create({"overrides": list(sweep_overrides), "master": master_config.tag})

    class Sweeping(Sweeper):    # Hydra's Sweeper interface; validate_batch_is_legal is the base class's
        def setup(self, *, hydra_context, task_function, config):
            self.hydra_context, self.config = hydra_context, config

        def sweep(self, arguments):
            raise NotImplementedError

    copies = []
    real_copy = executor.fresh_copy
    monkeypatch.setattr(executor, "fresh_copy", lambda cfg: copies.append(1) or real_copy(cfg))
    loader = Loader()
    ctx = HydraContext(config_loader=loader, callbacks=None)
    memo = executor.install(ctx)
    assert Sweeper.validate_batch_is_legal is executor.validate_batch_is_legal and ctx.config_loader is memo
    master = OmegaConf.create({"tag": "a"})
    memo.load_sweep_config(master, ["x=0"])             # the harness's validation: composed, a copy handed out
    copies.clear()
    s = Sweeping()
    s.setup(hydra_context=ctx, task_function=None, config=master)
    s.validate_batch_is_legal([["x=0"], ["x=1"], ["x=2"]])
    assert loader.calls == [["x=0"], ["x=1"], ["x=2"]] and copies == []
    taken = memo.take_sweep_config(master, ["x=1"])
    assert list(taken.overrides) == ["x=1"] and loader.calls[-1] == ["x=2"] and copies == []
    with pytest.raises(ValueError, match="refused: bad"):
        s.validate_batch_is_legal([["bad=1"]])
    memo.clear()
    plain = Loader()    # Hydra's own code for another loader: its load_sweep_config per job
    s.setup(hydra_context=HydraContext(config_loader=plain, callbacks=None), task_function=None, config=master)
    s.validate_batch_is_legal([["y=0"], ["y=1"]])
    assert plain.calls == [["y=0"], ["y=1"]]


def test_a_plugin_config_built_on_the_memoised_schema_equals_one_built_on_a_fresh_schema():
    """``harness.run.config._plugin_config`` merges onto one ``OmegaConf.structured(cls)`` per class
    (``_schema``): each scheduler's and backend's config object equals the one a fresh ``OmegaConf.structured``
    gives, with and without overrides; a merge with overrides leaves the next config at the class's defaults;
    two objects share no mutable value; a bad value is refused with the key named, as before."""
    import dataclasses

    from omegaconf import OmegaConf

    from harness.core.backend import backends
    from harness.core.schedulers import get_spec, registered
    from harness.run.config import ConfigError, _plugin_config

    classes = [get_spec(n).config_cls for n in registered()] + [s.config_cls for s in backends().values()]
    from omegaconf.errors import MissingMandatoryValue
    for cls in classes:   # (a plug-in a test registered may have a field without a default: refused both ways)
        try:
            fresh = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), {}))
        except MissingMandatoryValue as e:
            with pytest.raises(ConfigError, match=f"x.{e.full_key}"):
                _plugin_config(cls, {}, "x.")
            continue
        assert _plugin_config(cls, {}, "x.") == fresh == _plugin_config(cls, {}, "x.")
    wait = get_spec("wait").config_cls
    a = _plugin_config(wait, {"name": "wait", "output_bins": [8, 16]}, "scheduler.")
    assert list(a.output_bins) == [8, 16]
    b = _plugin_config(wait, {"name": "wait"}, "scheduler.")
    assert list(b.output_bins) == [64, 256, 1024]   # WaitConfig's default (baselines/wait/wait.py)
    b.output_bins.append(4096)
    assert list(_plugin_config(wait, {"name": "wait"}, "scheduler.").output_bins) == [64, 256, 1024]
    assert all(not isinstance(getattr(b, f.name), (list, dict)) or getattr(b, f.name) is not
               getattr(_plugin_config(wait, {}, "s."), f.name) for f in dataclasses.fields(b))
    with pytest.raises(ConfigError, match="scheduler.output_bins"):
        _plugin_config(wait, {"output_bins": "many"}, "scheduler.")


def test_help_lists_the_config_groups_only_where_its_template_asks_and_prints_hydras_text(monkeypatch, capsys):
    """``run.py --help`` and ``--hydra-help`` in this process print the same text as with Hydra's own ``get_help``
    (``help_on_demand`` turned off); ``--help``'s template (``hydra.help.template``: ``${harness_config_groups:}``,
    no ``$APP_CONFIG_GROUPS``) makes no Hydra group listing, ``--hydra-help``'s (Hydra's ``hydra_help/default``:
    ``$HYDRA_CONFIG_GROUPS`` only) the one it shows; Hydra's own makes both for each."""
    import sys

    from hydra._internal.hydra import Hydra

    import harness.run.cli as cli
    import harness.run.executor as executor

    listings = []
    own = Hydra.format_config_groups
    monkeypatch.setattr(Hydra, "format_config_groups", lambda self, *a, **k: listings.append(1) or own(self, *a, **k))

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    def text(flag):
        monkeypatch.setattr(sys, "argv", ["run.py", flag])
        try:
            with pytest.raises(SystemExit) as e:
                cli.main()
        finally:   # Hydra's global state as before (a later test reading ${hydra:...} must not see this run's)
            HydraConfig.instance().cfg = None
            GlobalHydra.instance().clear()
        assert e.value.code == 0
        return capsys.readouterr().out
    ours = {flag: text(flag) for flag in ("--help", "--hydra-help")}
    assert len(listings) == 1    # --hydra-help's $HYDRA_CONFIG_GROUPS
    monkeypatch.setattr(executor, "help_on_demand", lambda h: False)
    listings.clear()
    hydras = {flag: text(flag) for flag in ("--help", "--hydra-help")}
    assert len(listings) == 4 and ours == hydras
    assert "scheduler: " in ours["--help"] and "hydra/launcher: " in ours["--hydra-help"]


def test_config_files_read_on_libyaml_are_the_objects_omegaconfs_loader_reads(tmp_path):
    """``harness.run.executor._load_on_libyaml`` (how ``ComposeCache`` reads each config file once per process): every
    YAML file of conf/ and of Hydra's own configs parses, on libyaml, to the objects OmegaConf's own loader makes
    (types and key order included; among them floats such as ``1e-3``, ``.inf``, dates left as strings); YAML edge
    cases by hand too; a duplicate key is refused as OmegaConf refuses it; a malformed file's error is PyYAML's own
    message, word for word (the file is read again without libyaml); OmegaConf's ``get_yaml_loader`` is restored."""
    import io
    import math

    import hydra
    import omegaconf._utils as omegaconf_utils
    import yaml
    from hydra._internal.core_plugins.file_config_source import FileConfigSource

    from harness.run.executor import _libyaml_loader, _load_on_libyaml

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML built without libyaml")
    fast, own = _libyaml_loader(), omegaconf_utils.get_yaml_loader()
    assert fast is not None

    def same(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, float) and math.isnan(a):
            return math.isnan(b)
        return a == b
    files = [*(PROJECT_ROOT / "conf").rglob("*.yaml"), *(Path(hydra.__file__).parent / "conf").rglob("*.yaml")]
    assert len(files) > 500
    for f in files:
        text = f.read_text()
        assert same(yaml.load(io.StringIO(text), Loader=fast), yaml.load(io.StringIO(text), Loader=own)), f
    edge = ("a: 1e3\nb: .inf\nc: 2001-12-14\nd: 1_000\ne: 0x1F\nf: -.5e-3\ng: ~\nh: yes\nj: 1:20\nk: '3'\n"
            "l: !!python/object/apply:pathlib.Path [x, y]\nm: [1, {n: .nan}]\n")
    got = yaml.load(edge, Loader=fast)
    assert same(got, yaml.load(edge, Loader=own))
    assert got["a"] == 1000.0 and got["c"] == "2001-12-14" and got["j"] == 80 and got["l"] == Path("x/y")
    with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key a"):
        yaml.load("a: 1\na: 2\n", Loader=fast)

    source = FileConfigSource(provider="test", path=str(tmp_path))
    (tmp_path / "good.yaml").write_text("x: 1e-3\ny: [a, b]\n")
    assert _load_on_libyaml(source.load_config, "good.yaml").config == {"x": 0.001, "y": ["a", "b"]}
    (tmp_path / "bad.yaml").write_text("a:\n  - b\n c: 1\n")
    errors = []
    for load in (lambda: _load_on_libyaml(source.load_config, "bad.yaml"), lambda: source.load_config("bad.yaml")):
        with pytest.raises(yaml.YAMLError) as e:
            load()
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "expected <block end>" in errors[0]   # PyYAML's wording, not libyaml's
    assert omegaconf_utils.get_yaml_loader is not None and omegaconf_utils.get_yaml_loader() is not fast
