"""The sweep executor: the jobs of a multirun (``python run.py -m``) on worker processes that persist across
jobs, the body of the ``pool`` launcher (``hydra_plugins.harness_launcher.pool_launcher.PoolLauncher``, the
default launcher of ``conf/config.yaml``).

Why: one process per run pays the imports (Hydra, numpy, pandas, pyarrow, the policies), the trace's parse and
the SLO baseline's replays again for every job. A worker here runs job after job in one interpreter, so it
keeps, across jobs, what the process-wide caches hold, each keyed by what determines it:

* the imported modules;
* the parsed traces (``harness.core.trace.load_trace``: memoised by the file's path, size, mtime and content
  digest);
* the SLO baselines (``harness.run.slo_baseline``: an in-process memo keyed by the setup digest -- cluster,
  model, engine, reference scheduler, code digest -- and each conversation's turns; the disk shards under
  ``$HARNESS_CACHE_DIR`` shared by every worker);
* with the ``fork`` start method (the default where the OS has it), everything the parent holds before the
  pool starts: the sweep's validation (``harness.run.callbacks.ValidateSweepCallback``) has composed every job
  (kept pickled: :class:`ComposedConfigs`) and parsed every trace there, so the workers start with them, and
  Hydra's singletons as they are (set again, ``Singleton.set_state``, only in a spawned worker: :func:`_init`).

Around each job the process's heap is frozen and the job's own garbage collected after it (:func:`job_heap`), and
a job's ``JobReturn`` keeps neither of its configs (they are in its ``.hydra/`` files), so a long sweep's process
neither grows nor walks an ever larger heap.

Each job's config is composed in the worker from the sweep's config and the job's overrides
(``ConfigLoader.load_sweep_config``, as Hydra's basic launcher does in its process; Hydra's defaults list and
merge memoised per set of config-group overrides, :class:`ComposeCache`, so a job that differs from an earlier
one only in values -- a rate, a seed -- costs a copy, :func:`fresh_copy`, and the value overrides), then run by
Hydra's ``run_job`` (its run directory, ``.hydra/`` files, ``run.log``, the callbacks' ``on_job_start``/``end``;
:func:`run_job`: Hydra's code with its copies by :func:`fresh_copy` and its ``.hydra/*.yaml`` by :func:`to_yaml`,
the same bytes).
Nothing a run computes depends on which process ran it or on the jobs before it in that process: the caches
above hold only values that are a function of their key (tests/test_executor.py checks a sweep's files
against one process per run, byte for byte but the wall-clock and cost keys of ``summary.json``).

Workers: ``hydra.launcher.n_jobs`` (null: the cores this process may use, ``os.sched_getaffinity``), at most
the number of jobs; with one, the jobs run in this process, one after another (no pool). Stated at the start
of the sweep (one line on stdout). Ctrl-C / SIGTERM: the running jobs write what they measured and end
(status 130, as a single run), the jobs not started are not started, and the sweep exits 130 (re-run the
same command to resume it: complete jobs are skipped).

On a cluster: ``hydra/launcher=pool_slurm`` / ``pool_ray`` (``harness.run.cluster_sweep``) run chunks of jobs
through :func:`_run_job`, one Slurm task / Ray task per chunk, each one process that keeps these caches across
its jobs (Hydra's submitit and Ray launchers, ``slurm`` / ``ray``, run one job per task).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)

START_METHODS = ("fork", "forkserver", "spawn")


def usable_cores() -> int:
    """The CPU cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where the OS has no
    affinity call), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_for(n_jobs: Optional[int], jobs: int) -> int:
    """How many worker processes a sweep of ``jobs`` jobs gets for ``hydra.launcher.n_jobs`` = ``n_jobs``:
    ``None`` (or <= 0, joblib's "-1 = every core") the cores this process may use (:func:`usable_cores`),
    else ``n_jobs``; never more than ``jobs``, never fewer than 1.

    Raises:
        ValueError: ``n_jobs`` is not an integer (naming ``hydra.launcher.n_jobs``).
    """
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int)):
        raise ValueError(f"hydra.launcher.n_jobs must be an integer or null, got {n_jobs!r}")
    n = usable_cores() if n_jobs is None or n_jobs <= 0 else n_jobs
    return max(1, min(n, max(1, jobs)))


def fresh_copy(cfg: Any) -> Any:
    """An independent copy of the OmegaConf config ``cfg`` (a root node: no parent), equal to
    ``copy.deepcopy(cfg)`` -- values, node types, flags, the resolver cache -- made by a pickle round trip
    (:func:`frozen_copy` then :func:`thawed`: OmegaConf's ``__getstate__`` / ``__setstate__``; about half the CPU
    of its ``__deepcopy__``: 5-6 vs 12-16 ms for a job's composed config on a quiet machine, docs/speed.md);
    ``copy.deepcopy`` where a value cannot be pickled."""
    frozen = frozen_copy(cfg)
    if frozen is None:
        import copy
        return copy.deepcopy(cfg)
    return thawed(frozen)


