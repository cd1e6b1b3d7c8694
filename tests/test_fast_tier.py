"""The fast test tier (README.md: ``python -m pytest -n 2 -m "not real_server"``): every test that takes a fixture
starting real servers (``vllm serve``, a local Ray cluster, Slurm) is marked ``real_server``, and the marker is
registered (pyproject.toml), so ``-m "not real_server"`` never starts one. Read from the sources (``ast``), not
from a collection."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# the fixtures that start real servers: the session's P/D pair and its users (tests/conftest.py, test_vllm_real.py),
# test_vllm_real.py's collocated server, test_calibrate_real.py's server, test_clusters.py's Ray and Slurm clusters
SERVER_FIXTURES = {"pd_pair": "*", "pd_servers": "*", "collocated_server": "*", "ray_cluster": "*", "slurm": "*",
                   "server": "tests/test_calibrate_real.py"}


def _marked(node: ast.AST) -> bool:
    """Whether a decorator or assignment names ``pytest.mark.real_server``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "real_server" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def test_every_test_using_a_server_fixture_is_marked_real_server():
    unmarked = []
    for path in sorted(TESTS.glob("test_*.py")):
        rel = f"tests/{path.name}"
        tree = ast.parse(path.read_text())
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and _marked(n.value) for n in tree.body)
        for fn in tree.body:
            if not (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name.startswith("test_")):
                continue
            args = {a.arg for a in fn.args.args}
            uses = {f for f, where in SERVER_FIXTURES.items() if f in args and where in ("*", rel)}
            if uses and not module_marked and not any(_marked(d) for d in fn.decorator_list):
                unmarked.append(f"{rel}::{fn.name} ({', '.join(sorted(uses))})")
    assert not unmarked, unmarked


def test_the_marker_is_registered():
    cfg = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("real_server:") for m in cfg["markers"])


def test_the_guard_sees_an_unmarked_user():
    """The check itself: an unmarked function taking ``pd_pair`` is found, a marked one is not."""
    src = ("import pytest\n\ndef test_a(pd_pair):\n    pass\n\n@pytest.mark.real_server\ndef test_b(pd_pair):\n"
           "    pass\n")
    tree = ast.parse(src)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [any(_marked(d) for d in f.decorator_list) for f in fns] == [False, True]
