"""The run pipeline: one wiring for every backend (``harness.run.session.run_session``), one recorder, backends as
plug-ins, engine knobs that mean the same everywhere, and layering without import cycles.

* Conformance: the same tiny workload through the simulator and through a fake in-memory backend (a
  third ``Cluster``, registered here as a plug-in) for every registered scheduler gives the same file
  set, the same columns in every file and the same decision kinds (the ``plan`` row included).
* A policy that raises mid-run ends the run at once: ``partial: true``, the policy's error and traceback
  in ``summary.json``, the measured rows kept, a non-zero exit from the CLI.
* ``engine.*`` knobs reach ``vllm serve`` as flags, or are rejected naming the key.
* The import graph of ``harness/`` + ``baselines/`` (every import: module level, function level, ``__main__`` and ``TYPE_CHECKING``
  blocks) has no cycle; neither ``harness.vllm`` nor ``baselines`` imports ``harness.sim``, no backend imports
  ``baselines``, the vLLM backend does not import the config module; ``Controller(`` is constructed in one place.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from harness.core.backend import BackendConfig, ClusterBase, InstanceInfo, InstanceState, backends, register_backend
from harness.core.clock import Priority, SimClock
from harness.run.config import PROJECT_ROOT, ConfigError
from harness.run.runner import execute
from harness.core.schedulers import registered
from harness.run.session import estimated_capacities, session_input
from tests.conftest import BATCH_FORMING, NEEDS_PD, compose_run, run_py_in_process

SMALL = ["workload.num_conversations=6", "workload.max_turns=4", "workload.rate_per_s=0.5", "logger.progress=false"]


def cluster_for(scheduler: str) -> str:
    return "a40_1p3d" if scheduler in NEEDS_PD else "a40_4x"


# ---- a fake in-memory backend: a third implementation of the Cluster protocol ----------------------------

@dataclass
class FakeBackendConfig(BackendConfig):
    """``backend=fake`` (tests only): every turn takes ``step_s`` per token, no KV, no energy."""

    name: str = "fake"
    step_s: float = 0.01


class FakeCluster(ClusterBase):
    """Turns run on a virtual clock at ``step_s`` per token (prefill = one step); nothing is shared."""

    def __init__(self, inp, step_s: float):
        self.clock = SimClock()
        self.step_s = step_s
        caps = estimated_capacities(inp)  # the profiles' KV capacity, as a real server would report its own
        self.infos = tuple(InstanceInfo(i, n, r, hw.name, c) for i, ((n, r, hw), c) in enumerate(zip(inp.instances, caps)))
        self.running = [0] * len(self.infos)

    def start_turn(self, job) -> None:
        job.start_s = self.clock.now()
        d = job.placement.decode_instance
        self.running[d] += 1
        t_first = self.clock.now() + self.step_s

        def first():
            job.prefill_done_s = job.first_token_s = self.clock.now()
            job.on_prefill_done(job)

        def finish():
            self.running[d] -= 1
            job.finish_s = self.clock.now()
            job.itl_s = [self.step_s] * (job.output_tokens - 1)
            job.on_finish(job)

        self.clock.call_at(t_first, first, priority=Priority.ENGINE)
        self.clock.call_at(t_first + self.step_s * (job.output_tokens - 1), finish, priority=Priority.ENGINE)

    def observe(self):
        return tuple(InstanceState(0, r, 0, math.nan) for r in self.running)

    def power_w(self):
        return [math.nan] * len(self.infos)

    def drive(self, start, done, on_tick, tick_s):
        start()
        if tick_s:
            def tick():
                on_tick()
                if not done() and self.clock.pending():
                    self.clock.call_at(self.clock.now() + tick_s, tick, priority=Priority.TICK)
            self.clock.call_at(0.0, tick, priority=Priority.TICK)
        self.clock.run()
        return "" if done() else "fake cluster stalled"

    def energy_j(self, end_s):
        return [math.nan] * len(self.infos)

    def preemptions(self):
        return 0

    def measured(self):
        return {}


if "fake" not in backends():
    @register_backend("fake", FakeBackendConfig)
    @contextlib.contextmanager
    def open_fake(inp, cfg, run_dir=None, *, conversations=()):
        yield FakeCluster(inp, cfg.step_s)


def run_files(out: Path) -> dict[str, object]:
    """File name -> column list (parquet) or key set (JSON) of a run directory."""
    got: dict[str, object] = {}
    for p in sorted(out.iterdir()):
        if p.suffix == ".parquet":
            got[p.name] = list(pd.read_parquet(p).columns)
        elif p.name == "summary.json":
            got[p.name] = "present"
        elif p.is_file():
            got[p.name] = "present"
    return got


@pytest.mark.parametrize("scheduler", registered())
def test_backend_conformance_same_files_columns_and_decision_kinds(scheduler, tmp_path):
    """Every registered scheduler runs on the simulator and on the fake backend with the same files, columns and
    decision kinds -- or, if it forms batches inside the engine (which the fake backend, like vLLM, cannot
    take), is refused before anything runs with an error naming the backend."""
    # the fake backend composes as backend=fake once registered (register_configs runs per compose)
    base = SMALL + [f"scheduler={scheduler}", f"cluster={cluster_for(scheduler)}", "slo=absolute"]
    if not FakeBackendConfig.__dict__.get("supports_batch_rules") and scheduler in BATCH_FORMING:
        with pytest.raises(ConfigError, match="backend=fake cannot take one"):
            execute(compose_run(base + ["backend=fake"]), tmp_path / "fake")
        assert not (tmp_path / "fake" / "turns.parquet").exists()
        base += ["backend=sim"]
        execute(compose_run(base), tmp_path / "sim")
        kinds = set(pd.read_parquet(tmp_path / "sim" / "decisions.parquet").kind)
        assert "plan" in kinds and "place" in kinds
        return
    outs = {}
    for backend in ("sim", "fake"):
        out = tmp_path / backend
        execute(compose_run(base + [f"backend={backend}"]), out)
        outs[backend] = out
    sim, fake = (run_files(outs[b]) for b in ("sim", "fake"))
    assert sim == fake
    kinds = {b: set(pd.read_parquet(outs[b] / "decisions.parquet").kind) for b in outs}
    assert kinds["sim"] == kinds["fake"] and "place" in kinds["sim"]
    plans = {b: json.loads((outs[b] / "summary.json").read_text()).get("policy_plan") for b in outs}
    assert plans["sim"] == plans["fake"]
    for b in outs:
        t = pd.read_parquet(outs[b] / "turns.parquet")
        assert (t.status == "ok").all() and len(t) > 0
    # the fake backend's ITL is step_s by construction: its per-turn p50 must be exactly that
    t = pd.read_parquet(outs["fake"] / "turns.parquet")
    multi = t[t.output_tokens > 1]
    assert (multi.itl_p50_s.round(12) == 0.01).all()


# ---- a policy that raises mid-run ends the run at once --------------------------------------------------

def raising_after(monkeypatch, n: int):
    """Make ``Collocated.place`` raise on its ``n``-th call."""
    from baselines.collocated import Collocated
    calls = {"n": 0}
    orig = Collocated.place

    def place(self, turn, view, now):
        calls["n"] += 1
        if calls["n"] >= n:
            raise ZeroDivisionError("policy bug on purpose")
        return orig(self, turn, view, now)

    monkeypatch.setattr(Collocated, "place", place)
    return calls


@pytest.mark.parametrize("backend", ["sim", "fake"])
def test_policy_error_ends_the_run_at_once_with_partial_results(backend, monkeypatch, tmp_path):
    calls = raising_after(monkeypatch, 5)
    run = compose_run(SMALL + ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", f"backend={backend}"])
    with pytest.raises(RuntimeError, match="policy bug on purpose"):
        execute(run, tmp_path)
    assert calls["n"] == 5          # nothing was placed after the error
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["partial"] is True and "ZeroDivisionError: policy bug on purpose" in s["error"]
    assert "Collocated" not in s["error"] and "in place" in s["error_traceback"]
    t = pd.read_parquet(tmp_path / "turns.parquet")
    assert len(t) < 4 * 6           # the run stopped: not every turn ran
    assert (tmp_path / "conversations.parquet").is_file() and (tmp_path / "instances.parquet").is_file()


def test_cli_exits_nonzero_on_a_policy_error(tmp_path, monkeypatch, capsys):
    from baselines.collocated import Collocated

    def boom(self, turn, view, now):
        raise ZeroDivisionError("policy bug on purpose")
    monkeypatch.setattr(Collocated, "place", boom)
    out = tmp_path / "run"
    r = run_py_in_process([*SMALL, "scheduler=collocated", "cluster=a40_4x", "slo=absolute", f"hydra.run.dir={out}"],
                          monkeypatch, capsys)
    assert r.returncode != 0
    assert "policy bug on purpose" in r.stderr
    assert json.loads((out / "summary.json").read_text())["partial"] is True


# ---- engine knobs mean the same on the real-vLLM backend ---------------------------------------------

def test_engine_knobs_reach_vllm_serve_as_flags(tmp_path):
    from harness.vllm.cluster import instance_specs
    run = compose_run(["backend=vllm", "model=tiny", "slo=absolute", "cluster=cpu_1x",
                       "engine.max_num_batched_tokens=1024", "engine.block_size=32", "engine.max_num_seqs=7",
                       "engine.gpu_memory_utilization=0.5", "engine.enable_prefix_caching=false"])
    cmd = instance_specs(session_input(run), run.backend, "/models/tiny", tmp_path)[0].command()
    for flag, value in [("--max-num-batched-tokens", "1024"), ("--block-size", "32"), ("--max-num-seqs", "7"),
                        ("--gpu-memory-utilization", "0.5")]:
        assert cmd[cmd.index(flag) + 1] == value, (flag, cmd)
    assert "--no-enable-prefix-caching" in cmd and "--enable-prefix-caching" not in cmd


def test_a_cpu_server_runs_vllms_server_with_its_engine_processes_forked(tmp_path):
    """``backend.device=cpu`` (default ``cpu_start_method=fork``, and ``fork_engine``): the launcher runs ``python -m
    harness.vllm.api_server`` with this checkout first on the server's ``PYTHONPATH`` (it must import this
    ``harness``) and the method in its environment; ``cpu_start_method=spawn`` and ``device=gpu`` run vLLM's own
    module; another value is refused naming the key."""
    from harness.vllm.api_server import START_METHOD_ENV
    from harness.vllm.cluster import instance_specs
    base = ["backend=vllm", "model=tiny", "slo=absolute", "cluster=cpu_1p1d", "scheduler=conserve",
            "engine.block_size=128"]
    for extra, module, method in (([], "harness.vllm.api_server", "fork"),
                                  (["backend.cpu_start_method=fork_engine"], "harness.vllm.api_server", "fork_engine"),
                                  (["backend.cpu_start_method=spawn"], "vllm.entrypoints.openai.api_server", None),
                                  (["backend.device=gpu", "backend.kv_connector=NixlConnector"],
                                   "vllm.entrypoints.openai.api_server", None)):
        run = compose_run(base + extra)
        for s in instance_specs(session_input(run), run.backend, "m", tmp_path):
            assert s.command()[1:4] == ["-m", module, "--model"], (extra, s.command()[:4])
            assert s.env.get(START_METHOD_ENV) == method, extra
            if module == "harness.vllm.api_server":
                assert s.env["PYTHONPATH"].split(":")[0] == str(PROJECT_ROOT)
    with pytest.raises(ConfigError, match=r"backend\.cpu_start_method must be 'fork', 'fork_engine' or 'spawn'"):
        compose_run(base + ["backend.cpu_start_method=forkserver"])


@pytest.mark.parametrize(("requested", "bind", "numa", "method"), [
    ("fork", "1", False, "fork"), ("fork", "0|1", False, "fork"),           # one CPU per rank: bound by hand
    ("fork", None, False, "spawn"), ("fork", "auto", False, "spawn"), ("fork", "nobind", False, "spawn"),
    ("fork", "0-1", False, "spawn"), ("fork", "0,1", False, "spawn"), ("fork", "0|1,2", False, "spawn"),
    ("fork", "1", True, "spawn"),                                           # --numa-bind: numactl wraps a spawn
    ("fork_engine", "1", False, "spawn")])
def test_the_worker_is_forked_only_where_its_binding_is_one_cpu(requested, bind, numa, method):
    from harness.vllm.api_server import worker_start_method
    got, why = worker_start_method(requested, bind, numa)
    assert got == method and why


def test_the_fork_wrapper_forks_the_engine_core_and_a_one_cpu_worker_and_says_so(monkeypatch, capsys):
    """``harness.vllm.api_server.fork_engine_processes`` on stand-ins of vLLM 0.32's CPU platform (a class whose
    ``check_and_update_config`` sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, as ``vllm/platforms/cpu.py`` does)
    and of its ``OMPProcessManager`` (``configure_omp_envs``: the context the engine core starts worker
    ``local_rank`` in; stand-in modules, so no vLLM or torch import): after the check the variable is ``fork``
    (the engine core is forked), the check's own work still done, the server's log told once per replaced value
    and once of the worker's method; in a process forked afterwards (the engine core) the variable is the worker's
    method, ``fork`` for ``VLLM_CPU_OMP_THREADS_BIND=1`` and ``spawn`` for ``fork_engine``; a process forked inside
    ``configure_omp_envs`` (the worker) is bound to that worker's CPUs, once; applied twice it wraps and registers
    once. (The real servers' logs carry the lines: tests/test_vllm_real.py.)"""
    import contextlib
    import os
    import types
    from harness.vllm import api_server
    seen = []

    class CpuPlatform:
        @classmethod
        def check_and_update_config(cls, vllm_config):
            seen.append(vllm_config)
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    class OMPProcessManager:
        def __init__(self, cpu_lists, skip_setup=False):
            self.cpu_lists, self.skip_setup = cpu_lists, skip_setup

        @contextlib.contextmanager
        def configure_omp_envs(self, rank, local_rank):
            os.environ["OMP_NUM_THREADS"] = str(len(self.cpu_lists[local_rank]))
            yield
    cpu = types.ModuleType("vllm.platforms.cpu")
    cpu.CpuPlatform = CpuPlatform
    platforms = types.ModuleType("vllm.platforms")
    platforms.cpu = cpu
    omp = types.ModuleType("vllm.utils.ompmultiprocessing")
    omp.OMPProcessManager = OMPProcessManager
    utils = types.ModuleType("vllm.utils")
    utils.ompmultiprocessing = omp
    for name, mod in (("vllm", types.ModuleType("vllm")), ("vllm.platforms", platforms), ("vllm.platforms.cpu", cpu),
                      ("vllm.utils", utils), ("vllm.utils.ompmultiprocessing", omp)):
        monkeypatch.setitem(sys.modules, name, mod)
    for var in ("VLLM_WORKER_MULTIPROC_METHOD", "OMP_NUM_THREADS"):   # (set first: a delenv of a variable absent
        monkeypatch.setenv(var, "")   # records nothing, and what the test sets then outlived it in the worker's
        monkeypatch.delenv(var)       # environment, which every later launch from that worker inherited)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    monkeypatch.setattr(api_server, "_worker_method", ["spawn"])
    monkeypatch.setattr(api_server, "_worker_cpus", [])
    monkeypatch.setattr(api_server, "_worker_said", [])
    bound = []
    monkeypatch.setattr(api_server, "bind_forked_worker", bound.append)
    at_fork = []   # (not os.register_at_fork itself: a handler cannot be removed from this test process)
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: at_fork.append(kw))
    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(numa_bind=False))
    api_server.fork_engine_processes("fork")
    api_server.fork_engine_processes("fork")
    CpuPlatform.check_and_update_config(config)
    assert seen == [config] and os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    err = capsys.readouterr().err
    assert err.count(api_server.FORKED_LINE + " (the CPU platform set spawn)") == 1
    assert err.count(api_server.WORKER_LINE + "fork (VLLM_CPU_OMP_THREADS_BIND=1: one CPU per worker)") == 1
    assert at_fork == [{"after_in_child": api_server.in_forked_child}]
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"   # (what the CPU platform's check leaves in a fresh process)
    at_fork[0]["after_in_child"]()                         # in the forked engine core: its worker forked, nothing bound
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork" and bound == []
    with OMPProcessManager([[3], [5]]).configure_omp_envs(rank=1, local_rank=1):
        assert os.environ["OMP_NUM_THREADS"] == "1"        # vLLM's own context still runs
        at_fork[0]["after_in_child"]()                     # in the forked worker of local rank 1
        at_fork[0]["after_in_child"]()                     # in a process that worker forks: bound once only
    assert bound == [[5]] and api_server._worker_cpus == []
    with OMPProcessManager([[3]], skip_setup=True).configure_omp_envs(rank=0, local_rank=0):
        at_fork[0]["after_in_child"]()                     # VLLM_CPU_OMP_THREADS_BIND=nobind: nothing to bind
    assert bound == [[5]]
    # fork_engine: the engine core is forked, its worker spawned (the check runs again: the wrapper is installed)
    monkeypatch.setattr(cpu, "CpuPlatform", type("CpuPlatform", (), {
        "check_and_update_config": classmethod(lambda cls, c: os.environ.__setitem__("VLLM_WORKER_MULTIPROC_METHOD",
                                                                                       "spawn"))}))
    api_server.fork_engine_processes("fork_engine")
    monkeypatch.setattr(api_server, "_worker_said", [])            # (a fresh server's log)
    cpu.CpuPlatform.check_and_update_config(config)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert api_server.WORKER_LINE + "spawn (backend.cpu_start_method=fork_engine)" in capsys.readouterr().err
    at_fork[-1]["after_in_child"]()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    with pytest.raises(ValueError, match="HARNESS_CPU_START_METHOD must be one of fork, fork_engine, got 'spawn'"):
        api_server.fork_engine_processes("spawn")