def frozen_copy(cfg: Any) -> Optional[tuple]:
    """``cfg`` pickled, for :func:`thawed` to make copies of in this process: ``(bytes, classes)``, or None
    where a value of it cannot be pickled. Classes are kept by reference, as ``copy.deepcopy`` keeps them: where
    pickle cannot name a class of the config by its module and name (Hydra's plug-in scan ran its module again,
    ``Singleton.set_state``, and the config names the class of the first run), the classes themselves are
    held beside the bytes (pickle's persistent ids, ``classes``; else ``classes`` is None). The bytes hold no
    object the cyclic collector walks: a memo of frozen configs (:class:`ComposedConfigs`) costs the collector
    nothing, and ~60 kB a job's config instead of ~400 kB of objects."""
    import io
    import pickle
    plain_failed = False
    if not _PLAIN_PICKLE_FAILED:
        try:
            return pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL), None
        except Exception:   # noqa: BLE001 -- a class pickle cannot name, or an unpicklable value
            plain_failed = True
    held: list = []

    class Keep(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, type):
                held.append(o)
                return len(held) - 1
            return None

    buf = io.BytesIO()
    try:
        Keep(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(cfg)
    except Exception:   # noqa: BLE001 -- an unpicklable value
        return None
    if plain_failed:   # a class plain pickle could not name: this process's later copies go this way at once
        _PLAIN_PICKLE_FAILED.append(True)
    return buf.getvalue(), held


# non-empty once plain pickle failed in this process where pickling the classes by reference did not
_PLAIN_PICKLE_FAILED: list = []


def thawed(frozen: tuple) -> Any:
    """A new copy of the config :func:`frozen_copy` pickled (each call its own copy)."""
    import pickle
    data, held = frozen
    if held is None:
        return pickle.loads(data)
    import io

    class Give(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return held[pid]

    return Give(io.BytesIO(data)).load()


def copy_as_deepcopy(node: Any) -> Any:
    """``copy.deepcopy(node)`` of an OmegaConf node by a pickle round trip (:func:`fresh_copy`), with
    ``DictConfig.__deepcopy__``'s treatment of parents (omegaconf 2.3): ``node``'s own parent is kept by
    reference, not copied, and each child of the copy has the copy as its parent, whatever the child's parent
    was. Hydra's ``HydraConfig`` holds such a node: a root with one child, ``hydra``, whose parent is the
    whole job config (``HydraConfig.set_config``: ``_set_parent``); pickled as it is, the copy would carry a
    copy of the whole config, and its ``hydra`` node would see it (Hydra's ``run_job`` copies it by
    ``copy.deepcopy``: its ``hydra`` node sees only the copy)."""
    from omegaconf import DictConfig
    d = getattr(node, "__dict__", {})
    if not isinstance(node, DictConfig) or not isinstance(d.get("_content"), dict):
        import copy
        return copy.deepcopy(node)   # (run_job copies DictConfigs only)
    parent = d["_parent"]
    kids = [(v, v.__dict__["_parent"]) for v in d["_content"].values()]
    try:
        d["_parent"] = None
        for v, _ in kids:
            v.__dict__["_parent"] = node
        res = fresh_copy(node)
    finally:
        d["_parent"] = parent
        for v, p in kids:
            v.__dict__["_parent"] = p
    res.__dict__["_parent"] = parent
    return res


def to_yaml(cfg: Any) -> str:
    """``OmegaConf.to_yaml(cfg)`` (Hydra's ``_save_config`` text of ``.hydra/config.yaml``, ``hydra.yaml``,
    ``overrides.yaml``), the same text to the byte, with the YAML of each entry of the root mapping and of each
    entry one level below it kept in a process-wide memo keyed by the entry's key and value (``repr`` of the
    plain container ``OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)`` gives: str, int, float,
    bool, None, lists and dicts of them, each written distinctly): the jobs of a sweep dump the same ``hydra.help``
    text, logging configs and model tables again and again, and PyYAML's pure-Python emitter spends ~25 ms a job
    on them. Block YAML of a mapping is the concatenation of its entries' texts (each entry written alone, as
    ``{key: value}`` or ``{key: {key2: value2}}`` less its first line ``key:``): the emitter ends every entry, and
    the document, with the same line break. Where a key is not written as one plain line ``key:`` (a long or
    multi-line key, PyYAML's ``? key`` form) that entry is dumped whole. ``tests/test_hydra_files.py`` checks the
    text against ``OmegaConf.to_yaml`` on composed configs and on edge cases (empty nodes, multi-line and long
    strings, quoted keys, lists of mappings)."""
    from omegaconf import OmegaConf
    container = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    if not isinstance(container, dict) or not container:
        return _yaml_dump(container)
    if len(_YAML_SEGMENTS) > 4096:   # (a bound on the memo's size: a 480-run sweep adds ~5 entries a job)
        _YAML_SEGMENTS.clear()
    return "".join(_yaml_entry(k, v) for k, v in container.items())


_YAML_SEGMENTS: dict = {}   # to_yaml's memo: (repr of the key path, repr of the value) -> its YAML text


def _yaml_dump(obj: Any) -> str:
    """``OmegaConf.to_yaml``'s call of PyYAML on a plain container (its dumper, flags and key order)."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper
    return yaml.dump(obj, default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=get_omega_conf_dumper())


def _yaml_segment(path: tuple, value: Any) -> str:
    """The YAML of the one-entry document ``{path[0]: value}`` (``{path[0]: {path[1]: value}}`` for a path of two
    keys), memoised by the keys' and the value's ``repr``."""
    key = (tuple(repr(k) for k in path), repr(value))
    text = _YAML_SEGMENTS.get(key)
    if text is None:
        doc = {path[-1]: value}
        for k in reversed(path[:-1]):
            doc = {k: doc}
        text = _YAML_SEGMENTS[key] = _yaml_dump(doc)
    return text


def _yaml_entry(k: Any, v: Any) -> str:
    """The YAML text of the root mapping's entry ``k: v``: a non-empty mapping ``v`` as its head line ``k:`` and
    the text of each of its entries (:func:`_yaml_segment` less its head line), anything else whole."""
    if not isinstance(v, dict) or not v:
        return _yaml_segment((k,), v)
    head = _yaml_segment((k,), {}).rstrip("\n")   # "k: {}": the key as PyYAML writes it, then " {}"
    if "\n" in head or not head.endswith(": {}"):
        return _yaml_segment((k,), v)
    head = head[:-3]
    parts = [head, "\n"]
    for k2, v2 in v.items():
        first, _, rest = _yaml_segment((k, k2), v2).partition("\n")
        if first != head:   # (a key PyYAML writes otherwise here: the entry whole)
            return _yaml_segment((k,), v)
        parts.append(rest)
    return "".join(parts)


def save_config(cfg: Any, filename: str, output_dir: Path) -> None:
    """Hydra's ``hydra.core.utils._save_config`` (``output_dir/filename`` created, UTF-8, the config's YAML) with
    the text of :func:`to_yaml` (the same bytes as ``OmegaConf.to_yaml``)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(str(output_dir / filename), "w", encoding="utf-8") as file:
        file.write(to_yaml(cfg))


# sha256 of inspect.getsource of hydra-core 1.3.8's hydra.core.utils.run_job and _save_config: the code run_job
# runs with two of its names bound otherwise (a Hydra whose code differs runs its own run_job)
HYDRA_RUN_JOB_SHA256 = {"run_job": "398b33286c017043f1461d40578429260e9130f35fb9a30ae94be718c1c14b63",
                        "_save_config": "90a9ee51dd09490bbc75096d14d90e9a437e0e43e8dbe51113f7b652ff14ed2f"}


class _PickleCopy:
    """The ``copy`` module as :func:`run_job` sees it: ``deepcopy`` is :func:`copy_as_deepcopy` (the same copy, by
    a pickle round trip)."""
    deepcopy = staticmethod(copy_as_deepcopy)


def run_job(**kwargs: Any) -> Any:
    """Hydra's ``hydra.core.utils.run_job`` (keyword arguments as Hydra's), its own code run with two names bound
    otherwise: ``copy.deepcopy`` of the job's config and of its Hydra config is :func:`fresh_copy` (the same copy,
    half the CPU) and ``_save_config`` is :func:`save_config` (the same ``.hydra/*.yaml`` bytes through the memo of
    :func:`to_yaml`); used only where the installed Hydra's ``run_job`` and ``_save_config`` are the code they
    were written from (:data:`HYDRA_RUN_JOB_SHA256`), else Hydra's own ``run_job``. The function is made for each
    call from the module's current globals, so nothing of Hydra is changed for other callers."""
    import types

    import hydra.core.utils as hu
    if not _known_source({"run_job": hu.run_job, "_save_config": hu._save_config}, HYDRA_RUN_JOB_SHA256):
        return hu.run_job(**kwargs)
    f = hu.run_job
    fast = types.FunctionType(f.__code__, {**vars(hu), "copy": _PickleCopy, "_save_config": save_config},
                              f.__name__, f.__defaults__, f.__closure__)
    fast.__kwdefaults__ = f.__kwdefaults__
    return fast(**kwargs)


_SOURCE_OK: dict = {}   # (function, wanted digest) -> whether its source has that digest (checked once)


def _known_source(code: dict, want: dict) -> bool:
    """Whether each function of ``code`` (name -> function) has the source digest ``want[name]`` (sha256 of
    ``inspect.getsource``), memoised per function object."""
    import hashlib
    import inspect
    for k, f in code.items():
        ok = _SOURCE_OK.get((f, want[k]))
        if ok is None:
            try:
                ok = hashlib.sha256(inspect.getsource(f).encode()).hexdigest() == want[k]
            except (OSError, TypeError):
                ok = False
            _SOURCE_OK[(f, want[k])] = ok
        if not ok:
            return False
    return True


class ComposedConfigs:
    """Hydra's config loader with a memo of composed job configs: ``load_sweep_config(master, overrides)`` is
    composed once per sweep (key: the sweep's primary config object -- its ``hydra.overrides.hydra``, config
    name and resolver cache are what the composition reads of it -- and the job's overrides) and a deep copy
    of it returned on every call; every other attribute is the wrapped loader's. Hydra composes each job's
    config three times in a sweep (the harness's validation, ``ValidateSweepCallback``; the sweeper's
    ``validate_batch_is_legal``; the launcher, before the job runs): with the memo, once, before the first
    job runs (the config files are read then, as the validation already did). One per loader
    (:func:`composed`), installed on the sweep's ``HydraContext`` by :func:`install` (the pool launcher's
    ``setup``); forked workers inherit it."""

    def __init__(self, loader: Any):
        self._loader = loader
        self._memo: dict = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):    # (unpickling: before _loader is set)
            raise AttributeError(name)
        return getattr(self._loader, name)

    def load_sweep_config(self, master_config: Any, sweep_overrides: Sequence[str]) -> Any:
        """Job ``sweep_overrides``'s config (Hydra's ``ConfigLoader.load_sweep_config``), a fresh copy
        (:func:`thawed`; callers set the job's id and number in it)."""
        return self._copy(self._memoised(master_config, sweep_overrides))

    def check_sweep_config(self, master_config: Any, sweep_overrides: Sequence[str]) -> None:
        """Compose job ``sweep_overrides``'s config into the memo (as :meth:`load_sweep_config`, the same error
        where Hydra refuses it) without handing out a copy: Hydra's sweeper validation
        (:func:`validate_batch_is_legal`) composes each job only to see that it composes, and drops the config."""
        self._memoised(master_config, sweep_overrides)

    def _memoised(self, master_config: Any, sweep_overrides: Sequence[str]) -> tuple:
        """The memo's entry of job ``sweep_overrides``, composed by Hydra's loader on first use (its error where
        Hydra refuses it): ``(master_config, the config pickled by frozen_copy, True)``, or ``(master_config,
        the config, False)`` where it cannot be pickled. Pickled, a sweep's memo is bytes the cyclic collector
        does not walk (480 jobs: ~30 MB, not ~200 MB of config objects; docs/speed.md)."""
        key = (id(master_config), tuple(sweep_overrides))
        hit = self._memo.get(key)
        if hit is None:
            cfg = self._loader.load_sweep_config(master_config, list(sweep_overrides))
            frozen = frozen_copy(cfg)
            hit = self._memo[key] = (master_config, cfg, False) if frozen is None else (master_config, frozen, True)
        return hit

    @staticmethod
    def _copy(hit: tuple) -> Any:
        """A new copy of the config of the memo's entry ``hit`` (:meth:`_memoised`)."""
        return thawed(hit[1]) if hit[2] else fresh_copy(hit[1])

    def take_sweep_config(self, master_config: Any, sweep_overrides: Sequence[str]) -> Any:
        """:meth:`load_sweep_config` for the launch of the job, the memo's last use of it: taken out of the memo
        (the config itself where it was kept unpickled: nothing else holds it), else composed as there. A job
        whose overrides another job of the sweep has too (``seed=0,0``) composes anew."""
        hit = self._memo.pop((id(master_config), tuple(sweep_overrides)), None)
        if hit is not None and hit[0] is master_config:
            return thawed(hit[1]) if hit[2] else hit[1]
        return fresh_copy(self._loader.load_sweep_config(master_config, list(sweep_overrides)))

    def clear(self) -> None:
        """Drop the memo (the sweep is over)."""
        self._memo.clear()


