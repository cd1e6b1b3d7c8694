"""The sweep executor's faster pieces of Hydra (``harness.run.executor``), each checked against Hydra's own code
on the same input: the ``.hydra/*.yaml`` text (:func:`to_yaml` vs ``OmegaConf.to_yaml``, the writer of Hydra's
``_save_config``), a job run by :func:`run_job` vs Hydra's ``run_job`` (the three files byte for byte, the
``JobReturn``), the defaults tree with the interpolation map built only where it is read, and the launch's
uncopied hand-over of a memoised job config."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.run.config import PROJECT_ROOT

# hand-built edge cases of block YAML: empty nodes at both levels, strings PyYAML quotes, folds or writes on
# several lines, keys written quoted, non-string keys, lists of mappings at each level, a long key
EDGE = {
    "empty": {}, "empty_list": [], "none": None, "t": True, "i": 3, "f": 0.1, "big": 1e300, "neg": -2,
    "s": {"plain": "abc", "looks_int": "12", "looks_bool": "yes", "looks_float": "1e-3", "null_word": "null",
          "colon": "a: b", "hash": "a #b", "lead_space": " x", "trail_space": "x ", "quote": "it's \"q\"",
          "multi": "line one\nline two\n", "long": "word " * 60, "long_multi": ("x" * 90 + "\n") * 3,
          "unicode": "naïve → ok", "tab": "a\tb", "empty": "", "star": "*x", "amp": "&y", "dash": "- z",
          "interp": "${a.b}", "braces": "{a: 1}"},
    "nested": {"a": {"b": {"c": [1, {"d": None}, []]}, "e": {}}, "lst": [{"k": "v", "w": [{}]}, "s", 2.5]},
    "12": {"x": 1}, "true": {"y": 2}, "k" * 140: {"z": 3}, "multi\nkey": {"m": 1}, "": {"blank": 1},
    "top_list": [{"a": 1, "b": {"c": 2}}, [1, [2]]],
}


def _composed(overrides: list) -> object:
    from tests.conftest import hydra_compose
    return hydra_compose(overrides, return_hydra_config=True)


@pytest.mark.parametrize("overrides", [
    [], ["scheduler=wait", "workload.rate_per_s=0.02"], ["+experiment=conserve_rate_sweep"],
    ["scheduler=ampd", "cluster=a40_1p3d_hetero", "scheduler.predictor.sigma=1"]])
def test_to_yaml_writes_the_bytes_omegaconf_writes_for_composed_configs(overrides):
    """A job's composed config with its ``hydra`` node (hydra.yaml's content: the help texts, the logging
    configs), without it (config.yaml's) and its overrides list (overrides.yaml's): :func:`to_yaml` gives the text
    of ``OmegaConf.to_yaml`` (Hydra's writer) to the byte, twice (the second from the memo)."""
    from omegaconf import open_dict

    from harness.run.executor import to_yaml
    cfg = _composed(overrides)
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    hydra_only = OmegaConf.masked_copy(cfg, "hydra")
    with open_dict(cfg):
        cfg.hydra.overrides.task = list(overrides)
    for c in (task, hydra_only, cfg.hydra.overrides.task):
        want = OmegaConf.to_yaml(c)
        assert to_yaml(c) == want and to_yaml(c) == want


def test_to_yaml_writes_the_bytes_omegaconf_writes_for_edge_cases():
    """Hand-built edge cases (:data:`EDGE`: empty nodes, quoted, folded and multi-line strings, quoted and long
    keys, lists of mappings) as one config and each entry alone, and non-mapping roots: the same text as
    ``OmegaConf.to_yaml``; a value changed under the same key is written anew (the memo is keyed by the value)."""
    from harness.run.executor import to_yaml
    cfg = OmegaConf.create(EDGE)
    assert to_yaml(cfg) == OmegaConf.to_yaml(cfg)
    for k in EDGE:
        one = OmegaConf.create({k: EDGE[k]})
        assert to_yaml(one) == OmegaConf.to_yaml(one), k
    for root in ({}, [], [1, {"a": "b"}], {"a": {}}):
        c = OmegaConf.create(root)
        assert to_yaml(c) == OmegaConf.to_yaml(c)
    a, b = OmegaConf.create({"h": {"p": 1, "q": "1"}}), OmegaConf.create({"h": {"p": "1", "q": 1}})
    assert (to_yaml(a), to_yaml(b)) == ("h:\n  p: 1\n  q: '1'\n", "h:\n  p: '1'\n  q: 1\n")


def test_run_job_writes_hydras_files_and_returns_hydras_job_return(tmp_path):
    """A job of the project's config run by :func:`run_job` and by Hydra's ``run_job`` into the same directory:
    the three ``.hydra/*.yaml`` files byte for byte, the task function's config, the ``JobReturn``'s configs
    (values, flags) and overrides equal; and the installed Hydra is the code :func:`run_job` runs (its digest)."""
    import hydra.core.utils as hu
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from harness.run.executor import HYDRA_RUN_JOB_SHA256, _known_source, fresh_copy, run_job
    assert _known_source({"run_job": hu.run_job, "_save_config": hu._save_config}, HYDRA_RUN_JOB_SHA256)
    out = tmp_path / "job"
    overrides = ["scheduler=wait", "workload.seed=3", f"hydra.run.dir={out}"]
    cfg = _composed(overrides)
    from omegaconf import open_dict
    with open_dict(cfg):
        cfg.hydra.overrides.task = overrides[:2]
    seen = []

    def task(c):
        seen.append((OmegaConf.to_yaml(c), OmegaConf.is_struct(c)))
        return "done"
    got = {}
    for name, fn in (("hydra", hu.run_job), ("this", run_job)):
        ret = fn(hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader()
                                            if GlobalHydra.instance().is_initialized() else None,
                                            callbacks=Callbacks()),
                 task_function=task, config=fresh_copy(cfg), job_dir_key="hydra.run.dir", job_subdir_key=None,
                 configure_logging=False)
        files = {f: (out / ".hydra" / f).read_bytes() for f in ("config.yaml", "hydra.yaml", "overrides.yaml")}
        got[name] = (files, OmegaConf.to_yaml(ret.cfg), OmegaConf.to_yaml(ret.hydra_cfg), ret.overrides,
                     ret.return_value, ret.status, OmegaConf.is_readonly(ret.hydra_cfg.hydra), ret.working_dir)
    assert got["this"] == got["hydra"]
    assert seen[0] == seen[1] and b"seed: 3" in got["this"][0]["config.yaml"]
    assert got["this"][0]["overrides.yaml"] == b"- scheduler=wait\n- workload.seed=3\n"


