"""``python run.py`` composes its config once for a single run (``harness.cli._one_compose``) and must give
exactly what Hydra's own flow (which composes twice: once only to read ``hydra.mode``) gives: the same
``.hydra/hydra.yaml`` and ``.hydra/config.yaml``, a config that sets ``hydra.mode=MULTIRUN`` still sweeping,
and the same error for a sweep override without ``-m``. Hydra's own flow is what a command line with any
flag takes (here ``--config-name=config``, the default config named explicitly), so each case runs both
ways in a subprocess, as a user does, on a few conversations of the shipped trace."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from harness.cli import _one_compose_applies
from harness.config import PROJECT_ROOT

TINY = ["workload.num_conversations=3", "workload.max_turns=2", "logger.progress=false", "slo=absolute"]


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def _hydra_yaml(run_dir, own_dir):
    """``.hydra/hydra.yaml`` without what names the run's own directory or the moment it ran."""
    h = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    h["overrides"]["hydra"] = [o for o in h["overrides"]["hydra"] if not o.startswith("hydra.run.dir=")]
    for k in ("output_dir", "cwd"):
        h["runtime"].pop(k, None)
    h["run"].pop("dir", None)
    assert own_dir.name not in yaml.safe_dump(h)
    return h


def test_which_command_lines_take_the_single_compose():
    assert _one_compose_applies([]) and _one_compose_applies(["scheduler=ampd", "hydra.run.dir=x"])
    for flagged in (["-m", "scheduler=ampd"], ["--multirun"], ["--cfg", "job"], ["--help"], ["-cn", "config"],
                    ["--config-name=config"], ["--config-dir", "x"], ["--info"]):
        assert not _one_compose_applies(flagged), flagged


def test_a_single_run_gets_the_config_hydras_own_flow_gives(tmp_path):
    one, own = tmp_path / "single_compose_run", tmp_path / "hydra_flow_run"
    r1 = run_cli(*TINY, f"hydra.run.dir={one}")
    r2 = run_cli("--config-name=config", *TINY, f"hydra.run.dir={own}")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr[-2000:], r2.stderr[-2000:])
    h1, h2 = _hydra_yaml(one, one), _hydra_yaml(own, own)
    assert h1 == h2
    # Hydra 1.3's _run_app: no -m and no hydra.mode in the config -> hydra.mode=RUN, appended as an override
    assert h1["mode"] == "RUN" and h1["overrides"]["hydra"][-1] == "hydra.mode=RUN"
    assert (one / ".hydra" / "config.yaml").read_text() == (own / ".hydra" / "config.yaml").read_text()
    assert (one / "config.yaml").read_text() == (own / "config.yaml").read_text()


def test_a_config_that_sets_multirun_still_sweeps_without_dash_m(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(*TINY, "hydra.mode=MULTIRUN", "scheduler=collocated,conserve", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.parent.name for p in sweep.glob("*/summary.json")) == ["0_collocated", "1_conserve"]


def test_a_sweep_override_without_dash_m_is_refused_as_hydra_refuses_it(tmp_path):
    args = [*TINY, "scheduler=collocated,conserve"]
    r1 = run_cli(*args, f"hydra.run.dir={tmp_path / 'one'}")
    r2 = run_cli("--config-name=config", *args, f"hydra.run.dir={tmp_path / 'own'}")
    assert r1.returncode == r2.returncode == 1
    assert "Ambiguous value for argument 'scheduler=collocated,conserve'" in r1.stderr
    assert r1.stderr == r2.stderr
    assert not (tmp_path / "one").exists()