_CONFIGS = object()    # ComposeCache.group_options's default filter: Hydra's ObjectType.CONFIG (imported on use)


_PARSED: dict = {}   # parse_overrides' memo: override string -> Hydra's Override of it


def parse_overrides(overrides: Sequence[str]) -> list:
    """Hydra's ``OverridesParser.create().parse_overrides(overrides)`` (the list of ``Override``, in order; its
    error where it refuses one), each string parsed once per process: Hydra's parser (ANTLR, pure Python) takes
    ~0.2-0.5 ms an override, and every job of a sweep repeats its preset's ~10 overrides in each compose. Hydra
    parses each string alone (its ``parse_overrides`` loops over them, the parser keeping no state between
    them) and reads an ``Override`` without changing it; each call gets its own shallow copies all the same.
    A sweep override (``a=1,2``, ``choice(...)``, ``shuffle(...)``: evaluated when parsed) is not kept."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    if len(_PARSED) > 4096:   # (a bound: a 480-run sweep adds a rate and a seed a job)
        _PARSED.clear()
    todo = [o for o in dict.fromkeys(overrides) if o not in _PARSED]
    if todo:
        made = OverridesParser.create().parse_overrides(overrides=todo)   # (Hydra's error for a bad one)
        fresh = dict(zip(todo, made))
        for o, parsed in fresh.items():
            if not parsed.is_sweep_override():
                _PARSED[o] = parsed
    else:
        fresh = {}
    return [copy.copy(_PARSED.get(o) or fresh[o]) for o in overrides]


class ComposeCache:
    """Hydra's ``ConfigLoaderImpl._load_configuration_impl`` (hydra-core 1.3's, checked by its source digest,
    :data:`HYDRA_IMPL_SHA256`) with its costly middle memoised: the defaults list (``create_defaults_list``)
    and the config it selects, merged (``_compose_config_from_defaults_list``), which depend only on the
    primary config's name, the run mode and the overrides that select configs -- a config-group override
    (``scheduler=wait``, ``+experiment/variant=x``, ``~group``), the rest being the value overrides
    (``workload.rate_per_s=0.1``) Hydra applies to the merged config afterwards (its ``Overrides`` splits
    them by the same test: a value that is a dict, or a key that names no config group); a config composed in
    one run mode serves the other where its defaults tree names no missing (``???``) config (:func:`_mode_free`:
    the mode enters only there), so the two composes Hydra makes before a run (``get_mode``'s, ``MULTIRUN``, and
    the run's) merge once. Every other step is
    Hydra's own, in its order, on a copy of the memoised config (:func:`fresh_copy`): the parse, the
    sweep-override check, the value overrides, the ``hydra.overrides`` / ``runtime`` / ``job`` fields. So a sweep
    of 6 variants x 8 rates x 10 seeds composes its 6 variants' configs once each instead of its 480 jobs'. Each
    config file is read once per process and primary config (:meth:`_load_file`: a compose merges a copy of
    it), a memo hit makes no repository of its own (one per primary config serves its group look-ups and
    its sources), and a miss merges onto the memoised config of the defaults before its first chosen group's
    (:meth:`_merge`: the 6 variants of a rate sweep merge the hardware, model, cluster and workload configs once):
    in this process, a config file edited after its first read is not read again. Not used (Hydra's own path)
    for a command line that moves the search path (``hydra.searchpath``); an error on the memoised path is
    raised again by Hydra's own compose (its config files from this cache), so a bad override fails as Hydra
    fails it. ``tests/test_executor.py``
    checks the configs against Hydra's own compose over many kinds of overrides.

    Attributes:
        hits, misses, fallbacks: composes from the memo, composed and memoised, left to Hydra (counts).
        prefix_hits: misses merged onto a memoised config of their first defaults (:meth:`_merge`; count).
    """

    def __init__(self, loader: Any, impl: Any):
        self.loader, self._impl = loader, impl
        self._memo: dict = {}
        self._probes: dict = {}     # config name -> a caching repository: group look-ups and sources of a memo hit
        self._files: dict = {}      # config name -> {config path: ConfigResult as read}: never handed out
        self._prefixes: dict = {}   # (config name, the first k defaults) -> the config they merge to (_merge)
        self._last_ids: dict = {}   # config name -> the defaults (ids) of its last merge (_merge's fork)
        self._delegates: dict = {}  # config name -> (the loader's repository as copied, its copy): _repo
        self.hits = self.misses = self.fallbacks = self.prefix_hits = 0

    def __call__(self, config_name: Optional[str], overrides: list, run_mode: Any, from_shell: bool = True,
                 validate_sweep_overrides: bool = True) -> Any:
        try:
            cfg = self._compose(config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
        except Exception:   # Hydra's own compose says what is wrong, as it says it without the memo
            cfg = None
        if cfg is _SWEEP or cfg is None:
            # a sweep's primary config, a compose the memo leaves to Hydra, or one that failed on it (a bad override:
            # Hydra's own compose raises its own error): Hydra's compose, its config files from this cache
            # (_parse_and_repo: Hydra's own repository where the command line moves the search path) and the
            # merge of its defaults list memoised (_merge, on this cache's files only)
            self.fallbacks += 1
            self.loader._parse_overrides_and_create_caching_repo = self._parse_and_repo
            self.loader._compose_config_from_defaults_list = functools.partial(self._merge_files, config_name)
            try:
                with interpolation_map_when_used():
                    return self._impl(config_name=config_name, overrides=overrides, run_mode=run_mode,
                                      from_shell=from_shell, validate_sweep_overrides=validate_sweep_overrides)
            finally:
                del self.loader._parse_overrides_and_create_caching_repo
                del self.loader._compose_config_from_defaults_list
        return cfg

    def group_options(self, group_name: str, results_filter: Any = _CONFIGS, config_name: Optional[str] = None,
                      overrides: Optional[list] = None) -> list:
        """Hydra's ``ConfigLoaderImpl.get_group_options`` (its source checked, :data:`HYDRA_REPO_SHA256`) with the
        repository of :meth:`_parse_and_repo`: the options (config names) of config group ``group_name`` of the
        search path ``config_name`` and ``overrides`` set. ``results_filter``: Hydra's ``ObjectType`` (``CONFIG``,
        the default: the configs of the group; ``GROUP``: its sub-groups; None: both). Hydra's own copies the
        loader's repository for each call; ``--help`` lists every group's options twice (121 calls on this
        repository's configs, ~6 CPU s), so here one copy per primary config serves them all."""
        from hydra.core.object_type import ObjectType
        if results_filter is _CONFIGS:
            results_filter = ObjectType.CONFIG
        _, repo = self._parse_and_repo(config_name, [] if overrides is None else overrides)
        return repo.get_group_options(group_name, results_filter)

    def _parse_and_repo(self, config_name: Optional[str], overrides: list) -> tuple:
        """Hydra's ``_parse_overrides_and_create_caching_repo`` with the repository of :meth:`_repo` (the config
        files read once per process), for overrides that leave the search path alone (else Hydra's own)."""
        parsed = parse_overrides(overrides)
        if any(o.get_key_element() == "hydra.searchpath" for o in parsed):
            return type(self.loader)._parse_overrides_and_create_caching_repo(self.loader, config_name, overrides)
        return parsed, self._repo(config_name, parsed)

    def _repo(self, config_name: Optional[str], parsed_overrides: list) -> Any:
        """Hydra's ``_parse_overrides_and_create_caching_repo`` for parsed overrides that leave the search path
        as the primary config sets it (no ``hydra.searchpath`` override): a ``CachingConfigRepository`` whose
        config files come from this cache's copy of each file as first read (:meth:`_load_file`)."""
        import copy
        import functools
        from hydra._internal.config_repository import CachingConfigRepository
        # Hydra's CachingConfigRepository(self.loader.repository) deep-copies the loader's repository (its config
        # sources) for each compose, ~0.1 s of a new variant's ~0.2 s, so that the primary config's
        # hydra.searchpath (_process_config_searchpath: initialize_sources) never changes the loader's own; here one
        # copy per primary config name serves its composes: that config (read once per process) sets the same
        # search path on it each time, and the loader's repository is copied again if it is replaced or its
        # sources are
        src = self.loader.repository
        stamp = (id(src), tuple(id(x) for x in getattr(src, "sources", ())))
        held = self._delegates.get(config_name)
        if held is None or held[0] != stamp:
            held = self._delegates[config_name] = (stamp, copy.deepcopy(src))
        repo = CachingConfigRepository.__new__(CachingConfigRepository)
        repo.delegate, repo.cache = held[1], {}
        repo.load_config = functools.partial(self._load_file, repo, self._files.setdefault(config_name, {}))
        self.loader._process_config_searchpath(config_name, parsed_overrides, repo)
        return repo

    @staticmethod
    def _load_file(repo: Any, files: dict, config_path: str) -> Any:
        """``CachingConfigRepository.load_config`` with the files read once per process (per primary config
        name: the search path is the same): each compose gets its own copy of a file's ``ConfigResult`` (its
        config by :func:`fresh_copy`, its defaults list and header copied), since Hydra's merge moves a loaded
        file's nodes into the config it composes and annotates its defaults list. A file's first read parses its
        YAML on libyaml (:func:`_load_on_libyaml`: the same objects, ~8x less CPU for the parse; a ``python run.py``
        reads ~22 files)."""
        import copy
        key = f"config_path={config_path}"
        if key not in repo.cache:
            if key not in files:
                files[key] = _load_on_libyaml(repo.delegate.load_config, config_path)
            ret = files[key]
            if ret is not None:
                ret = copy.copy(ret)
                ret.config = fresh_copy(ret.config)
                ret.header = dict(ret.header)
                ret.defaults_list = copy.deepcopy(ret.defaults_list)
            repo.cache[key] = ret
        return repo.cache[key]

    def _merge_files(self, config_name: Optional[str], defaults: list, repo: Any) -> Any:
        """Hydra's ``_compose_config_from_defaults_list(defaults, repo)`` as :meth:`_merge` (the whole list's merge
        memoised) where ``repo`` is this cache's (:meth:`_repo`: the files its memo is keyed by), else Hydra's own."""
        load = getattr(repo, "load_config", None)
        args = getattr(load, "args", ())
        if getattr(load, "func", None) is ComposeCache._load_file and len(args) == 2 and args[0] is repo \
                and args[1] is self._files.get(config_name):
            return self._merge(config_name, defaults, repo, set(), counted=False)
        return type(self.loader)._compose_config_from_defaults_list(self.loader, defaults, repo)

    def _merge(self, config_name: Optional[str], defaults: list, repo: Any, groups: set, counted: bool = True) -> Any:
        """Hydra 1.3's ``_compose_config_from_defaults_list`` (each default's config merged in order, then the
        defaults lists stripped) with the config merged from the defaults before the first one of a config
        group the command line chose (``groups``: ``scheduler`` for ``scheduler=wait``) memoised, keyed by those
        defaults (each one's config path, parent, package and flags; each file is read once per process, so they
        determine it): variants that differ in a group late in the defaults list (``scheduler=a,b,c``) merge the
        model, cluster, hardware and workload configs once. The memoised config is copied
        (:func:`fresh_copy`) before the rest is merged into it. ``counted``: a memo hit counts in
        ``prefix_hits`` (False for a fallback's merge, :meth:`_merge_files`). The merge starts from the longest
        memoised prefix of the defaults before the first chosen one, and the config merged up to where this
        defaults list first differs from the last one merged for the same primary config (the fork: a preset that
        sets the model, a cluster option) is memoised too, so Hydra's own defaults and the hardware profiles (the
        first ~22 of ~30 defaults, ~0.17 of a new compose's ~0.39 CPU s; measured 2026-12-06) are merged once per
        process, not once per set of config-group choices."""
        from hydra.errors import ConfigCompositionException
        from omegaconf import DictConfig, OmegaConf, flag_override
        from omegaconf.errors import OmegaConfBaseException
        ids = [(d.config_path, d.parent, d.package, d.is_self, d.primary) for d in defaults]
        split = next((i for i, d in enumerate(defaults) if d.config_path and "/" in d.config_path
                      and d.config_path.rsplit("/", 1)[0] in groups), len(defaults))   # (none chosen: them all)
        start, memo = 0, None
        for k in range(split, 0, -1):     # the longest memoised prefix
            memo = self._prefixes.get((config_name, tuple(ids[:k])))
            if memo is not None:
                start = k
                break
        last = self._last_ids.get(config_name, ())
        fork = next((i for i, (a, b) in enumerate(zip(ids, last)) if a != b), min(len(ids), len(last)))
        self._last_ids[config_name] = ids
        keep = {k for k in (fork, split) if start < k <= split}     # the prefixes this merge memoises
        cfg = fresh_copy(memo) if memo is not None else OmegaConf.create()
        self.prefix_hits += counted and memo is not None
        with flag_override(cfg, "no_deepcopy_set_nodes", True):
            for i in range(start, len(defaults)):
                if i in keep:     # (the copy without this merge's flag)
                    with flag_override(cfg, "no_deepcopy_set_nodes", None):
                        self._prefixes[(config_name, tuple(ids[:i]))] = fresh_copy(cfg)
                loaded = self.loader._load_single_config(default=defaults[i], repo=repo)
                try:
                    cfg.merge_with(loaded.config)
                except OmegaConfBaseException as e:
                    raise ConfigCompositionException(
                        f"In '{defaults[i].config_path}': {type(e).__name__} raised while composing config:\n{e}"
                    ).with_traceback(sys.exc_info()[2])
            if len(defaults) in keep:
                with flag_override(cfg, "no_deepcopy_set_nodes", None):
                    self._prefixes[(config_name, tuple(ids))] = fresh_copy(cfg)

        def strip_defaults(cfg: Any) -> None:   # Hydra's: the defaults lists left in any node removed
            if isinstance(cfg, DictConfig):
                if cfg._is_missing() or cfg._is_none():
                    return
                with flag_override(cfg, ["readonly", "struct"], False):
                    if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
                        cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
                        cfg.pop("defaults", None)
                for _key, value in cfg.items_ex(resolve=False):
                    strip_defaults(value)
        strip_defaults(cfg)
        return cfg

    def _compose(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides) -> Any:
        """Hydra 1.3's ``_load_configuration_impl`` with the memo (None: left to Hydra)."""
        from hydra import __version__, version
        from hydra._internal.config_loader_impl import ConfigSourceInfo, get_overrides_dirname
        from hydra._internal.defaults_list import create_defaults_list
        from hydra.core.utils import JobRuntime
        from hydra.types import RunMode
        from omegaconf import OmegaConf, open_dict
        loader = self.loader
        loader.ensure_main_config_source_available()
        parsed_overrides = parse_overrides(overrides)
        if any(o.get_key_element() == "hydra.searchpath" for o in parsed_overrides):
            return None
        if any(o.is_sweep_override() for o in parsed_overrides):
            return _SWEEP
        probe = self._probes.get(config_name)
        if probe is None:   # (the primary config's own hydra.searchpath: the same for every compose of it)
            probe = self._probes[config_name] = self._repo(config_name, [])
        if validate_sweep_overrides:
            loader.validate_sweep_overrides_legal(overrides=parsed_overrides, run_mode=run_mode, from_shell=from_shell)
        # the value overrides, in order: hydra._internal.defaults_list.Overrides's test
        config_overrides = [o for o in parsed_overrides
                            if isinstance(o.value(), dict) or not probe.group_exists(o.key_or_group)]
        chosen = {id(o) for o in config_overrides}
        key = (config_name, tuple(o.input_line for o in parsed_overrides if id(o) not in chosen))
        hit = self._memo.get(key)
        if hit is not None and hit[0] != run_mode and not (hit[1] and _modes_alike()):
            hit = None      # (composed in the other run mode, where a '???' default made the mode matter)
        caching_repo = probe
        if hit is None:
            caching_repo = self._repo(config_name, parsed_overrides)
            with interpolation_map_when_used():
                defaults_list = create_defaults_list(repo=caching_repo, config_name=config_name,
                                                     overrides_list=parsed_overrides, prepend_hydra=True,
                                                     skip_missing=run_mode == RunMode.MULTIRUN)
            if [id(o) for o in defaults_list.config_overrides] != [id(o) for o in config_overrides]:
                return None     # (Hydra split them otherwise: not memoised)
            groups = {o.key_or_group.lstrip("+~") for o in parsed_overrides if id(o) not in chosen}
            cfg = self._merge(config_name, defaults_list.defaults, caching_repo, groups)
            # (kept pickled, frozen_copy: a hit's copy is one unpickling, not a pickle round trip)
            frozen = frozen_copy(cfg)
            self._memo[key] = (run_mode, _mode_free(defaults_list.defaults_tree),
                               dict(defaults_list.overrides.known_choices),
                               fresh_copy(cfg) if frozen is None else frozen, frozen is not None)
            known_choices = defaults_list.overrides.known_choices
            self.misses += 1
        else:
            known_choices, cfg = hit[2], thawed(hit[3]) if hit[4] else fresh_copy(hit[3])
            self.hits += 1
        # from here on, Hydra's _load_configuration_impl as it is
        OmegaConf.set_struct(cfg, True)
        OmegaConf.set_readonly(cfg.hydra, False)
        type(loader)._apply_overrides_to_config(config_overrides, cfg)
        app_overrides = []
        for override in parsed_overrides:
            if override.is_hydra_override():
                cfg.hydra.overrides.hydra.append(override.input_line)
            else:
                cfg.hydra.overrides.task.append(override.input_line)
                app_overrides.append(override)
        with open_dict(cfg.hydra):
            cfg.hydra.runtime.choices.update(known_choices)
            for key in cfg.hydra.job.env_copy:
                cfg.hydra.job.env_set[key] = os.environ[key]
        cfg.hydra.runtime.version = __version__
        cfg.hydra.runtime.version_base = version.getbase()
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.runtime.config_sources = [ConfigSourceInfo(path=x.path, schema=x.scheme(), provider=x.provider)
                                            for x in caching_repo.get_sources()]
        if "name" not in cfg.hydra.job:
            cfg.hydra.job.name = JobRuntime().get("name")
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app_overrides, kv_sep=cfg.hydra.job.config.override_dirname.kv_sep,
            item_sep=cfg.hydra.job.config.override_dirname.item_sep,
            exclude_keys=cfg.hydra.job.config.override_dirname.exclude_keys)
        cfg.hydra.job.config_name = config_name
        return cfg


# sha256 of inspect.getsource of hydra-core 1.3.8's functions (hydra._internal.defaults_list) that carry the run
# mode into the defaults tree (skip_missing) and the one that reads it: what _mode_free's reasoning rests on
HYDRA_MODE_SHA256 = {
    "_check_not_missing": "603027ef7bbac97dab9a80de103fad87af033748f571f71c9113334dfbab8bfc",
    "_expand_virtual_root": "9db59b55c75fcab47801ea365065acc7f607a1e7e0480f91355921cbb62941ce",
    "_create_defaults_tree": "51641ba15337c94c21dd3ab2b337444606f287b2e9fa1609b87f6f3b87a6dec8",
    "_create_defaults_tree_impl": "d3ba5bb22c8018d946fa0d2fa88c1c2bca93ae14ef57acdfc6930f6e677808d5",
    "_create_defaults_list": "7829a14ac6b3598802a388d51b449449ce32ac7491171d300efc885208198150",
    "create_defaults_list": "f0dd0ad31a342543a481e620268f953fe6851f2fc8d3db986b49d66046846a0a",
}


def _modes_alike() -> bool:
    """Whether the installed Hydra's defaults-tree code is the code :func:`_mode_free` was written from
    (:data:`HYDRA_MODE_SHA256`); else a config composed in one run mode is never reused for the other."""
    import hydra._internal.defaults_list as dl
    return _known_source({k: getattr(dl, k, None) for k in HYDRA_MODE_SHA256}, HYDRA_MODE_SHA256)


def _mode_free(tree: Any) -> bool:
    """Whether Hydra's defaults tree ``tree`` (``DefaultsList.defaults_tree``) is the one both run modes build:
    no node of it names a missing config (``???``, or a name ending so). The run mode enters the tree only as
    ``create_defaults_list``'s ``skip_missing`` (``MULTIRUN``), read in one place (hydra-core 1.3.8's
    ``_check_not_missing``: a node whose config path ends with ``???`` is skipped, else refused), so a tree without
    such a node is built alike in ``RUN`` and ``MULTIRUN``: Hydra composes the primary config in both before a run
    (``Hydra.get_mode``: ``MULTIRUN``; ``Hydra.run``: ``RUN``), and :class:`ComposeCache` then merges it once. A node
    it cannot read counts as missing (False)."""
    from hydra.core.default_element import InputDefault
    stack = [tree]
    try:
        while stack:
            t = stack.pop()
            if isinstance(t, InputDefault):
                node, children = t, ()
            else:
                node, children = t.node, t.children or ()
            if not node.is_virtual():
                name = node.get_name()
                if name is not None and (not isinstance(name, str) or name.endswith("???")):
                    return False
            stack.extend(children)
    except Exception:   # noqa: BLE001 -- a node of another shape: not shared between the modes
        return False
    return True


# sha256 of inspect.getsource of hydra-core 1.3.8's defaults-tree code (hydra._internal.defaults_list): the
# function interpolation_map_when_used stands in for, and its only caller
HYDRA_DEFAULTS_SHA256 = {
    "_create_interpolation_map": "d80e4eeacb7434e08539617ea0f361b1b2f9fe49c37b2a2178decb12be2c4868",
    "_create_defaults_tree_impl": "d3ba5bb22c8018d946fa0d2fa88c1c2bca93ae14ef57acdfc6930f6e677808d5",
}


@contextlib.contextmanager
def interpolation_map_when_used():
    """While open, Hydra's defaults tree (``hydra._internal.defaults_list._create_defaults_tree_impl``) builds the
    map of known choices that resolves an interpolated default (``_create_interpolation_map``: an OmegaConf
    config of every choice so far and the node's defaults) only for a node whose defaults list has an interpolated
    entry (``${...}`` in a path or an option), the only case its caller reads it in: the caller resolves the
    node's interpolated children with it, and these are entries of that list. Elsewhere the map is None, unread.
    Each node otherwise built one (~60 % of a defaults tree's CPU: ~70 ms of a new variant's compose at a load of
    ~11). The entries' accessors Hydra's map reads (``get_config_path``, ``get_override_key``, with their checks)
    are called as there. Only where the installed Hydra's code is the one this was written from
    (:data:`HYDRA_DEFAULTS_SHA256`), else nothing changes; the module attribute is restored on exit."""
    import hydra._internal.defaults_list as dl
    original = dl._create_interpolation_map
    if not _known_source({"_create_interpolation_map": original,
                          "_create_defaults_tree_impl": dl._create_defaults_tree_impl}, HYDRA_DEFAULTS_SHA256):
        yield
        return

    def when_used(overrides: Any, defaults_list: list, self_added: bool) -> Any:
        for d in defaults_list:   # Hydra's loop over the entries, without the config it fills
            if self_added and d.is_self():
                continue
            if isinstance(d, dl.ConfigDefault):
                d.get_config_path()
            elif isinstance(d, dl.GroupDefault):
                d.get_override_key()
        if any(d.is_interpolation() for d in defaults_list):
            return original(overrides, defaults_list, self_added)
        return None
    dl._create_interpolation_map = when_used
    try:
        yield
    finally:
        dl._create_interpolation_map = original


@functools.lru_cache(maxsize=None)
def _libyaml_loader() -> Any:
    """OmegaConf's YAML loader class (``omegaconf._utils.get_yaml_loader()``: PyYAML's ``SafeLoader`` with its float
    resolver, no timestamps, the ``pathlib.Path`` constructors and duplicate keys refused) on libyaml's parser
    (``yaml._yaml.CParser``, as PyYAML's own ``CSafeLoader`` puts it under ``SafeLoader``'s constructor and resolver):
    the same objects from the same text, its resolving and constructing being OmegaConf's own code, about 8x less CPU
    (every config file of conf/ and Hydra's, 1,067 files: 2.09 -> 0.26 CPU s, 2026-12-06). None where PyYAML has no
    libyaml or OmegaConf's loader is not a ``SafeLoader`` without an ``__init__`` of its own."""
    import yaml
    from omegaconf._utils import get_yaml_loader
    omegaconf_loader = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False) or not issubclass(omegaconf_loader, yaml.SafeLoader) \
            or "__init__" in vars(omegaconf_loader):
        return None
    from yaml._yaml import CParser
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    class LibyamlOmegaConfLoader(CParser, omegaconf_loader):
        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
    return LibyamlOmegaConfLoader


