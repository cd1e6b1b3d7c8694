"""The suite's own xdist work units (tests/conftest.py ``SHARED_SERVER_UNITS``, ``FIRST_UNITS``,
``pytest_xdist_make_scheduler``): a test file is a unit, every test file that uses a shared real-server fixture is
in the one unit that starts it, the files importing vLLM into the test process are one unit, the long units are
handed out first, and a ``-n 2`` run really keeps a unit's tests on one worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (COMPOSE_UNIT, FIRST_UNITS, SHARED_SERVER_UNITS, VLLM_IN_PROCESS_UNIT, unit_order,
                            work_unit)

TESTS = Path(__file__).resolve().parent


def _users(fixture: str) -> set[str]:
    """Test files whose test functions take ``fixture`` as an argument (read from the source, not from the
    table)."""
    pat = re.compile(rf"^def test_\w+\([^)]*\b{fixture}\b", re.M)
    return {f"tests/{p.name}" for p in TESTS.glob("test_*.py") if pat.search(p.read_text())}


def test_every_user_of_the_session_p_d_pair_is_in_one_unit():
    users = _users("pd_pair") | _users("pd_servers")
    assert {"tests/test_twin.py", "tests/test_vllm_real.py"} <= users
    assert len({work_unit(f"{f}::test_x") for f in users}) == 1


def test_a_file_outside_the_table_is_a_unit_of_its_own_and_xdist_group_suffixes_are_dropped():
    assert work_unit("tests/test_pipeline.py::test_a[x]") == "tests/test_pipeline.py"
    assert work_unit("tests/test_pipeline.py::test_a[a@b]") == "tests/test_pipeline.py"
    assert work_unit("tests/test_pipeline.py::test_b") == work_unit("tests/test_pipeline.py::test_a[x]")
    assert work_unit("tests/test_trace.py::test_a") != work_unit("tests/test_pipeline.py::test_a")
    assert work_unit("tests/test_vllm_real.py::test_a@vllm") == SHARED_SERVER_UNITS["tests/test_vllm_real.py"]
    assert work_unit("tests/test_clusters.py::test_b[p]") != work_unit("tests/test_twin.py::test_c")


def test_the_files_composing_every_option_and_preset_are_one_unit():
    """test_config.py and test_presets.py share one worker's compose memo (tests/conftest.py ``COMPOSE_UNIT``)."""
    assert work_unit("tests/test_config.py::test_a[x]") == work_unit("tests/test_presets.py::test_b") == COMPOSE_UNIT
    assert COMPOSE_UNIT in FIRST_UNITS


def test_the_listed_long_units_go_first_in_their_order_then_the_most_tests():
    """By hand: two listed units (collected in the opposite order) first in FIRST_UNITS' order, then a 3-test unit
    before two 1-test units, which keep their collection order; a listed unit not collected is left out."""
    tiny, cli = "tests/test_tiny_model_build.py", "tests/test_cli_contract.py"
    assert FIRST_UNITS.index(tiny) < FIRST_UNITS.index(cli)
    units = {"tests/test_a.py": {"a1": False}, cli: {"c": False}, "tests/test_b.py": {"b1": False, "b2": False,
             "b3": False}, tiny: {"t": False}, "tests/test_c.py": {"c1": False}}
    assert unit_order(units) == [tiny, cli, "tests/test_b.py", "tests/test_a.py", "tests/test_c.py"]


def test_a_two_worker_run_keeps_a_unit_on_one_worker():
    pytest.importorskip("xdist")
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider",
                        "tests/test_clusters.py", "-k", "launcher_keys_are_validated or pack_fills"],
                       cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    workers = re.findall(r"^\[(gw\d)\] .*PASSED tests/test_clusters\.py", r.stdout, re.M)
    assert len(workers) == 12, r.stdout[-2000:]   # 11 key cases + the placement test
    assert len(set(workers)) == 1, workers


# test files that name vLLM or torch in an import but do not import them into the test process (why)
VLLM_ELSEWHERE = {"tests/test_tiny_model_build.py": "torch is imported by its builds' parent process"}


def test_every_file_importing_vllm_in_the_test_process_is_in_one_unit():
    """A file whose tests import vLLM or torch (an import statement or ``pytest.importorskip``) is in the unit of
    VLLM_IN_PROCESS_UNIT, so one worker pays that import (a new such file would otherwise quietly add one)."""
    pat = re.compile(r"^\s*(from (vllm|torch)\b|import (vllm|torch)\b)|importorskip\([\"'](vllm|torch)\b", re.M)
    files = {f"tests/{p.name}" for p in TESTS.glob("test_*.py") if pat.search(p.read_text())}
    importing = files - set(VLLM_ELSEWHERE) - {f for f, u in SHARED_SERVER_UNITS.items() if u != VLLM_IN_PROCESS_UNIT}
    assert importing == {f for f, u in SHARED_SERVER_UNITS.items() if u == VLLM_IN_PROCESS_UNIT}
    assert {"tests/test_export.py", "tests/test_kv_connector.py", "tests/test_step_times_scheduler.py"} <= importing
    assert set(VLLM_ELSEWHERE) <= files


def test_every_listed_long_unit_is_a_test_file_or_a_shared_unit():
    """A renamed file would silently lose its place at the front: each FIRST_UNITS entry names a unit that exists."""
    for unit in FIRST_UNITS:
        assert unit in SHARED_SERVER_UNITS.values() or (TESTS.parent / unit).is_file(), unit
    assert len(set(FIRST_UNITS)) == len(FIRST_UNITS)