def _tree(tmp_path) -> object:
    """A config tree with an interpolated default (``db: ${server}_db``: the db config named after the server
    chosen) beside plain ones."""
    conf = tmp_path / "conf"
    for d in ("server", "db", "opt"):
        (conf / d).mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - server: apache\n  - db: ${server}_db\n  - opt: x\n"
                                      "  - _self_\ntop: 1\n")
    (conf / "server" / "apache.yaml").write_text("name: apache\n")
    (conf / "server" / "nginx.yaml").write_text("name: nginx\n")
    (conf / "db" / "apache_db.yaml").write_text("engine: pg\n")
    (conf / "db" / "nginx_db.yaml").write_text("engine: mysql\n")
    (conf / "opt" / "x.yaml").write_text("defaults:\n  - /server@other: nginx\nflag: true\n")
    return conf


def test_the_interpolation_map_is_built_only_where_an_interpolated_default_reads_it(tmp_path, monkeypatch):
    """``interpolation_map_when_used``: on a tree with an interpolated default, Hydra's compose with it equals
    Hydra's compose without it (the interpolated choice follows the server chosen), Hydra's map is built only
    for the node whose defaults list has the interpolation (the primary config's; not for ``opt/x``'s or
    Hydra's own nodes), and the module's function is Hydra's again after it (the installed Hydra's code is the
    one it was written from; here it stands in for a counter of Hydra's map)."""
    import hydra._internal.defaults_list as dl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.run import executor
    from harness.run.executor import HYDRA_DEFAULTS_SHA256, _known_source, interpolation_map_when_used
    original = dl._create_interpolation_map
    assert _known_source({"_create_interpolation_map": original,
                          "_create_defaults_tree_impl": dl._create_defaults_tree_impl}, HYDRA_DEFAULTS_SHA256)
    conf = _tree(tmp_path)
    monkeypatch.setattr(executor, "_known_source", lambda code, want: True)   # (it stands in for the counter)
    built: list = []

    def counted(overrides, defaults_list, self_added):
        built.append([str(d) for d in defaults_list])
        return original(overrides, defaults_list, self_added)
    monkeypatch.setattr(dl, "_create_interpolation_map", counted)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            for ov in ([], ["server=nginx"], ["server=nginx", "top=2"]):
                built.clear()
                want = OmegaConf.to_yaml(compose(config_name="config", overrides=ov, return_hydra_config=True))
                n_hydra = len(built)
                built.clear()
                with interpolation_map_when_used():
                    assert dl._create_interpolation_map is not counted
                    got = OmegaConf.to_yaml(compose(config_name="config", overrides=ov, return_hydra_config=True))
                assert dl._create_interpolation_map is counted
                assert got == want
                assert n_hydra > 3 and len(built) == 1 and any("${server}_db" in d for d in built[0])
            cfg = compose(config_name="config", overrides=["server=nginx"])
            assert (cfg.db.engine, cfg.server.name, cfg.opt.other.name) == ("mysql", "nginx", "nginx")
    finally:
        GlobalHydra.instance().clear()