def _load_on_libyaml(load: Any, config_path: str) -> Any:
    """``load(config_path=config_path)`` (a config source's ``load_config``, which reads the file with
    ``OmegaConf.load``) with OmegaConf's YAML loader on libyaml's parser (:func:`_libyaml_loader`); a file libyaml
    refuses is read again with OmegaConf's own loader, so a malformed file's error is PyYAML's own message, as
    without this. ``omegaconf._utils.get_yaml_loader`` (``OmegaConf.load`` looks it up on each call) is restored on
    return; where there is no such loader the file is read as Hydra reads it."""
    import omegaconf._utils as omegaconf_utils
    import yaml
    fast = _libyaml_loader()
    if fast is None:
        return load(config_path=config_path)
    original = omegaconf_utils.get_yaml_loader
    omegaconf_utils.get_yaml_loader = lambda: fast
    try:
        return load(config_path=config_path)
    except yaml.YAMLError:
        pass
    finally:
        omegaconf_utils.get_yaml_loader = original
    return load(config_path=config_path)


_SWEEP = object()   # ComposeCache._compose: overrides that sweep (a sweep's primary config), composed by Hydra

# sha256 of inspect.getsource(ConfigLoaderImpl._load_configuration_impl) of hydra-core 1.3.8: the code
# ComposeCache._compose repeats around its memo; a Hydra whose code differs composes without the memo
HYDRA_IMPL_SHA256 = "f611c97e466f94db72ac0a127250fa439eb79a30fe164968e5d71f543bb960c2"
# the same for the code ComposeCache._repo / _load_file / _merge repeat (hydra-core 1.3.8): the repository a compose
# gets (ConfigLoaderImpl._parse_overrides_and_create_caching_repo, CachingConfigRepository.__init__), its file cache
# (CachingConfigRepository.load_config), the merge of the defaults list (ConfigLoaderImpl._compose_config_from_defaults_list)
# and a group's options (ConfigLoaderImpl.get_group_options: ComposeCache.group_options)
HYDRA_REPO_SHA256 = {
    "ConfigLoaderImpl._parse_overrides_and_create_caching_repo":
        "64a9ff8144edc9f24527d1a3fabcccfa3783bad2c1cead6751036444d4d61dba",
    "CachingConfigRepository.load_config": "76b44dcf45281952984499e2043a24675e38043481d89fd62876814e454da6a5",
    "CachingConfigRepository.__init__": "d2b1c125731574fe7de0b14a17d17fde84fa942ce5f1f5a645cc860edbae1332",
    "ConfigLoaderImpl._compose_config_from_defaults_list":
        "136c76d6cb280db8f0644f528dffed4d6cf4850bb1193827e9a1dbda5d360fba",
    "ConfigLoaderImpl.get_group_options": "540fb02d260af47d9272d7ba397126a7619b999e6e1ee354e46c1eecddd455b5",
}


