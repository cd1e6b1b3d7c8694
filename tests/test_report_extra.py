"""``python -m harness.analysis.report`` without the ``[report]`` extra: one error line naming the missing module
and ``pip install -e '.[report]'``, exit 2, nothing written; ``--no-figures`` works without matplotlib/seaborn.

A missing module is simulated in a subprocess by ``sys.modules[name] = None`` (the import system then raises
``ModuleNotFoundError`` for it and everything below it, as for a module never installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.core.paths import PROJECT_ROOT
from harness.run.runner import execute
from tests.conftest import compose_run
from tests.test_pipeline import SMALL  # noqa: F401  (also registers backend=fake)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two seeds of one point (so the report computes a Student-t interval over them)."""
    root = tmp_path_factory.mktemp("sweep")
    for seed in (1, 2):
        execute(compose_run(SMALL + ["scheduler=collocated", "cluster=a40_4x", "slo=absolute", "backend=fake",
                                     "backend.step_s=0.01", f"workload.seed={seed}"]), root / f"{seed}_collocated")
    return root


def _report_without(modules, *args):
    code = ("import sys\n"
            f"for m in {list(modules)!r}:\n    sys.modules[m] = None\n"
            "from harness.analysis.report import main\n"
            f"sys.exit(main({[str(a) for a in args]!r}))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)


def test_no_figures_needs_no_matplotlib_or_seaborn(sweep, tmp_path):
    out = tmp_path / "rep"
    r = _report_without(["matplotlib", "seaborn"], sweep, "--no-figures", "--out", out)
    assert r.returncode == 0, r.stderr
    assert (out / "report.md").is_file() and (out / "points.csv").is_file() and not (out / "figures").exists()


@pytest.mark.parametrize("blocked,args,named", [
    (["matplotlib"], [], "matplotlib"),            # figures asked for (the default)
    (["seaborn"], [], "seaborn"),
    (["scipy"], ["--no-figures"], "scipy"),        # the intervals over seeds need scipy's t quantile
])
def test_a_missing_module_of_the_extra_is_one_line_and_exit_2(sweep, tmp_path, blocked, args, named):
    out = tmp_path / "rep"
    r = _report_without(blocked, sweep, *args, "--out", out)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert named in lines[0] and "pip install -e '.[report]'" in lines[0]
    assert not out.exists()                        # refused before anything is written
