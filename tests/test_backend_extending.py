"""A backend written from docs/extending.md ("A backend") alone: it is registered, validated and run on a
small workload without the simulator, and a bad or missing key of its own fails at validation
(``harness.run.config.resolve``), naming the key, before anything is opened -- never at run time.

The scratch backend uses only what the recipe names: a config dataclass deriving from
``harness.core.backend.BackendConfig`` with a ``validate(inp)`` hook, an ``open(inp, cfg, run_dir, *,
conversations)`` context manager registered with ``register_backend``, and a cluster deriving from
``harness.core.backend.ClusterBase`` that defines only the required members (``infos``, ``clock``,
``start_turn``, ``observe``, ``drive``); every optional hook is ClusterBase's default. Its ``validate`` and
``open`` are typed with ``harness.core.backend.SessionInput``, and a backend module written the same way, imported
in a fresh interpreter, types its ``open`` without loading anything of ``harness.run``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.backend import (BackendConfig, ClusterBase, InstanceInfo, InstanceState, SessionInput, backends,
                                   register_backend)
from harness.core.clock import Priority, SimClock
from harness.run.config import ConfigError
from harness.run.runner import execute
from harness.sim.backend import SimBackend
from tests.conftest import compose_run

STEP_S = 0.02
"""The scratch backend's time per output token, s (a power of two over 100 keeps the sums exact enough)."""
RUN = ["workload.num_conversations=4", "workload.max_turns=3", "workload.rate_per_s=1.0", "logger.progress=false",
       "scheduler=collocated", "cluster=a40_4x", "slo=absolute"]


@dataclass
class ScratchConfig(BackendConfig):
    """``backend=scratch``: every output token takes ``step_s`` s on a virtual clock; ``capacity_tokens`` of KV."""

    name: str = "scratch"
    step_s: float = STEP_S
    capacity_tokens: int = 1 << 20

    def validate(self, inp: SessionInput) -> None:
        if not (isinstance(self.step_s, (int, float)) and self.step_s > 0):
            raise ValueError(f"backend.step_s must be > 0 (s), got {self.step_s!r}")
        if not inp.instances:
            raise ValueError("cluster.instances: the scratch backend needs at least one instance")


@dataclass
class ScratchNeedsKeyConfig(BackendConfig):
    """``backend=scratch_needs_key``: ``step_s`` has no default, so a run must set it."""

    step_s: float
    name: str = "scratch_needs_key"
    capacity_tokens: int = 1 << 20


class ScratchCluster(ClusterBase):
    """The required members only; the first token comes one step after the start, then one per step."""

    def __init__(self, inp: SessionInput, cfg: ScratchConfig):
        self.clock = SimClock()
        self.step_s = cfg.step_s
        self.infos = tuple(InstanceInfo(i, n, r, hw.name, cfg.capacity_tokens)
                           for i, (n, r, hw) in enumerate(inp.instances))
        self.running = [0] * len(self.infos)

    def start_turn(self, job) -> None:
        job.start_s = now = self.clock.now()
        d = job.placement.decode_instance
        self.running[d] += 1

        def first():
            job.prefill_done_s = job.first_token_s = self.clock.now()
            job.on_prefill_done(job)

        def finish():
            self.running[d] -= 1
            job.finish_s = self.clock.now()
            job.itl_s = [self.step_s] * (job.output_tokens - 1)
            job.on_finish(job)

        self.clock.call_at(now + self.step_s, first, priority=Priority.ENGINE)
        self.clock.call_at(now + self.step_s * job.output_tokens, finish, priority=Priority.ENGINE)

    def observe(self):
        return tuple(InstanceState(0, r, 0, math.nan) for r in self.running)

    def drive(self, start, done, on_tick, tick_s):
        start()
        self.clock.run()
        return "" if done() else "scratch cluster stalled"


opened: list = []   # what each open() was handed: (type of inp, type of cfg)

if "scratch" not in backends():
    @register_backend("scratch", ScratchConfig)
    @contextlib.contextmanager
    def open_scratch(inp: SessionInput, cfg: ScratchConfig, run_dir=None, *, conversations=()):
        opened.append((type(inp).__name__, type(cfg).__name__))
        yield ScratchCluster(inp, cfg)

    @register_backend("scratch_needs_key", ScratchNeedsKeyConfig)
    @contextlib.contextmanager
    def open_needs_key(inp, cfg, run_dir=None, *, conversations=()):
        opened.append((type(inp).__name__, type(cfg).__name__))
        yield ScratchCluster(inp, cfg)