def _hydra_is_known(loader: Any) -> bool:
    """Whether the code of ``loader``'s Hydra that :class:`ComposeCache` repeats is the code it was written
    from (:data:`HYDRA_IMPL_SHA256`, :data:`HYDRA_REPO_SHA256`: sha256 of each function's source)."""
    import hashlib
    import inspect
    try:
        from hydra._internal.config_repository import CachingConfigRepository
        code = {"_load_configuration_impl": getattr(type(loader), "_load_configuration_impl", None),
                "ConfigLoaderImpl._parse_overrides_and_create_caching_repo":
                    getattr(type(loader), "_parse_overrides_and_create_caching_repo", None),
                "CachingConfigRepository.load_config": CachingConfigRepository.load_config,
                "CachingConfigRepository.__init__": CachingConfigRepository.__init__,
                "ConfigLoaderImpl._compose_config_from_defaults_list":
                    getattr(type(loader), "_compose_config_from_defaults_list", None),
                "ConfigLoaderImpl.get_group_options": getattr(type(loader), "get_group_options", None)}
        want = {"_load_configuration_impl": HYDRA_IMPL_SHA256, **HYDRA_REPO_SHA256}
        return all(hashlib.sha256(inspect.getsource(f).encode()).hexdigest() == want[k] for k, f in code.items())
    except (ImportError, OSError, TypeError):
        return False


