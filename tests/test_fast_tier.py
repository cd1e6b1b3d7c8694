"""The fast test tier (README.md): every test that takes a fixture starting real servers (``vllm serve``, a local Ray
cluster, Slurm) is marked ``real_server``, and the marker is registered (pyproject.toml), so ``-m "not real_server"``
never starts one; the ``slow`` table (tests/conftest.py ``SLOW``) names existing tests, each with its cost; the
suite's signal guard puts back the handlers a test leaves changed. Read from the sources (``ast``), not from a
collection."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# the fixtures that start real servers: the session's P/D pair and its users (tests/conftest.py, test_vllm_real.py),
# test_vllm_real.py's collocated server, test_calibrate_real.py's server, test_clusters.py's Ray and Slurm clusters,
# the session's vLLM zygote (tests/conftest.py: it imports vLLM and forks the servers) and its users
SERVER_FIXTURES = {"pd_pair": "*", "pd_servers": "*", "collocated_server": "*", "ray_cluster": "*", "slurm": "*",
                   "server": "tests/test_calibrate_real.py", "vllm_zygote": "*", "zygote_env": "*"}


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


def test_every_slow_entry_names_a_test_of_its_file_with_its_cost():
    """tests/conftest.py's ``SLOW`` table (the tests the fast tier leaves out): each key names a test
    function that exists in its file (a renamed test would silently come back into the fast tier), each with a
    positive cost and a reason; the ``slow`` marker is registered."""
    from tests.conftest import SLOW
    assert SLOW
    for key, (cost_s, why) in SLOW.items():
        path, _, name = key.partition("::")
        assert (TESTS.parent / path).is_file(), key
        tree = ast.parse((TESTS.parent / path).read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert not name or name.split("[", 1)[0] in names, key
        assert cost_s > 0 and why, key
    cfg = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in cfg["markers"])


def test_slow_marks_a_whole_test_or_one_parametrization():
    """By hand: a key without ``[...]`` marks every parametrization, one with it only that one, a file every test
    of it."""
    from tests import conftest
    table = {"tests/a.py::test_x": (1.0, "x"), "tests/a.py::test_y[p1]": (2.0, "y"), "tests/c.py": (3.0, "z")}
    old = dict(conftest.SLOW)
    try:
        conftest.SLOW.clear()
        conftest.SLOW.update(table)
        assert conftest.slow_cost("tests/a.py::test_x[q]") == (1.0, "x")
        assert conftest.slow_cost("tests/a.py::test_x") == (1.0, "x")
        assert conftest.slow_cost("tests/a.py::test_y[p1]") == (2.0, "y")
        assert conftest.slow_cost("tests/a.py::test_y[p2]") is None
        assert conftest.slow_cost("tests/b.py::test_x") is None
        assert conftest.slow_cost("tests/c.py::test_any[p]") == (3.0, "z")
    finally:
        conftest.SLOW.clear()
        conftest.SLOW.update(old)


def test_signal_handlers_a_test_changes_are_restored_and_the_test_named():
    """tests/conftest.py's ``pytest_runtest_protocol`` wrapper, driven by hand: a "test" that leaves SIGINT ignored
    (what a pool initializer does in its worker) and SIGTERM handled gets both put back after it, with a warning
    naming it; at the OS level too (``SigIgn``: an ignored SIGINT is what processes started later inherit). A test
    that changes nothing is not named."""
    import signal
    import types
    import warnings
    from tests import conftest
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os_before = conftest._ignored_by_os()
    ignoring = before[signal.SIGINT] is not signal.SIG_IGN   # (a suite started in the background ignores it)
    item = types.SimpleNamespace(nodeid="tests/x.py::test_leaves_sigint_ignored")
    wrapper = conftest.pytest_runtest_protocol(item, None)
    next(wrapper)
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignoring else signal.SIG_DFL)
    signal.signal(signal.SIGTERM, lambda *a: None)
    if Path("/proc/self/status").exists():
        assert ("SIGINT" in conftest._ignored_by_os()) == ignoring
    with pytest.warns(RuntimeWarning, match=r"tests/x\.py::test_leaves_sigint_ignored left its signal handlers "
                                            r"changed \(SIGINT, SIGTERM\); restored"):
        try:
            wrapper.send(None)
        except StopIteration:
            pass
    assert {s: signal.getsignal(s) for s in before} == before
    assert conftest._ignored_by_os() == os_before
    # a SIGINT left blocked (inherited by every process started later, as an ignored one is) is named and unblocked
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if signal.SIGINT not in blocked:
        wrapper = conftest.pytest_runtest_protocol(item, None)
        next(wrapper)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        with pytest.warns(RuntimeWarning, match=r"changed \(SIGINT blocked\); restored"):
            try:
                wrapper.send(None)
            except StopIteration:
                pass
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == blocked
    quiet = conftest.pytest_runtest_protocol(item, None)
    next(quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            quiet.send(None)
        except StopIteration:
            pass