def test_the_launch_takes_a_memoised_job_config_out_of_the_memo():
    """``ComposedConfigs.take_sweep_config``: the memo keeps a job's composed config pickled (bytes, not config
    objects: nothing for the cyclic collector to walk, ~60 kB a job), the launch gets a copy equal to it (the
    validation's and the sweeper's loads got copies too: three distinct objects, one compose) and the job leaves
    the memo; a second launch of the same overrides, or a job never composed, composes anew. A config that
    cannot be pickled is kept as it is and handed to the launch itself (no copy)."""
    import threading

    from harness.run.executor import ComposedConfigs

    class Loader:
        calls: list = []

        def load_sweep_config(self, master, overrides):
            self.calls.append(list(overrides))
            return OmegaConf.create({"overrides": list(overrides), "job": {"num": 0}})

    memo = ComposedConfigs(Loader())
    master = OmegaConf.create({})
    copies = [memo.load_sweep_config(master, ["a=1"]) for _ in range(2)]
    copies[0].job.num = 7    # (a caller's change reaches neither the memo nor the other copies)
    entry = memo._memo[(id(master), ("a=1",))]
    assert isinstance(entry[1][0], bytes) and entry[2] is True
    taken = memo.take_sweep_config(master, ["a=1"])
    assert taken == {"overrides": ["a=1"], "job": {"num": 0}} and copies[1] == taken
    assert taken is not copies[0] and taken is not copies[1] and Loader.calls == [["a=1"]]
    assert (id(master), ("a=1",)) not in memo._memo
    again = memo.take_sweep_config(master, ["a=1"])
    assert again is not taken and list(again.overrides) == ["a=1"] and Loader.calls == [["a=1"], ["a=1"]]
    other = memo.take_sweep_config(master, ["b=2"])
    assert list(other.overrides) == ["b=2"] and len(Loader.calls) == 3 and not memo._memo

    class Unpicklable(Loader):
        def load_sweep_config(self, master, overrides):
            cfg = OmegaConf.create({"overrides": list(overrides)}, flags={"allow_objects": True})
            cfg.lock = threading.Lock()   # (pickle refuses a lock)
            return cfg

    memo = ComposedConfigs(Unpicklable())
    copy = memo.load_sweep_config(master, ["c=3"])
    stored = memo._memo[(id(master), ("c=3",))][1]
    taken = memo.take_sweep_config(master, ["c=3"])
    assert taken is stored and copy is not taken and list(copy.overrides) == ["c=3"]