def cache_compositions(loader: Any) -> Optional[ComposeCache]:
    """Give Hydra's config loader ``loader`` (a ``ConfigLoaderImpl``) a :class:`ComposeCache` (its
    ``_load_configuration_impl``, on this instance only), once; returns it, or None where the installed Hydra's
    code the cache repeats is not the code it was written from (:func:`_hydra_is_known`) or ``loader`` is
    not Hydra's own loader (then nothing changes)."""
    cur = loader.__dict__.get("_load_configuration_impl") if hasattr(loader, "__dict__") else None
    if isinstance(cur, ComposeCache):
        return cur
    if not _hydra_is_known(loader):
        return None
    cache = ComposeCache(loader, getattr(loader, "_load_configuration_impl"))
    loader._load_configuration_impl = cache
    loader.get_group_options = cache.group_options
    return cache


# sha256 of inspect.getsource of hydra-core 1.3.8's hydra._internal.hydra.Hydra.get_help: the code help_on_demand repeats
HYDRA_HELP_SHA256 = {"get_help": "e6f95066c04de9087a8e283fc282b85ef1632dd48353c570a4865d3aec531e6f"}


class _OnDemand(dict):
    """The substitutions of a help template, each made when the template reads it (``string.Template`` reads a
    mapping only at the ``$NAME`` placeholders its text has) and kept."""

    def __init__(self, makers: dict):
        super().__init__()
        self._makers = makers

    def __missing__(self, key: str) -> str:
        if key not in self._makers:
            raise KeyError(key)
        value = self[key] = self._makers[key]()
        return value


def _get_help_on_demand(self: Any, help_cfg: Any, cfg: Any, args_parser: Any, resolve: bool) -> str:
    """Hydra's ``Hydra.get_help`` (the help text: its template with ``$FLAGS_HELP``, ``$HYDRA_CONFIG_GROUPS``,
    ``$APP_CONFIG_GROUPS`` and ``$CONFIG`` substituted) with the two config-group listings made only where the
    template has their placeholder: each lists every group's options (``format_config_groups``: 121
    ``get_group_options`` calls on this repository's configs, ~40 % of ``run.py --help``'s CPU), and the harness's
    template (``conf/config.yaml`` ``hydra.help.template``) has neither; ``--hydra-help``'s has both, made as
    Hydra makes them. The flags' help and the config's YAML (which may fail on an interpolation with
    ``--resolve``) are made first, as Hydra makes every substitution before the template is filled."""
    import string

    from omegaconf import OmegaConf

    def is_hydra_group(x: str) -> bool:
        return x.startswith("hydra/") or x == "hydra"

    values = _OnDemand({"HYDRA_CONFIG_GROUPS": lambda: self.format_config_groups(is_hydra_group),
                        "APP_CONFIG_GROUPS": lambda: self.format_config_groups(lambda x: not is_hydra_group(x))})
    values["FLAGS_HELP"] = self.format_args_help(args_parser)
    values["CONFIG"] = OmegaConf.to_yaml(cfg, resolve=resolve)
    return string.Template(help_cfg.template).substitute(values)