def test_scratch_backend_runs_without_the_simulator(tmp_path, monkeypatch):
    """Registered, validated and run: every turn's TTFT is one step and its TPOT one step (by construction of
    the backend, not read back from it), and no simulated engine ran a turn."""
    def no_sim(self, job):
        raise AssertionError("the simulator ran a turn of a backend=scratch run")
    monkeypatch.setattr(SimBackend, "start_turn", no_sim)
    opened.clear()
    run = compose_run(RUN + ["backend=scratch"])
    summary = execute(run, tmp_path / "run")
    assert opened == [("SessionInput", "ScratchConfig")]
    assert summary["backend"] == "scratch" and summary["partial"] is False, summary["error"]
    assert summary["ttft_p50_s"] == pytest.approx(STEP_S) and summary["ttft_p99_s"] == pytest.approx(STEP_S)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["backend"] == "scratch"


def test_scratch_backend_bad_key_fails_at_validation_naming_it(monkeypatch):
    """``backend.step_s=0`` is refused by the backend's own ``validate``, inside ``resolve``: nothing opened."""
    opened.clear()
    with pytest.raises(ConfigError, match=r"backend\.step_s must be > 0"):
        compose_run(RUN + ["backend=scratch", "backend.step_s=0"])
    assert opened == []


def test_scratch_backend_missing_key_fails_at_validation_naming_it(tmp_path):
    """A key of the backend's config without a default, left unset: refused when the config is resolved, naming
    ``backend.step_s``; set, the same backend runs."""
    opened.clear()
    with pytest.raises(ConfigError, match=r"backend\.step_s"):
        compose_run(RUN + ["backend=scratch_needs_key"])
    assert opened == []
    summary = execute(compose_run(RUN + ["backend=scratch_needs_key", f"backend.step_s={STEP_S}"]), tmp_path / "run")
    assert summary["partial"] is False and summary["ttft_p50_s"] == pytest.approx(STEP_S)


OUT_OF_TREE = textwrap.dedent('''
    """A backend in another package, typed as docs/extending.md says: the core interface only."""
    from __future__ import annotations

    import contextlib
    from dataclasses import dataclass
    from typing import Iterator

    from harness.core.backend import BackendConfig, ClusterBase, SessionInput, register_backend


    @dataclass
    class OutOfTreeConfig(BackendConfig):
        """``backend=out_of_tree``: step_s, s."""

        name: str = "out_of_tree"
        step_s: float = 0.02

        def validate(self, inp: SessionInput) -> None:
            if not inp.instances:
                raise ValueError("cluster.instances: empty")


    @register_backend("out_of_tree", OutOfTreeConfig)
    @contextlib.contextmanager
    def open_out_of_tree(inp: SessionInput, cfg: OutOfTreeConfig, run_dir=None, *,
                         conversations=()) -> Iterator[ClusterBase]:
        yield ClusterBase()
''')


def test_a_backend_types_its_open_without_importing_the_run_layer(tmp_path):
    """A backend module written from docs/extending.md, in its own package and imported in a fresh interpreter:
    its ``open``'s and ``validate``'s annotations resolve (``typing.get_type_hints``) to
    ``harness.core.backend.SessionInput``, and no module of ``harness.run`` (the config module, the session, the
    runner) was loaded to get there."""
    pkg = tmp_path / "oot_backend"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(OUT_OF_TREE)
    probe = textwrap.dedent("""
        import json, sys, typing
        import oot_backend.plugin as p
        from harness.core.backend import SessionInput
        hints = typing.get_type_hints(p.open_out_of_tree.__wrapped__)
        vhints = typing.get_type_hints(p.OutOfTreeConfig.validate)
        print(json.dumps({"open_inp": hints["inp"] is SessionInput, "validate_inp": vhints["inp"] is SessionInput,
                          "run_layer": sorted(m for m in sys.modules if m == "harness.run" or m.startswith("harness.run."))}))
    """)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"open_inp": True, "validate_inp": True, "run_layer": []}, got
