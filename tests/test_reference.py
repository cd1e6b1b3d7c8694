"""The generated reference (docs/reference/, ``python -m harness.tools.reference``): the shipped pages are the
generator's output; every config key of every group (the run config's dataclasses, every registered scheduler and
backend) has a row with a description from its dataclass's docstring; every metric the main job prints has a
catalogue definition with its unit and a source that exists (the function importable, the docs page present)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass

import pytest

from harness.analysis.catalog import BY_KEY, TABLE
from harness.core.backend import backends
from harness.core.paths import PROJECT_ROOT
from harness.core.schedulers import get_spec, registered
from harness.run.config import RunConfig
from harness.tools import reference

REF = PROJECT_ROOT / "docs" / "reference"


@pytest.mark.parametrize("name", reference.PAGES)
def test_the_shipped_reference_is_current(name):
    assert (REF / f"{name}.md").read_text() == reference.page(name), \
        f"docs/reference/{name}.md is stale: run python -m harness.tools.reference"


def _keys(cls, prefix=""):
    """Every key of a config dataclass, written out here (not by the generator): nested dataclasses flattened."""
    out = []
    for f in dataclasses.fields(cls):
        d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out += _keys(type(d), f"{prefix}{f.name}.") if dataclasses.is_dataclass(d) else [prefix + f.name]
    return out


def _rows(text: str) -> dict[str, str]:
    """``key -> description`` of the key tables of one section of config.md."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| `([^`]+)` \| `[^`]*` \| `[^`]*` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def _section(text: str, head: str) -> str:
    start = text.index(f"\n{head}\n")
    nxt = re.search(r"\n#{2,3} ", text[start + len(head) + 2:])
    return text[start: start + len(head) + 2 + nxt.start()] if nxt else text[start:]


def test_every_config_key_has_a_described_entry():
    """Each group of RunConfig is a section; each key of its dataclass (per registered scheduler and backend for
    those two groups, per profile for hardware) a row with a non-empty description. Registered with the suite's
    scratch backend (tests/test_backend_extending.py): the reference lists the shipped ones only."""
    import tests.test_backend_extending  # noqa: F401 -- registers backend=scratch in this process
    text = reference.config_page()
    missing = []
    for f in dataclasses.fields(RunConfig):
        section = _section(text, f"## {f.name}")
        if f.name == "scheduler":
            per = {f"### scheduler={n}": get_spec(n).config_cls for n in registered()
                   if reference.shipped(get_spec(n).config_cls)}
        elif f.name == "backend":
            per = {f"### backend={n}": s.config_cls for n, s in backends().items() if reference.shipped(s.config_cls)}
        elif f.name == "hardware":
            from harness.core.profiles import HardwareConfig
            per = {"": HardwareConfig}
        else:
            d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if not dataclasses.is_dataclass(d):
                assert f"`{f.name}`" in section, f"## {f.name}: the scalar key is not named"
                continue
            per = {"": type(d)}
        for head, cls in per.items():
            rows = _rows(_section(text, head) if head else section)
            prefix = "<profile>." if f.name == "hardware" else ""
            missing += [f"{f.name} {head} {k}" for k in _keys(cls) if not rows.get(prefix + k)]
    assert not missing, f"config keys without a described entry in docs/reference/config.md: {missing}"


def test_a_key_its_docstring_does_not_name_has_no_description():
    """The checker itself: a planted dataclass with one key its docstring names (``a``, clause up to the ``;``)
    and one it does not (``b``)."""

    @dataclass
    class Planted:
        """A planted group. a: tokens per block (e.g. 16); nothing about the other."""

        a: int = 16
        b: int = 0

    assert reference.key_description(Planted, "a") == "a: tokens per block (e.g. 16)"
    assert reference.key_description(Planted, "b") == ""
    rows = _rows("\n".join(reference._key_table(Planted, "planted")))
    assert rows == {"a": "a: tokens per block (e.g. 16)", "b": ""}


def test_every_printed_metric_has_a_definition_unit_and_existing_source():
    """Each key of the printed table (``TABLE``): a catalogue entry with unit, definition and source; the source's
    code path imports (module, then attribute) and each docs page it names exists; a row in metrics.md."""
    text = reference.metrics_page()
    bad = []
    for key in TABLE:
        m = BY_KEY[key]
        if not (m.unit and m.definition and m.source):
            bad.append(f"{key}: unit/definition/source missing")
            continue
        code = m.source.split(";")[0].split(" ")[0]
        parts, obj = code.split("."), None
        for i in range(len(parts), 0, -1):      # the longest importable module, then attributes down the rest
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for a in parts[i:]:
                obj = getattr(obj, a, None)
            break
        if obj is None:
            bad.append(f"{key}: source {code} does not import")
        bad += [f"{key}: {doc} does not exist" for doc in re.findall(r"docs/[\w/]+\.md", m.source)
                if not (PROJECT_ROOT / doc).is_file()]
        if not re.search(rf"^\| `{re.escape(key)}` \|.*\| yes \|", text, re.M):
            bad.append(f"{key}: no printed row in metrics.md")
    assert not bad, bad


def test_docs_index_parts_notebook_and_links():
    """docs/README.md has the three parts (guide, reference, results) and links every page of docs/ (the notebook
    through its index, which lists every entry); every relative link in docs/, README.md and conf/README.md
    resolves (pages moved to the notebook leave no dangling link)."""
    docs = PROJECT_ROOT / "docs"
    index = (docs / "README.md").read_text()
    assert all(f"\n## {part}\n" in index for part in ("Guide", "Reference (generated: `python -m harness.tools.reference`)",
                                                     "Results"))
    linked = set(re.findall(r"\]\(([^)#\s]+)", index))
    pages = {p.relative_to(docs).as_posix() for p in docs.glob("*.md") if p.name != "README.md"}
    pages |= {f"{d}/{p.name}" for d in ("results", "reference") for p in (docs / d).glob("*.md")}
    assert not pages - linked, f"pages of docs/ the index does not link: {sorted(pages - linked)}"
    nb = (docs / "notebook" / "README.md").read_text()
    entries = {p.name for p in (docs / "notebook").glob("*.md") if p.name != "README.md"}
    assert entries and all(f"]({e})" in nb for e in entries)
    bad = []
    for p in [*docs.rglob("*.md"), PROJECT_ROOT / "README.md", PROJECT_ROOT / "conf" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", p.read_text()):
            if not target.startswith(("http://", "https://", "mailto:")) and not (p.parent / target).exists():
                bad.append(f"{p.relative_to(PROJECT_ROOT)} -> {target}")
    assert not bad, bad