def help_on_demand(hydra_obj: Any) -> bool:
    """Give the Hydra instance ``hydra_obj`` (``hydra._internal.hydra.Hydra``) :func:`_get_help_on_demand` as its
    ``get_help`` (on this instance only), where the installed Hydra's ``get_help`` is the code it repeats
    (:data:`HYDRA_HELP_SHA256`); returns whether it did (else nothing changes). ``--help`` prints the same text."""
    import functools

    from hydra._internal.hydra import Hydra
    if not _known_source({"get_help": Hydra.__dict__.get("get_help")}, HYDRA_HELP_SHA256):
        return False
    # (a partial of the module's function, not a bound method: an object holding it still pickles, as a worker
    # of hydra.launcher.start_method=spawn receives it)
    hydra_obj.get_help = functools.partial(_get_help_on_demand, hydra_obj)
    return True


_COMPOSED: dict = {}   # id(Hydra's config loader) -> its ComposedConfigs: one memo per loader in this process

POOL_TARGET = "hydra_plugins.harness_launcher.pool_launcher.PoolLauncher"
# the launchers that compose each job once through the memo (install() in their setup): the pool, and its chunks
# on Slurm / Ray (harness.run.cluster_sweep)
MEMO_TARGETS = (POOL_TARGET, "hydra_plugins.harness_launcher.pool_launcher.SlurmPoolLauncher",
                "hydra_plugins.harness_launcher.pool_launcher.RayPoolLauncher")


def composed(loader: Any) -> ComposedConfigs:
    """The memo (:class:`ComposedConfigs`) of Hydra's config loader ``loader``, made on first use (and the
    loader given its :class:`ComposeCache` then)."""
    if isinstance(loader, ComposedConfigs):
        return loader
    c = _COMPOSED.get(id(loader))
    if c is None or c._loader is not loader:
        cache_compositions(loader)      # (the harness's validation composes first: ComposeCache from the start)
        c = _COMPOSED[id(loader)] = ComposedConfigs(loader)
    return c


# sha256 of inspect.getsource of hydra-core 1.3.8's hydra.plugins.sweeper.Sweeper.validate_batch_is_legal: the code
# validate_batch_is_legal repeats (a Hydra whose code differs keeps its own)
HYDRA_SWEEPER_SHA256 = {"validate_batch_is_legal": "7033ddd3b22e2c8f1fd5f5df733b443082fe8fbcb6f1143aac243d0b1cd91bb3"}
_SWEEPER_OWN: list = []   # Hydra's Sweeper.validate_batch_is_legal, once replaced by validate_batch_is_legal


def validate_batch_is_legal(self: Any, batch: Sequence[Sequence[str]]) -> None:
    """Hydra's ``Sweeper.validate_batch_is_legal`` (each job of ``batch`` composed before the launch, so that a
    job Hydra refuses fails the sweep before any runs), with a sweeper whose config loader is a
    :class:`ComposedConfigs` composing into the memo without a copy (:meth:`ComposedConfigs.check_sweep_config`:
    Hydra's composes a job's config, ~0.02 s of copying a job, and drops it); any other loader runs Hydra's own
    code. Installed on Hydra's ``Sweeper`` by :func:`install` where its source is the code this repeats
    (:data:`HYDRA_SWEEPER_SHA256`)."""
    config_loader = (self.hydra_context.config_loader if hasattr(self, "hydra_context")
                     and self.hydra_context is not None else self.config_loader)
    if not isinstance(config_loader, ComposedConfigs):
        return _SWEEPER_OWN[0](self, batch)
    assert self.config is not None
    for overrides in batch:
        config_loader.check_sweep_config(self.config, list(overrides))


def install(hydra_context: Any) -> ComposedConfigs:
    """Route ``hydra_context``'s config loader through its memo (:func:`composed`); returns the memo. The
    sweeper holds the same context, so its validation composes through the memo too (without a copy:
    :func:`validate_batch_is_legal`, put on Hydra's ``Sweeper`` here once, where its code is the one that
    repeats), and the harness's validation (:func:`job_config`) reaches the same memo through the global Hydra
    instance's loader."""
    from hydra.plugins.sweeper import Sweeper
    own = Sweeper.__dict__.get("validate_batch_is_legal")
    if own is not validate_batch_is_legal and not _SWEEPER_OWN and \
            _known_source({"validate_batch_is_legal": own}, HYDRA_SWEEPER_SHA256):
        _SWEEPER_OWN.append(own)
        Sweeper.validate_batch_is_legal = validate_batch_is_legal
    hydra_context.config_loader = composed(hydra_context.config_loader)
    return hydra_context.config_loader