def test_a_forked_worker_binds_itself_as_its_openmp_environment_would():
    """``bind_forked_worker`` in a real forked child, with a stand-in torch (its ``set_num_threads`` recorded):
    the child's CPU affinity becomes the one CPU given, torch's thread count 1, and the log says so."""
    import json
    import os
    import types
    cpu = min(os.sched_getaffinity(0))
    fake_torch = types.SimpleNamespace(threads=[], get_num_threads=lambda: fake_torch.threads[-1])
    fake_torch.set_num_threads = fake_torch.threads.append
    r, w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report, then leave at once (no pytest teardown in it)
        try:
            sys.stderr = open(err_w, "w", closefd=False)   # (pytest's capture object otherwise)
            sys.modules["torch"] = fake_torch
            from harness.vllm.api_server import bind_forked_worker
            bind_forked_worker([cpu])
            sys.stderr.flush()
            os.write(w, json.dumps([sorted(os.sched_getaffinity(0)), fake_torch.threads]).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(err_w)
    got = json.loads(os.read(r, 4096))
    log = os.read(err_r, 4096).decode()
    os.waitpid(pid, 0)
    os.close(r)
    os.close(err_r)
    assert got == [[cpu], [1]]
    from harness.vllm.api_server import BOUND_LINE
    assert f"{BOUND_LINE} [{cpu}] (torch threads 1)" in log


def test_every_engine_knob_has_a_vllm_flag_or_a_reason_it_has_none():
    from dataclasses import fields as dc_fields
    from harness.core.profiles import EngineConfig
    from harness.vllm.flags import ENGINE_NOT_ON_VLLM, VLLM_FLAGS
    assert {f.name for f in dc_fields(EngineConfig)} == set(VLLM_FLAGS) | set(ENGINE_NOT_ON_VLLM)


@pytest.mark.parametrize(("overrides", "needle"), [
    (["engine.activation_reserve_bytes=1e9"], "engine.activation_reserve_bytes"),
    (["backend.extra_args=[--max-num-seqs,4]"], "engine.max_num_seqs"),
    (["cluster=cpu_1p1d", "engine.max_num_batched_tokens=1024"], "engine.max_num_batched_tokens"),
    (["backend.port_base=99999"], "backend.port_base"),
    (["engine.block_size=16"], "engine.block_size"),
    (["backend.launch=false", "backend.endpoints=[127.0.0.1:8000]"], "backend.endpoints"),
])
def test_engine_values_vllm_cannot_honour_are_rejected_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        compose_run(["backend=vllm", "model=tiny", "slo=absolute", "cluster=cpu_1x", "engine.block_size=128",
                     *overrides])


def test_a_sim_key_is_not_a_vllm_key():
    with pytest.raises(Exception, match="max_coalesce_s"):
        compose_run(["backend=vllm", "model=tiny", "slo=absolute", "cluster=cpu_1x", "engine.block_size=128",
                     "backend.max_coalesce_s=1"])


# ---- layering -----------------------------------------------------------------------------------------

_PARSED: dict = {}   # (path, mtime_ns, size) -> its syntax tree


def parsed_source(p: Path) -> ast.Module:
    """``ast.parse`` of the file ``p``, once per process while the file is unchanged (its modification time and
    size): three tests here read the whole tree of ``harness/`` and ``baselines/`` (104 files, ~1.2 CPU s a parse
    of them all, measured 2026-12-06). Only read, never changed (shared between the tests)."""
    st = p.stat()
    key = (str(p), st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        _PARSED[key] = ast.parse(p.read_text())
    return _PARSED[key]


def internal_imports(root_dir: Path = PROJECT_ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``harness.*``, ``baselines.*``), from the source: every
    ``import`` / ``from ... import`` anywhere in the file (module level, inside functions and methods, inside
    ``if __name__ == "__main__":``, inside ``if TYPE_CHECKING:`` blocks), relative imports resolved. An
    annotation import is an edge like any other: a module that names another's type depends on it (a
    third-party backend could not type its ``open`` without importing what it names), and an import circle
    hidden behind ``TYPE_CHECKING`` is still a circle to a reader and to a type checker."""
    mods = {}
    for root in ("harness", "baselines"):
        for p in (root_dir / root).rglob("*.py"):
            rel = p.relative_to(root_dir).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            mods[name] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        deps = set()
        tree = parsed_source(p)
        package = name if p.name == "__init__.py" else name.rpartition(".")[0]
        stack = [tree]
        while stack:
            node = stack.pop()
            stack.extend(ast.iter_child_nodes(node))
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . import x / from ..y import z
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:   # ``import harness.sim.perf as x`` -> harness.sim.perf; a name -> its module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every back edge found by a depth-first search: each a path ``[a, b, ..., a]`` (empty: acyclic)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def layering_violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """``(module, imported module, rule)`` for each import against the stated layering rules."""
    backends = ("harness.sim", "harness.vllm", "harness.core.backend")
    bad = []
    for m, ds in graph.items():
        for d in ds:
            if m.startswith(("harness.vllm", "baselines")) and d.startswith("harness.sim"):
                bad.append((m, d, "harness.vllm / baselines import the simulator"))
            if m.startswith(backends) and d.startswith("baselines"):
                bad.append((m, d, "a backend imports a scheduler variant"))
            if m.startswith("harness.vllm") and d == "harness.run.config":
                bad.append((m, d, "the vLLM backend imports the config module"))
            # baselines import only the policy interface (with its helpers and the engine batch-rule
            # interface), the fluid model, the registry, each other and the top package (harness.LazyModule)
            if m.startswith("baselines") and d != "harness" and not d.startswith(("harness.core.policy", "harness.core.batching", "baselines.wait.fluid",
                                                               "harness.core.registry", "baselines")):
                bad.append((m, d, "baselines import only the policy interface, batch rules, fluid model, registry"))
    return sorted(bad)


def test_no_import_cycles_and_no_simulator_import_from_vllm_or_baselines():
    graph = internal_imports()
    assert not import_cycles(graph), import_cycles(graph)
    assert not layering_violations(graph), layering_violations(graph)


def test_the_import_graph_sees_function_level_main_block_and_relative_imports(tmp_path):
    """The checker itself: a planted cycle through a ``__main__`` block, a function-level import of the
    simulator from ``harness.vllm``, a relative import of ``baselines`` from a backend, and an
    ``if TYPE_CHECKING:`` import of the config module from the vLLM backend are each found; a circle closed only
    by an annotation import (``harness.c`` <-> ``harness.d``) is a circle."""
    (tmp_path / "harness" / "vllm").mkdir(parents=True)
    (tmp_path / "harness" / "sim").mkdir()
    (tmp_path / "baselines").mkdir()
    files = {
        "harness/__init__.py": "",
        "harness/a.py": "import os\nif __name__ == '__main__':\n    from harness.b import main\n",
        "harness/b.py": "from harness.a import x\n",
        "harness/c.py": "from harness.d import y\n",
        "harness/d.py": ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                         "if TYPE_CHECKING:\n    from harness.c import C\n"),
        "harness/sim/__init__.py": "",
        "harness/sim/engine.py": "",
        "harness/vllm/__init__.py": "",
        "harness/vllm/x.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.run.config import R\n"
                              "def f():\n    from harness.sim import engine\n    return engine\n"),
        "harness/vllm/y.py": "from ...baselines import w\n",
        "harness/run/config.py": "",
        "baselines/__init__.py": "",
        "baselines/w.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = internal_imports(tmp_path)
    assert graph["harness.vllm.x"] == {"harness.run.config", "harness.sim", "harness.sim.engine"}
    assert graph["harness.vllm.y"] == {"baselines", "baselines.w"}
    assert graph["harness.d"] == {"harness.c"}
    assert import_cycles(graph) == [["harness.a", "harness.b", "harness.a"], ["harness.c", "harness.d", "harness.c"]]
    assert layering_violations(graph) == [
        ("harness.vllm.x", "harness.run.config", "the vLLM backend imports the config module"),
        ("harness.vllm.x", "harness.sim", "harness.vllm / baselines import the simulator"),
        ("harness.vllm.x", "harness.sim.engine", "harness.vllm / baselines import the simulator"),
        ("harness.vllm.y", "baselines", "a backend imports a scheduler variant"),
        ("harness.vllm.y", "baselines.w", "a backend imports a scheduler variant")]


def test_the_controller_is_constructed_in_one_place():
    sites = []
    for p in [*(PROJECT_ROOT / "harness").rglob("*.py"), *(PROJECT_ROOT / "baselines").rglob("*.py"),
              PROJECT_ROOT / "run.py"]:
        for node in ast.walk(parsed_source(p)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Controller":
                sites.append(str(p.relative_to(PROJECT_ROOT)))
    assert sites == ["harness/run/session.py"], sites


# ---- the wings (harness/core, workload, analysis, run, tools; the backends sim, vllm; baselines) -----------

WING_ALLOWED = {
    "harness.core": ("harness.core",),
    "harness.workload": ("harness.core", "harness.workload"),
    "harness.sim": ("harness.core", "harness.workload", "harness.sim"),
    "harness.vllm": ("harness.core", "harness.workload", "harness.vllm"),
    "harness.analysis": ("harness.core", "harness.workload", "harness.analysis"),
    "baselines": ("harness.core.policy", "harness.core.batching", "harness.core.registry", "baselines"),
    "harness.run": ("harness.core", "harness.workload", "harness.analysis", "harness.sim", "harness.vllm",
                    "harness.run", "baselines"),
    "harness.tools": ("harness", "baselines"),
}
"""Wing -> the modules its modules may import (by prefix; the top package ``harness`` is open to all:
``harness.LazyModule``). Each wing imports only the wings before it: core <- workload <- backends (sim,
vllm) and analysis <- run <- tools; baselines see only the policy and batch-rule interfaces and the registry."""


def wing_of(module: str, packages: frozenset = frozenset()) -> str:
    """The wing a module belongs to: its longest prefix in ``WING_ALLOWED``; any other subpackage of
    ``harness`` (``harness.<name>`` in ``packages``, and its modules: a backend plug-in such as ``sim``,
    ``vllm`` or a new one) is a backend, ``"harness.<name>"``; ``""`` for the top package and for a module
    directly under ``harness/`` (which belongs in a wing)."""
    hits = [w for w in WING_ALLOWED if module == w or module.startswith(w + ".")]
    if hits:
        return max(hits, key=len)
    parts = module.split(".")
    top = ".".join(parts[:2])
    return top if parts[0] == "harness" and len(parts) >= 2 and (len(parts) >= 3 or top in packages) else ""


def wing_allowed(wing: str) -> tuple[str, ...]:
    """The import prefixes of ``wing`` (a backend not named in ``WING_ALLOWED``: the core, the workload, itself)."""
    return WING_ALLOWED.get(wing, ("harness.core", "harness.workload", wing))


def wing_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(module, imported module)`` for each import a module's wing does not allow (a module of no wing,
    other than the top package, is reported with itself)."""
    packages = frozenset(m.rpartition(".")[0] for m in graph if "." in m)
    bad = []
    for m, ds in graph.items():
        w = wing_of(m, packages)
        if not w:
            if m != "harness":
                bad.append((m, m))
            continue
        for d in ds:
            if d != "harness" and not any(d == p or d.startswith(p + ".") for p in wing_allowed(w)):
                bad.append((m, d))
    return sorted(bad)


def test_the_wings_import_only_downward(tmp_path):
    """Every module of ``harness/`` is in a wing, and each wing imports only what ``WING_ALLOWED`` says (a
    backend package not named there: the core, the workload and itself); the checker itself finds a planted
    upward import (core -> run), a new backend importing the run wing, and a module outside every wing."""
    graph = internal_imports()
    assert not wing_violations(graph), wing_violations(graph)
    planted = {"harness": set(), "harness.core.policy": {"harness.run.session", "harness"},
               "harness.run.session": {"harness.core.policy", "baselines.wait.fluid"}, "harness.stray": set(),
               "harness.fixed": set(), "harness.fixed.plugin": {"harness.core.backend", "harness.fixed",
                                                                "harness.run.session"}}
    assert wing_violations(planted) == [("harness.core.policy", "harness.run.session"),
                                        ("harness.fixed.plugin", "harness.run.session"),
                                        ("harness.stray", "harness.stray")]
