"""The installable package (issue 24, item 4): the wheel built from this checkout, installed in a fresh virtual
environment outside the checkout, runs the main job with its console script ``agentic-harness`` and prints
the main job's table as README.md shows it (README.md shows the rows of ``harness.analysis.catalog.README_TABLE``,
a stated subset of the printed table; each must be printed as shown, every row but the wall time), with
Hydra finding ``conf/`` through ``pkg://harness.conf`` and the default trace shipped as package data.

The venv gets its dependencies (hydra, numpy, pandas, pyarrow ...) from the environment the suite runs in, not
from whatever the base interpreter holds: after the wheel is installed (``--no-deps --no-index``: no network),
a ``.pth`` file in the venv's site-packages names this environment's site directories (:func:`_site_dirs`).
Python appends a ``.pth`` file's directories *after* the venv's own site-packages and does not run the ``.pth``
files inside them, so neither this environment's editable install of the harness (an import hook started by
its ``.pth``) nor the checkout can shadow the wheel; what is imported is checked to be the wheel's copy
(``harness.__file__`` under the venv). The build backend (``setuptools>=77``, the ``[test]`` extra) is this
environment's too (``--no-build-isolation``).
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from harness.core.paths import PROJECT_ROOT

# what a source copy leaves out (build outputs, results, caches)
IGNORE = shutil.ignore_patterns(".git", "results", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".venv", "outputs", "multirun")


def readme_main_table() -> list[str]:
    """The rows of the main job's table in README.md (the fenced block holding ``| metric | conserve |``)."""
    text = (PROJECT_ROOT / "README.md").read_text()
    at = text.find("\n| metric | conserve |\n")
    if at < 0:
        pytest.fail("README.md has no main-job table (a '| metric | conserve |' line)")
    start, end = text.rfind("```", 0, at), text.find("```", at)
    lines = text[start:end].splitlines()[1:]
    assert lines[0].startswith("conserve on a40_1p3d (sim)"), lines[:2]
    return [ln for ln in lines if ln.startswith("|")]


def table_rows(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith("|")]