def job_config(master_config: Any, overrides: Sequence[str]) -> Any:
    """Job ``overrides``'s task config (the composed config without its ``hydra`` node) through the memo of
    the sweep's config loader when the sweep runs on the pool launcher (or its Slurm / Ray chunks,
    :data:`MEMO_TARGETS`), else None (compose it yourself)."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict
    if OmegaConf.select(master_config, "hydra.launcher._target_") not in MEMO_TARGETS:
        return None
    gh = GlobalHydra.instance()
    if not gh.is_initialized() or gh.hydra is None:
        return None
    cfg = composed(gh.hydra.config_loader).load_sweep_config(master_config, list(overrides))
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


# True while job_heap runs a job in this process: harness.run.runner's _execute then leaves the heap's freezing to it
JOB_HEAP_FROZEN = [False]
# job_heap's full collections: [the permanent generation's size after the last one, jobs since]
_FULL_GC = [0, 0]
FULL_GC_EVERY = 32   # jobs between two collections of the whole heap (job_heap), at the latest


@contextlib.contextmanager
def job_heap():
    """The cyclic garbage collector around one job of a sweep (:func:`_run_job`): before the job, ``gc.freeze()``
    moves every object of the process (its modules, the caches kept across jobs: composed configs, parsed traces,
    SLO baselines; what earlier jobs kept) to the permanent generation, which collections skip (Python docs,
    ``gc.freeze``); the job's own objects are collected as usual meanwhile, and after the job one
    ``gc.collect()`` frees its cyclic garbage (its configs, the simulation's state), walking only objects made
    during the job. Without it, each full collection in a job walked the whole process (~130,000 objects a
    warm sweep process: ~60-150 ms of CPU each at loads 5-13, ~0.2-0.3 of them a job, docs/speed.md) and the
    earlier jobs' garbage was found only by those. Objects frozen before a job that become garbage later (a
    cache's evicted entry, the previous job's logging handlers) are collected by a full collection (the heap
    unfrozen and collected whole) once the permanent generation has grown by a quarter since the last one (the
    interpreter's own rule for full collections) or every :data:`FULL_GC_EVERY` jobs. ``harness.run.runner``
    does its own freeze around a run's loop only outside this (a single ``python run.py``). Nothing a run
    computes depends on when garbage is collected (the benchmarks compare every job's files with one process per
    run)."""
    import gc
    gc.freeze()
    JOB_HEAP_FROZEN[0] = True
    try:
        yield
    finally:
        JOB_HEAP_FROZEN[0] = False
        gc.collect()   # the job's own garbage (the frozen heap is not walked)
        _FULL_GC[1] += 1
        frozen = gc.get_freeze_count()
        gc.unfreeze()   # (between jobs the heap is collected as usual; the next job freezes it again)
        if _FULL_GC[1] >= FULL_GC_EVERY or frozen > _FULL_GC[0] * 5 // 4:
            gc.collect()
            gc.freeze()   # (O(1): a list splice; get_freeze_count counts what the collection left)
            _FULL_GC[0], _FULL_GC[1] = gc.get_freeze_count(), 0
            gc.unfreeze()


# One worker's state, set once by _init (in the worker) or by launch (in this process when there is no pool).
_WORKER: dict[str, Any] = {}


def _init(hydra_context: Any, config: Any, task_function: Any, singleton_state: Any, pooled: bool) -> None:
    """A worker's start: Hydra's globals and singletons (the ConfigStore, the plugins) as the parent's, the
    sweep's context kept for every job. ``singleton_state``: Hydra's ``Singleton.get_state()`` of the launching
    process, set here (``Singleton.set_state``: a spawned worker, a Slurm / Ray task); None where this process
    already holds that state (the jobs run in the launching process, or in a worker forked from it), which Hydra's
    basic launcher leaves alone too: ``set_state`` would run Hydra's plug-in scan again, which executes the
    plug-in modules again (Hydra's ``BasicSweeperConf`` and the like become new classes), and a job's config,
    composed before, could then not be pickled (:func:`fresh_copy` copies it the slower way). In a pool worker
    SIGINT is ignored between jobs (a Ctrl-C reaches the running job only; :func:`_run_job` restores Python's
    handler while a job runs)."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals
    setup_globals()
    if singleton_state is not None:
        Singleton.set_state(_with_resolvers(singleton_state))
    _WORKER.update(hydra_context=hydra_context, config=config, task_function=task_function, pooled=pooled)
    if pooled:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def picklable_singleton_state(state: dict) -> dict:
    """Hydra's ``Singleton.get_state()`` ``state`` for a worker started by pickling its arguments
    (``hydra.launcher.start_method=spawn`` / ``forkserver``): the OmegaConf resolvers it holds (a function
    ``OmegaConf.register_new_resolver`` made, which ``pickle`` cannot name) replaced by their names; the worker
    takes the functions its own imports registered under those names (:func:`_with_resolvers`). Hydra's own
    launchers send the state by ``cloudpickle`` (submitit, Ray), which pickles such functions by value."""
    return {**state, "omegaconf_resolvers": sorted(state.get("omegaconf_resolvers", {}))}


def _with_resolvers(state: dict) -> dict:
    """``state`` as ``Singleton.set_state`` takes it: where :func:`picklable_singleton_state` left the resolvers'
    names, the resolvers this process registered under them (Hydra's, by ``setup_globals``; the harness's, by
    ``harness.run.config.register_configs``; a plug-in's, by Hydra's plug-in scan, which ``set_state`` runs first and
    which is run here before the check); else ``state`` as it is.

    Raises:
        RuntimeError: a resolver of the launching process is not registered in this one (naming it)."""
    names = state.get("omegaconf_resolvers")
    if not isinstance(names, list):
        return state
    from hydra.core.plugins import Plugins
    from omegaconf.basecontainer import BaseContainer
    from harness.run.config import register_configs
    register_configs()   # the harness's resolvers (idempotent; set_state then replaces the ConfigStore it fills)
    Plugins.instance()   # (the plug-ins' resolvers; set_state calls it too)
    have = BaseContainer._resolvers
    missing = [n for n in names if n not in have]
    if missing:
        raise RuntimeError(f"sweep worker: OmegaConf resolver(s) {', '.join(missing)} of the launching process are "
                           f"not registered in this worker (hydra.launcher.start_method spawn / forkserver: a "
                           f"resolver is registered where its module is imported; import it in the task's module, "
                           f"or use fork)")
    return {**state, "omegaconf_resolvers": {n: have[n] for n in names}}


def _run_job(idx: int, overrides: Sequence[str], sweep_config: Any = None) -> Any:
    """Compose job ``idx``'s config from the sweep's and ``overrides`` (unless ``sweep_config``, the job's
    config composed elsewhere with its number set, is given: ``harness.run.cluster_sweep``) and run it (Hydra's
    ``run_job``, the sweep's directory and subdirectory keys); returns its ``JobReturn``. A job's ``sys.exit`` (a
    config error, an interrupt) is raised to the caller as ``SystemExit``."""
    from omegaconf import open_dict
    ctx, config = _WORKER["hydra_context"], _WORKER["config"]
    if sweep_config is None:
        load = getattr(ctx.config_loader, "take_sweep_config", None) or ctx.config_loader.load_sweep_config
        sweep_config = load(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
    pooled = _WORKER["pooled"]
    if pooled:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with job_heap():
            ret = run_job(hydra_context=ctx, task_function=_WORKER["task_function"], config=sweep_config,
                          job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    finally:
        if pooled:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.stdout.flush()   # the job's printed table now, not when the worker exits
            sys.stderr.flush()
    # the job's configs stay in its .hydra/ files: not pickled back from a worker, and not kept for the rest of the
    # sweep by the process that runs its jobs (~0.3 MB of config objects a job, 480 jobs ~150 MB, and more objects
    # for every full collection to walk). Nothing reads them there: Hydra's sweepers read the status and the return
    # value, the callbacks got them in on_job_end (cluster_sweep drops hydra_cfg too)
    ret.hydra_cfg = None
    ret.cfg = None
    return ret


def launch(hydra_context: Any, config: Any, task_function: Any, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int, n_jobs: Optional[int], start_method: Optional[str]) -> list:
    """Run every job of ``job_overrides`` (job numbers from ``initial_job_idx``) on :func:`workers_for`
    workers; returns their ``JobReturn`` in job order. ``start_method``: the ``multiprocessing`` start method
    of the pool (None: ``fork`` where the OS has it, else ``spawn``).

    Raises:
        ValueError: ``n_jobs`` or ``start_method`` is invalid (naming the key).
        SystemExit: a job exited (status 2: bad input; 130: interrupted): the jobs not started are cancelled,
            the running ones finish first.
    """
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides, setup_globals
    import multiprocessing as mp

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    jobs = [(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
    workers = workers_for(n_jobs, len(jobs))
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"hydra.launcher.start_method must be one of {', '.join(START_METHODS)} or null, "
                         f"got {start_method!r}")
    method = start_method or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    how = ("in this process, one after another" if workers == 1 else
           f"on {workers} worker processes ({method}) that keep their imports, parsed traces and SLO baselines "
           f"across jobs")
    print(f"sweep executor: {len(jobs)} jobs {how} (hydra.launcher.n_jobs={n_jobs if n_jobs is not None else 'null'}"
          f"{'' if n_jobs is not None else f': the {usable_cores()} cores this process may use'})", flush=True)
    for idx, o in jobs:
        log.info(f"\t#{idx} : {' '.join(filter_overrides(o))}")
    try:
        if workers == 1:   # this process's singletons as they are (Hydra's basic launcher's way)
            _init(hydra_context, config, task_function, None, pooled=False)
            runs = []
            for idx, o in jobs:
                runs.append(_run_job(idx, o))
                configure_log(config.hydra.hydra_logging, config.hydra.verbose)
            return runs
        # a forked worker starts with this process's singletons; a spawned one gets them (Singleton.set_state)
        state = None if method == "fork" else picklable_singleton_state(Singleton.get_state())
        return _launch_pool(jobs, workers, mp.get_context(method), (hydra_context, config, task_function, state, True))
    finally:
        if isinstance(hydra_context.config_loader, ComposedConfigs):
            hydra_context.config_loader.clear()


def _launch_pool(jobs: list, workers: int, ctx: Any, initargs: tuple) -> list:
    """:func:`launch` on a ``ProcessPoolExecutor`` of ``workers`` persistent processes (``ctx``: the
    multiprocessing context). A job's ``SystemExit`` (or a Ctrl-C here) cancels the jobs not started, waits
    for the running ones (which write their results first) and is raised again."""
    from concurrent.futures import ProcessPoolExecutor
    sys.stdout.flush()   # a forked worker inherits this process's buffers: nothing unwritten may be copied
    sys.stderr.flush()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init, initargs=initargs)
    futures = []
    try:
        futures = [pool.submit(_run_job, idx, o) for idx, o in jobs]
        runs = []
        for f in futures:
            runs.append(f.result())
        return runs
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        codes = [f.exception().code for f in futures if f.done() and not f.cancelled()
                 and isinstance(f.exception(), SystemExit)]
        print(f"interrupted; the sweep stops here ({sum(1 for c in codes if c == 130)} running jobs wrote what they "
              f"measured; re-run the same command to resume it)", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
