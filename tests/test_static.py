"""Every module of the project compiles and names nothing it never defined: pyflakes (a static checker that
does not import the code) over ``harness/``, ``baselines/``, ``tests/``, ``scripts/``, ``benchmarks/`` and
``run.py``, failing on an undefined name, an undefined local or an undefined ``__all__`` export -- the class of
error that otherwise surfaces only when the line runs (a check left behind in the wrong test after a merge
raised ``NameError`` only in CI). Style messages (unused imports and the like) are not checked here."""

from __future__ import annotations

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api", reason="pyflakes is in the [test] extra")
from pyflakes import messages  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["harness", "baselines", "tests", "scripts", "benchmarks", "run.py"]
ERRORS = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    """A pyflakes reporter that keeps what it is told (pyflakes.reporter.Reporter's three methods)."""

    def __init__(self):
        self.found: list[str] = []

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def flake(self, message):
        if isinstance(message, ERRORS):
            self.found.append(str(message))


def test_no_module_uses_a_name_it_never_defined():
    rep = _Collect()
    pyflakes_api.checkRecursive([str(ROOT / p) for p in PATHS], rep)
    assert not rep.found, "\n".join(rep.found)


def test_the_check_finds_an_undefined_name(tmp_path):
    """The check itself can fail: the NameError CI met (``r`` used in a test that never assigned it)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def test_x():\n    rows = [1]\n    assert 'run VALID' in r.stdout\n")
    rep = _Collect()
    pyflakes_api.checkRecursive([str(bad)], rep)
    assert len(rep.found) == 1 and "undefined name 'r'" in rep.found[0]