def _clean_env() -> dict:
    """This process's environment without what would put the checkout (or another venv) on ``sys.path``."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _site_dirs() -> list[str]:
    """This environment's site directories (its venv's, plus the base's or the user's where this environment
    reads them), in ``sys.path`` order: where the harness's dependencies are installed. Never the checkout
    (pytest's ``pythonpath``) nor the standard library (the venv has its own)."""
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    ordered = [p for p in sys.path if p in dirs] + sorted(dirs - set(sys.path))
    return [p for p in dict.fromkeys(ordered) if Path(p).is_dir()]


def test_the_wheel_installed_outside_the_checkout_runs_the_main_job(tmp_path):
    pytest.importorskip("setuptools", minversion="77")   # the build backend (PEP 639 license string), offline
    src = tmp_path / "src"
    shutil.copytree(PROJECT_ROOT, src, ignore=IGNORE)    # build from a copy: the checkout gets no build files
    wheels = tmp_path / "wheels"
    env = _clean_env()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, env=env, cwd=tmp_path, timeout=300)
    (wheel,) = wheels.glob("agentic_serving_harness-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in ("harness/run/cli.py", "baselines/wait/wait.py", "harness/conf/__init__.py", "harness/conf/config.yaml",
                 "harness/conf/cluster/a40_1p3d.yaml", "harness/traces/swebench_verified_mini_gemini3pro.jsonl.gz",
                 "harness/traces/tokenizer/qwen2.5/vocab.json"):
        assert need in names, need
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "Name: agentic-serving-harness" in meta and "License-Expression: MIT" in meta
    for extra in ("vllm", "test"):   # harness.vllm.scrape imports it: declared where it is needed
        assert f'Requires-Dist: prometheus_client>=0.18; extra == "{extra}"' in meta, extra

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # this environment's pip installs into the venv (``--python``: it runs under the venv's interpreter, which
    # sees no other installed package yet, so no "already satisfied" by this environment's editable install)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, env=env, timeout=300)
    (purelib,) = venv.glob("lib/python*/site-packages")
    (purelib / "_suite_env.pth").write_text("".join(f"{d}\n" for d in _site_dirs()))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run([str(py), "-c", "import harness, baselines; print(harness.__file__); print(baselines.__file__)"],
                           cwd=outside, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in where), where   # the wheel's copy
    dep = subprocess.run([str(py), "-c", "import hydra; print(hydra.__file__)"], cwd=outside, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    import hydra
    assert Path(dep).resolve() == Path(hydra.__file__).resolve(), dep             # this environment's Hydra
    tok = subprocess.run([str(py), "-c", "from harness.workload.convert import DEFAULT_TOKENIZER_DIR as d; print(d)"],
                         cwd=outside, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(tok).resolve().is_relative_to(venv.resolve()) and (Path(tok) / "vocab.json").is_file(), tok

    env["HARNESS_CACHE_DIR"] = str(tmp_path / "cache")
    r = subprocess.run([str(venv / "bin" / "agentic-harness"), "logger.progress=false",
                        f"hydra.run.dir={outside / 'run'}"], cwd=outside, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    first = next(ln for ln in r.stdout.splitlines() if ln.startswith("conserve on "))
    assert first.startswith("conserve on a40_1p3d (sim), swebench_verified_mini_gemini3pro.jsonl.gz @ 0.05 conv/s")
    want = [ln for ln in readme_main_table() if not ln.startswith("| run wall")]
    assert readme_rows_follow_the_catalogue(want[2:])   # (after the header and its rule)
    printed = {ln.split(" | ")[0]: ln for ln in table_rows(r.stdout)}
    assert [printed.get(ln.split(" | ")[0]) for ln in want] == want
    assert "run VALID" in r.stdout
    assert (outside / "run" / "summary.json").is_file() and (outside / "run" / "turns.parquet").is_file()
    assert not list(venv.glob("lib/python*/site-packages/results"))   # nothing written into the install


def readme_rows_follow_the_catalogue(rows: list[str]) -> bool:
    """README.md's main-job table shows the rows of ``harness.analysis.catalog.README_TABLE`` (a stated subset
    of the printed ``TABLE``), in that order, under the catalogue's labels: the expected labels are generated
    from the catalogue, so a metric added to ``TABLE`` needs no README edit, and a README row the catalogue
    does not name (or names in another order) fails."""
    from harness.analysis.catalog import BY_KEY, README_TABLE, TABLE
    assert set(README_TABLE) <= set(TABLE)
    assert [k for k in TABLE if k in README_TABLE] == list(README_TABLE), "README_TABLE is not in TABLE order"
    labels = [ln.split(" | ")[0].removeprefix("| ") for ln in rows]
    expected = [BY_KEY[k].label for k in README_TABLE if k != "sim_wall_s"]
    assert labels == expected, f"README.md's main-job rows {labels} != the catalogue's README_TABLE {expected}"
    return True


def test_the_readme_main_table_shows_the_catalogues_stated_subset():
    """Without building a wheel: README.md's main-job rows are README_TABLE's labels, in order, wall time last."""
    rows = readme_main_table()
    assert rows[0] == "| metric | conserve |" and rows[-1].startswith("| run wall (s) |")
    assert readme_rows_follow_the_catalogue([ln for ln in rows[2:] if not ln.startswith("| run wall")])


def test_a_missing_config_directory_is_named():
    """Neither a checkout's ``conf/`` nor the wheel's ``harness/conf``: the error names both places."""
    from unittest import mock

    from harness.run import cli
    with mock.patch.object(cli, "PROJECT_ROOT", Path("/nonexistent/checkout")), \
            mock.patch.object(cli, "PACKAGE_DIR", Path("/nonexistent/site-packages/harness")):
        with pytest.raises(FileNotFoundError, match=r"/nonexistent/checkout/conf .*/nonexistent/site-packages/harness/conf"):
            cli.config_path()


def test_help_lists_the_groups_without_the_generated_experiment_cells():
    """``--help`` names every group and its options, but the generated ``experiment/{arm,cell,wait_point}``
    sub-groups only by their count (hundreds of names were two thirds of the text)."""
    from harness.core.schedulers import registered
    r = subprocess.run([sys.executable, "run.py", "--help"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert r.returncode == 0, r.stderr
    conf = PROJECT_ROOT / "conf"
    words = set(re.findall(r"[\w.]+", r.stdout))
    for sub in ("arm", "cell", "wait_point"):
        stems = sorted(p.stem for p in (conf / "experiment" / sub).glob("*.yaml"))
        assert f"experiment/{sub}: {len(stems)} generated options" in r.stdout
        leaked = [s for s in stems if s in words and s not in registered()]   # an arm may be named as a variant
        assert not leaked, (sub, leaked)
    assert f"scheduler: {', '.join(registered())}" in r.stdout
    assert "cluster: " in r.stdout and "a40_1p3d" in r.stdout and "workload: " in r.stdout
    assert len(r.stdout) < 4000, len(r.stdout)
